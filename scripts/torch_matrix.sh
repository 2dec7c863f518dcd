#!/usr/bin/env bash
# The torch matrix: for every supported torch release (torch_ddp_lite/torch_versions.py), or those
# named, builds torch-ddp-lite in a virtual environment of its own and runs the quick slice and a
# 2-rank DDP smoke run (scripts/torch_slice.sh), then writes the table in docs/compatibility.md
# between its markers, with the date and this command. Each version's venv (5-7 GB with its CUDA
# wheels) and build are kept under ~/.cache/ddplite/torch-envs; a full first run takes hours on
# 2 cores (3-9 minutes to install a torch, 10-30 to build, about 10 for the slice).
#   bash scripts/torch_matrix.sh                  # every supported version
#   bash scripts/torch_matrix.sh 2.8.0 2.15.0     # some; the others keep their last row
#   bash scripts/torch_matrix.sh --table          # only rewrite the table from the last results
#   DDPLITE_MATRIX_PRUNE=1 ...                    # delete each venv after its row (disk)
set -uo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
ENVS="${DDPLITE_TORCH_ENVS:-$HOME/.cache/ddplite/torch-envs}"
invoked="bash scripts/torch_matrix.sh${*:+ $*}"
versions=()
if [ "${1:-}" = --table ]; then shift
elif [ $# -gt 0 ]; then versions=("$@")
else read -r -a versions <<< "$(python3 "$REPO/torch_ddp_lite/torch_versions.py" all)"; fi
status=0
for version in ${versions[@]+"${versions[@]}"}; do
  bash "$REPO/scripts/torch_slice.sh" "$version" || status=1
  if [ "${DDPLITE_MATRIX_PRUNE:-0}" = 1 ]; then rm -rf "$ENVS/torch-$version/venv"; fi
done
python3 - "$REPO" "$ENVS" "$invoked" <<'PY'
import json, os, sys
repo, envs, command = sys.argv[1:]
sys.path.insert(0, os.path.join(repo, "torch_ddp_lite"))
import torch_versions as tv

rows = []
for version in tv.TESTED:
    path = os.path.join(envs, f"torch-{version}", "result.json")
    if not os.path.exists(path):
        rows.append(f"| {version} | not run | | | | | | |")
        continue
    r = json.load(open(path))
    refused = ", ".join(name for name in tv.FEATURES if not tv.has(name, version)) or "nothing"
    rows.append(f"| {version} | {r['build']} | {r['passed']} | {r['failed']} | {r['skipped']} | {r['ddp']} | "
                f"{refused} | {r['date']} ({r['seconds'] // 60} min) |")
table = "\n".join([
    "Each row: `bash scripts/torch_slice.sh <torch>` (the slice and the DDP smoke run, in that torch's own venv;",
    f"`bash scripts/torch_matrix.sh` runs it for every release; this table was written by `{command}`).",
    "'Without' lists what torch-ddp-lite refuses or does not use on that torch, because that torch lacks it",
    "(`torch_ddp_lite/torch_versions.py`, FEATURES).",
    "",
    "| torch | build | passed | failed | skipped | DDP smoke | without | measured |",
    "|---|---|---|---|---|---|---|---|",
    *rows,
])
doc = os.path.join(repo, "docs", "compatibility.md")
text = open(doc).read()
begin, end = "<!-- torch-matrix:begin -->", "<!-- torch-matrix:end -->"
head, rest = text.split(begin)
_, tail = rest.split(end)
open(doc, "w").write(f"{head}{begin}\n{table}\n{end}{tail}")
print(table)
PY
exit $status
