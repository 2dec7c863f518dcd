"""The layers of csrc/ (docs/architecture.md, "The parts"), as one-way rules on #include:

    backend/  ->  cpu/cpu_path, cpu/collectives  ->  cpu/hierarchy/  ->  cpu/shm/  ->  cpu/transport/
                                                    cpu/p2p/       ->  cpu/shm/, cpu/transport/

* the transports know nothing of the algorithms or of anything above them (transport/fingerprint.cpp
  once included cpu/algorithms/selector to name algorithms in messages; the algorithm layer now
  registers the names with it instead: tests/test_mismatch.py, "algorithm: ring here, butterfly at
  the peer");
* shared memory (cpu/shm/) is one host only: it never includes the hierarchy across hosts nor the
  send/recv part;
* the hierarchy across hosts (cpu/hierarchy/) may use shm and the transports, never send/recv;
* send/recv (cpu/p2p/) may use shm and the transports, never the hierarchy or the collectives;
* the algorithms move bytes over a Transport: no shared memory, hierarchy, send/recv or collectives;
* the backend includes none of shm, hierarchy or the transports' implementations directly: it talks
  to the CPU path object, the collectives run on it, and the send/recv engine's API;
* the live status server (health/) includes nothing of backend/, cuda/ or the CPU path; of
  cpu/transport/ only auth and net_iface;
* the CUDA path includes nothing of cpu/, and of backend/ only work.hpp (StagedPath returns a
  DdpliteWork: the one edge against the flow); rendezvous/ includes none of cpu/, backend/, cuda/;
  common/ includes only common/.
"""

import os
import re
import sys

import pytest

CSRC = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "csrc")


def includes(path):
    with open(path) as source:
        return re.findall(r'^#include "([^"]+)"', source.read(), re.MULTILINE)


def offending_includes(folder, is_forbidden):
    """(file, include) for every #include of a file under csrc/<folder> that is_forbidden(include)."""
    root = os.path.join(CSRC, folder)
    found = []
    for directory, _, names in os.walk(root):
        for name in sorted(names):
            path = os.path.join(directory, name)
            found += [(os.path.relpath(path, CSRC), included) for included in includes(path) if is_forbidden(included)]
    return found


ABOVE_THE_TRANSPORTS = ("cpu/algorithms/", "cpu/shm/", "cpu/hierarchy/", "cpu/p2p/", "cpu/collectives", "cpu/cpu_path",
                        "backend/", "cuda/")
ABOVE_SHM = ("cpu/hierarchy/", "cpu/p2p/", "cpu/collectives", "cpu/cpu_path", "cpu/mpi_collectives", "backend/", "cuda/")
ABOVE_HIERARCHY = ("cpu/p2p/", "cpu/collectives", "cpu/cpu_path", "backend/", "cuda/")
ABOVE_P2P = ("cpu/hierarchy/", "cpu/algorithms/", "cpu/collectives", "cpu/cpu_path", "backend/", "cuda/")
ABOVE_ALGORITHMS = ("cpu/shm/", "cpu/hierarchy/", "cpu/p2p/", "cpu/collectives", "cpu/cpu_path", "cpu/mpi_collectives",
                    "backend/", "cuda/")
NOT_FOR_RENDEZVOUS = ("cpu/", "backend/", "cuda/")
# The live status server serves the backend's groups through callbacks: it knows nothing of them,
# of the CPU path or of CUDA; of cpu/ only the transports' authentication and address choice.
NOT_FOR_HEALTH = ("backend/", "cuda/", "cpu/algorithms/", "cpu/shm/", "cpu/hierarchy/", "cpu/p2p/", "cpu/collectives",
                  "cpu/cpu_path", "cpu/mpi_collectives", "cpu/reduce/", "cpu/transport/tcp")

RULES = {
    "cpu/transport": ABOVE_THE_TRANSPORTS,
    "cpu/shm": ABOVE_SHM,
    "cpu/hierarchy": ABOVE_HIERARCHY,
    "cpu/p2p": ABOVE_P2P,
    "cpu/algorithms": ABOVE_ALGORITHMS,
    "rendezvous": NOT_FOR_RENDEZVOUS,
    "health": NOT_FOR_HEALTH,
}


