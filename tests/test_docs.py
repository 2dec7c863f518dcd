"""The docs check: every relative link and anchor in README.md, CONTRIBUTING.md and docs/ (not the
raw results in docs/data/) resolves
(a file that exists; a heading of that file, as GitHub makes its anchor), every command in a fenced
block that names a script of this repository names one that exists, and no page speaks of our
tracker's issue numbers, which its readers do not have."""

import os
import re

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FENCE = re.compile(r"^\s*(```|~~~)")
LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
INLINE_CODE = re.compile(r"(`+)(?:(?!\1).)+?\1")
HTML_ANCHOR = re.compile(r"<a\s+(?:name|id)=\"([^\"]+)\"")
SCRIPT_PATH = re.compile(r"(?<![\w./-])((?:scripts|examples|tests|torch_ddp_lite|\.ci)/[\w./-]*\w)")
PYTHON_MODULE = re.compile(r"python3? -m (torch_ddp_lite(?:\.\w+)*)")
TRACKER_WORDS = re.compile(r"(?<![-\w])(?:issues?|stops?) ?#?\d+\b", re.IGNORECASE)  # not a flag: --stops 4


def pages():
    found = [os.path.join(REPO, name) for name in ("README.md", "CONTRIBUTING.md") if os.path.exists(os.path.join(REPO, name))]
    for directory, folders, names in os.walk(os.path.join(REPO, "docs")):
        folders[:] = [folder for folder in folders if folder != "data"]  # raw results, not pages
        found += [os.path.join(directory, name) for name in sorted(names) if name.endswith(".md")]
    return sorted(found)


def split_fences(text):
    """(prose lines, fenced blocks) of a markdown page; each line keeps its number."""
    prose, blocks, block, fence = [], [], None, None
    for number, line in enumerate(text.splitlines(), 1):
        match = FENCE.match(line)
        if block is None and match:
            block, fence = [], match.group(1)
        elif block is not None and line.strip().startswith(fence):
            blocks.append(block)
            block = None
        elif block is not None:
            block.append((number, line))
        else:
            prose.append((number, line))
    return prose, blocks


def slug(heading):
    """GitHub's anchor for a heading: lower case, markup and punctuation but '-' and '_' dropped,
    spaces to '-'."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading.strip())  # a link keeps its text
    text = text.replace("`", "").lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors_of(path, cache={}):
    if path not in cache:
        with open(path) as page:
            prose, _ = split_fences(page.read())
        seen, anchors = {}, set()
        for _, line in prose:
            match = re.match(r"^(#{1,6})\s+(.*?)\s*#*\s*$", line)
            if match:
                base = slug(match.group(2))
                count = seen.get(base, 0)
                seen[base] = count + 1
                anchors.add(base if count == 0 else f"{base}-{count}")
            anchors.update(HTML_ANCHOR.findall(line))
        cache[path] = anchors
    return cache[path]


def paragraphs(prose):
    """(first line's number, the paragraph's lines joined): a link or a code span may wrap."""
    joined, start, lines = [], None, []
    for number, line in prose + [(None, "")]:
        if line.strip():
            start = number if not lines else start
            lines.append(line.strip())
        elif lines:
            joined.append((start, " ".join(lines)))
            lines = []
    return joined


def broken_links(path):
    with open(path) as page:
        prose, _ = split_fences(page.read())
    broken = []
    for number, line in paragraphs(prose):
        for target in LINK.findall(INLINE_CODE.sub("", line)):
            if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # https:, mailto:, ...
                continue
            file_part, _, anchor = target.partition("#")
            resolved = os.path.normpath(os.path.join(os.path.dirname(path), file_part)) if file_part else path
            where = f"{os.path.relpath(path, REPO)}:{number}: {target}"
            if not os.path.exists(resolved):
                broken.append(f"{where} (no such file)")
            elif anchor and resolved.endswith(".md") and anchor not in anchors_of(resolved):
                broken.append(f"{where} (no heading with that anchor in {os.path.relpath(resolved, REPO)})")
    return broken


def missing_scripts(path):
    with open(path) as page:
        _, blocks = split_fences(page.read())
    missing = []
    for block in blocks:
        for number, line in block:
            if line.lstrip().startswith(("[", "{", "|")) or "Error" in line:  # program output, not commands
                continue
            for named in SCRIPT_PATH.findall(line):
                if "*" in named or named.endswith("/"):
                    continue
                if not os.path.exists(os.path.join(REPO, named)):
                    missing.append(f"{os.path.relpath(path, REPO)}:{number}: {named}")
            for module in PYTHON_MODULE.findall(line):
                base = os.path.join(REPO, *module.split("."))
                if not (os.path.exists(base + ".py") or os.path.isdir(base)):
                    missing.append(f"{os.path.relpath(path, REPO)}:{number}: python -m {module}")
    return missing


PAGES = pages()


def test_there_are_pages_to_check():
    names = {os.path.relpath(page, REPO) for page in PAGES}
    assert {"README.md", "docs/architecture.md", "docs/launchers.md"} <= names, names


@pytest.mark.parametrize("page", PAGES, ids=lambda page: os.path.relpath(page, REPO))
def test_every_relative_link_and_anchor_resolves(page):
    assert broken_links(page) == []


@pytest.mark.parametrize("page", PAGES, ids=lambda page: os.path.relpath(page, REPO))
def test_every_command_names_a_script_that_exists(page):
    assert missing_scripts(page) == []


@pytest.mark.parametrize("page", PAGES, ids=lambda page: os.path.relpath(page, REPO))
def test_no_page_speaks_of_tracker_numbers(page):
    with open(page) as text:
        found = [f"{number}: {line.strip()}" for number, line in enumerate(text.read().splitlines(), 1)
                 if TRACKER_WORDS.search(INLINE_CODE.sub("", line))]
    assert found == []


def test_the_checks_catch_what_they_are_for(tmp_path):
    # The checker itself, on a page with one of each fault and one of each good case.
    (tmp_path / "other.md").write_text("# Other page\n\n## A `code` heading: with punctuation\n")
    page = tmp_path / "page.md"
    page.write_text("\n".join([
        "# Title", "", "## Same", "## Same",
        "[ok](other.md#a-code-heading-with-punctuation) [ok](#same-1) [ok](https://example.com/x#y) [a link",
        "that wraps](other.md#other-page)", "",
        "[bad file](missing.md) [bad anchor](other.md#nope) [bad local](#same-2) [wrapped and",
        "bad](gone.md)",
        "`[not a link](nowhere.md)`", "",
        "```bash", "python scripts/setup.sh && python scripts/no_such_script.py", "python -m torch_ddp_lite.nope",
        "[also not a link](inside-a-fence.md)", "```",
    ]))
    assert [entry.split(": ", 1)[1] for entry in broken_links(str(page))] == [
        "missing.md (no such file)",
        f"other.md#nope (no heading with that anchor in {os.path.relpath(str(tmp_path / 'other.md'), REPO)})",
        f"#same-2 (no heading with that anchor in {os.path.relpath(str(page), REPO)})",
        "gone.md (no such file)",
    ]
    assert [entry.split(": ", 1)[1] for entry in missing_scripts(str(page))] == [
        "scripts/no_such_script.py", "python -m torch_ddp_lite.nope"]
    assert TRACKER_WORDS.search("the baseline of issue 27's work") and TRACKER_WORDS.search("(stop 12)")
    assert not TRACKER_WORDS.search("issues with IPv6") and not TRACKER_WORDS.search("scripts/chaos.py --stops 4")