@pytest.mark.parametrize("folder", sorted(RULES))
def test_each_part_includes_nothing_above_it(folder):
    assert offending_includes(folder, lambda included: included.startswith(RULES[folder])) == []


# What the backend may include from cpu/: the CPU path object (which owns the transports, the
# segments or the hierarchy, MPI's collectives and the send/recv engine), the collectives it runs
# on it, the send/recv engine's API (not its links or channels), the algorithm selector (pins), the
# reduction kernels, the transport interface for its error and deadline types, and the mark of a
# thread that runs an op its caller blocks on (how long that thread's waits spin). Not a
# transport, a segment or a hierarchy itself.
BACKEND_MAY_INCLUDE = ("cpu/cpu_path.hpp", "cpu/collectives.hpp", "cpu/p2p/p2p_engine.hpp", "cpu/algorithms/",
                       "cpu/reduce/", "cpu/transport/transport.hpp", "cpu/transport/wait_policy.hpp")


def test_the_backend_talks_to_the_cpu_path_only():
    assert offending_includes("backend", lambda included: included.startswith("cpu/")
                              and not included.startswith(BACKEND_MAY_INCLUDE)) == []


def test_the_cuda_path_takes_only_the_work_from_the_backend():
    assert offending_includes("cuda", lambda included: included.startswith("cpu/")
                              or (included.startswith("backend/") and included != "backend/work.hpp")) == []


def test_common_includes_only_common():
    assert offending_includes("common", lambda included: not included.startswith("common/")) == []


def test_the_rules_see_every_part():
    # A part renamed or emptied would make its rule vacuous: each folder holds sources with includes.
    for folder in [*RULES, "backend", "cuda", "common"]:
        root = os.path.join(CSRC, folder)
        sources = [name for name in os.listdir(root) if name.endswith((".cpp", ".hpp"))]
        assert sources and any(includes(os.path.join(root, name)) for name in sources), folder
    # and each forbidden prefix names a part that exists: a folder, or the stem of files
    for prefixes in RULES.values():
        for prefix in prefixes:
            if prefix.endswith("/"):
                assert os.path.isdir(os.path.join(CSRC, prefix)), prefix
            else:
                parent, _, stem = prefix.rpartition("/")
                assert any(name.startswith(stem + ".") for name in os.listdir(os.path.join(CSRC, parent))), prefix


@pytest.mark.parametrize("folder, upward", [("cpu/shm", "cpu/hierarchy/host_hierarchy.hpp"),
                                            ("cpu/shm", "cpu/p2p/channels.hpp"),
                                            ("cpu/hierarchy", "cpu/p2p/p2p_engine.hpp"),
                                            ("cpu/p2p", "cpu/hierarchy/host_hierarchy.hpp"),
                                            ("cpu/transport", "cpu/shm/segment.hpp"),
                                            ("cpu/algorithms", "cpu/shm/shm_group.hpp"),
                                            ("rendezvous", "cpu/transport/transport.hpp")])
def test_the_rules_catch_an_include_that_goes_up(tmp_path, monkeypatch, folder, upward):
    # The checker itself: a file of `folder` that includes `upward` is reported by its rule.
    fake = tmp_path.joinpath(*folder.split("/"))
    fake.mkdir(parents=True)
    (fake / "part.cpp").write_text(f'#include "common/errors.hpp"\n#include "{upward}"\n')
    monkeypatch.setattr(sys.modules[__name__], "CSRC", str(tmp_path))
    assert offending_includes(folder, lambda included: included.startswith(RULES[folder])) == [
        (os.path.join(*folder.split("/"), "part.cpp"), upward)]


# The build force-includes torch's headers (csrc/common/precompiled.hpp, setup.py) into every file,
# which would hide a file that uses torch's names without including torch: such a file breaks
# wherever the precompiled header is not used (DDPLITE_WITH_PCH=0, a torch whose build step setup.py
# cannot wrap). So every translation unit (a .cpp and the csrc/ headers it reaches) that names
# at::, c10::, c10d:: or torch:: must reach a header of torch's (or pybind11's) itself.
TORCH_NAME = re.compile(r"\b(at|c10|c10d|torch)::")
TORCH_HEADER = re.compile(r"^#include <(torch|ATen|c10|pybind11)/", re.MULTILINE)


def translation_unit(path):
    """`path` and every csrc/ file it includes, directly or not (the compile check's walk)."""
    return _compile_check().translation_unit(path, CSRC)


def sources_using_torch_without_including_it():
    found = []
    for base, _, names in os.walk(CSRC):
        for name in names:
            if not name.endswith(".cpp"):
                continue
            uses = reaches = False
            for member in translation_unit(os.path.join(base, name)):
                with open(member) as source:
                    text = source.read()
                uses = uses or bool(TORCH_NAME.search(re.sub(r"//[^\n]*", "", text)))  # not in comments
                reaches = reaches or bool(TORCH_HEADER.search(text))
            if uses and not reaches:
                found.append(os.path.relpath(os.path.join(base, name), CSRC))
    return sorted(found)


def test_every_source_that_uses_torch_includes_it_without_the_precompiled_header():
    assert sources_using_torch_without_including_it() == []


def test_the_torch_include_rule_catches_a_source_that_relies_on_the_precompiled_header(tmp_path, monkeypatch):
    (tmp_path / "common").mkdir()
    (tmp_path / "common" / "plain.hpp").write_text("#include <vector>\nat::Tensor g();\n")
    (tmp_path / "common" / "tensor.hpp").write_text("#include <ATen/core/Tensor.h>\n")
    (tmp_path / "uses.cpp").write_text('#include "common/plain.hpp"\n')  # a header it reaches names at::
    (tmp_path / "through.cpp").write_text('#include "common/tensor.hpp"\n#include "common/plain.hpp"\n')
    (tmp_path / "comment_only.cpp").write_text('#include <vector>\n// c10::intrusive_ptr\n')
    monkeypatch.setattr(sys.modules[__name__], "CSRC", str(tmp_path))
    assert sources_using_torch_without_including_it() == ["uses.cpp"]


# CI's compile check against the releases between the oldest and the newest covers only the files a
# version gate reaches (scripts/torch_compile_check.py --gated): its walk of the includes must see
# what the compiler sees.
def _compile_check():
    sys.path.insert(0, os.path.join(os.path.dirname(CSRC), "scripts"))
    try:
        import torch_compile_check
    finally:
        sys.path.pop(0)
    return torch_compile_check


def _compiled_dependencies():
    """{source: set of csrc/ files it read} from the in-place build's own dependency records
    (`ninja -t deps` in build/temp.*, the folder setup.py builds in); only the records ninja still
    calls VALID (a file edited since its last compile is left out). None without such a build."""
    import shutil
    import subprocess
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    try:
        from build_variants import BUILD_TEMP
    finally:
        sys.path.pop(0)
    if not os.path.isdir(BUILD_TEMP):
        return None
    assert shutil.which("ninja"), "the build folder is there but ninja is not on PATH"
    proc = subprocess.run(["ninja", "-C", BUILD_TEMP, "-t", "deps"], capture_output=True, text=True)
    assert proc.returncode == 0 and proc.stdout.strip(), f"no dependency records in {BUILD_TEMP}: {proc.stderr}"
    found, current = {}, None
    objects = os.path.join(BUILD_TEMP, "csrc")
    for line in proc.stdout.splitlines():
        if line and not line[0].isspace():
            target = line.split(":")[0]
            current = None
            if target.endswith(".o") and "(VALID)" in line and target.startswith(objects + os.sep):
                source = os.path.join(CSRC, os.path.relpath(target, objects))[:-2] + ".cpp"
                if os.path.exists(source):
                    current = found.setdefault(source, set())
        elif current is not None and line.strip().startswith(CSRC + os.sep):
            current.add(os.path.normpath(line.strip()))
    return found


def test_the_compile_checks_slice_is_every_file_whose_compile_reads_a_version_gate():
    check = _compile_check()
    gated = set(check.gated_sources())
    assert {os.path.join(CSRC, f) for f in ("bindings.cpp", "backend/backend.cpp")} <= gated
    assert 0 < len(gated) < len(check.sources())
    compiled = _compiled_dependencies()
    if compiled is None:
        pytest.skip("no in-place build (build/temp.*) to compare with")
    assert compiled, "the build's dependency records name no csrc/ source of this checkout"
    with_gate = {path for deps in compiled.values() for path in deps
                 if check.VERSION_GATE.search(open(path).read())}
    assert with_gate, "no file the build read holds a version gate"
    from_the_compiler = {source for source, deps in compiled.items() if (deps | {source}) & with_gate}
    # a build without NCCL has no cuda/ objects: compare the files it compiled
    assert gated & set(compiled) == from_the_compiler


# A version check anywhere but compat*.hpp would escape the gate walk above: torch's version
# macros, its version header, __has_include of a header some release lacks, C10's or CUDA's version.
VERSION_TEST = re.compile(r"\bTORCH_VERSION_[A-Z]+\b|<torch/version\.h>|__has_include|\bC10_[A-Z_]*VERSION\b"
                          r"|\bCUDA_VERSION\b|\bCUDART_VERSION\b")


def version_tests_outside_compat(root=None):
    found = []
    for base, _, files in os.walk(root or CSRC):
        for name in files:
            path = os.path.join(base, name)
            relative = os.path.relpath(path, root or CSRC)
            if relative in ("common/compat.hpp", "common/compat_cuda.hpp"):
                continue
            if VERSION_TEST.search(open(path, errors="replace").read()):
                found.append(relative)
    return sorted(found)


def test_only_compat_asks_which_torch_it_is_built_against():
    assert version_tests_outside_compat() == []


def test_the_version_test_rule_catches_a_check_outside_compat(tmp_path):
    (tmp_path / "common").mkdir()
    (tmp_path / "common" / "compat.hpp").write_text("#include <torch/version.h>\n#if TORCH_VERSION_MINOR >= 9\n#endif\n")
    (tmp_path / "minor.cpp").write_text("#if TORCH_VERSION_MINOR > 12\n#endif\n")
    (tmp_path / "has.cpp").write_text("#if __has_include(<c10/core/Foo.h>)\n#endif\n")
    (tmp_path / "fine.cpp").write_text("#include <torch/extension.h>\n")
    assert version_tests_outside_compat(str(tmp_path)) == ["has.cpp", "minor.cpp"]


def test_the_gate_walk_follows_quoted_includes_through_headers(tmp_path, monkeypatch):
    check = _compile_check()
    csrc = tmp_path / "csrc"
    (csrc / "common").mkdir(parents=True)
    (csrc / "part").mkdir()
    (csrc / "common" / "compat.hpp").write_text("#define DDPLITE_TORCH_HAS_X 1\n")
    (csrc / "part" / "api.hpp").write_text('#include "common/compat.hpp"\n')
    (csrc / "part" / "near.hpp").write_text("#if DDPLITE_OVERRIDE_SINCE_2_9\n#endif\n")
    (csrc / "part" / "uses.cpp").write_text('#include "part/api.hpp"\n')              # two hops
    (csrc / "part" / "sibling.cpp").write_text('#include "near.hpp"\n')               # the folder's own
    (csrc / "part" / "plain.cpp").write_text("#include <vector>\nint plain();\n")
    (csrc / "part" / "missing.cpp").write_text('#include "part/nowhere.hpp"\n')
    monkeypatch.setattr(check, "ROOT", str(tmp_path))
    assert [os.path.relpath(s, csrc) for s in check.gated_sources()] == ["part/sibling.cpp", "part/uses.cpp"]
