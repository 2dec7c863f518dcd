#!/usr/bin/env python3
"""Compiles csrc/ syntax-only against the headers of every supported torch, without installing it.

For each torch release (default: every one in torch_ddp_lite/torch_versions.py), it downloads the
wheel from PyPI once (`pip download --no-deps`), keeps only its headers and cpp_extension.py (about
60 MB) in a cache, and runs `g++ -fsyntax-only` over every csrc/ file with the flags the real build
uses: the C++ standard that version's cpp_extension passes (C++17 up to 2.11, C++20 from 2.12),
NCCL and MPI switched on, CUDA headers from CUDA_HOME. It catches what a full build against that
torch would reject (a missing member, an `override` of a function that version lacks, a header
that moved) in about 3 minutes a version (all 90 files, 2 cores) instead of a venv and a full build.
--gated checks only the files a version gate reaches (CI's slice, about 1 minute a version: making
the precompiled header and bindings.cpp are most of it).

    python3 scripts/torch_compile_check.py                    # every supported version, every file
    python3 scripts/torch_compile_check.py --strict --gated --versions 2.9.1 2.10.0   # .ci/run's step 2
    python3 scripts/torch_compile_check.py --versions 2.8.0 2.15.0 --jobs 2
    DDPLITE_TORCH_HEADERS=/path/to/cache python3 scripts/torch_compile_check.py

Exit status 0 when every version compiles. Output: one line per version, then the first errors.
"""
import argparse
import concurrent.futures
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import time
import zipfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "torch_ddp_lite"))
import torch_versions  # noqa: E402  (a plain module: importing it does not import torch)

CACHE = os.environ.get("DDPLITE_TORCH_HEADERS", os.path.expanduser("~/.cache/ddplite/torch-headers"))
CUDA_HOME = os.environ.get("CUDA_HOME", "/usr/local/cuda")


def headers_for(version):
    """Folder holding torch/include and torch/utils/cpp_extension.py of ``version``, fetched once."""
    folder = os.path.join(CACHE, version)
    marker = os.path.join(folder, ".complete")
    if os.path.exists(marker):
        return folder
    os.makedirs(CACHE, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=CACHE) as download:
        subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps",
                        "--only-binary", ":all:", "--python-version", "3.11",
                        "--platform", "manylinux_2_28_x86_64", f"torch=={version}", "-d", download],
                       check=True)
        wheel = [f for f in os.listdir(download) if f.endswith(".whl")][0]
        staging = folder + ".partial"
        shutil.rmtree(staging, ignore_errors=True)
        with zipfile.ZipFile(os.path.join(download, wheel)) as archive:
            wanted = [n for n in archive.namelist()
                      if n.startswith("torch/include/") or n in ("torch/utils/cpp_extension.py", "torch/version.py")]
            archive.extractall(staging, wanted)
    shutil.rmtree(folder, ignore_errors=True)
    os.rename(staging, folder)
    open(marker, "w").close()
    return folder


def cxx_standard(folder):
    """The -std= flag this torch's cpp_extension gives extensions (C++20 from torch 2.12)."""
    with open(os.path.join(folder, "torch", "utils", "cpp_extension.py")) as f:
        found = re.search(r"cpp_flag_prefix \+ '(c\+\+\d+)'", f.read())
    return f"-std={found.group(1) if found else 'c++17'}"


# Parsed once per version into a precompiled header and force-included in every file, as the real
# build does (setup.py): the torch headers are most of each file's compile time (about 5 s a file
# without it, 1-2 s with it).
PRECOMPILED_SOURCE = os.path.join(ROOT, "csrc", "common", "precompiled.hpp")


def precompiled_header(version, flags):
    """Copies csrc/common/precompiled.hpp to <cache>/<version>/pch/ and makes its .gch there;
    returns the copy's path."""
    folder = os.path.join(CACHE, version, "pch")
    os.makedirs(folder, exist_ok=True)
    header = os.path.join(folder, "precompiled.hpp")
    shutil.copyfile(PRECOMPILED_SOURCE, header)
    subprocess.run(["g++", "-x", "c++-header", *flags, header, "-o", header + ".gch"], check=True)
    return header


def mpi_flags():
    wrapper = shutil.which("mpicxx")
    if wrapper is None:
        return []
    return subprocess.check_output([wrapper, "--showme:compile"], text=True).split() + [
        "-DOMPI_SKIP_MPICXX=1", "-DDDPLITE_WITH_MPI=1"]


def sources():
    found = []
    for base, _, files in os.walk(os.path.join(ROOT, "csrc")):
        found += [os.path.join(base, f) for f in files if f.endswith(".cpp")]
    return sorted(found)


# What differs between torch releases reaches csrc/ only through the version gates of
# csrc/common/compat.hpp and compat_cuda.hpp (DDPLITE_TORCH_AT_LEAST, DDPLITE_TORCH_HAS_*,
# DDPLITE_OVERRIDE_SINCE_*): a file that no gate reaches is the same code against every release,
# and the oldest and the newest compile it in full (.ci/run's steps 1 and 3).
VERSION_GATE = re.compile(r"\bDDPLITE_(TORCH_[A-Z0-9_]+|OVERRIDE_SINCE_[0-9_]+)\b")
QUOTED_INCLUDE = re.compile(r'^\s*#\s*include\s*"([^"]+)"', re.M)


def _includes(path, csrc):
    """The csrc/ files ``path`` includes with quotes (as the compiler resolves them: the including
    file's folder first, then -I csrc)."""
    with open(path) as f:
        names = QUOTED_INCLUDE.findall(f.read())
    found = []
    for name in names:
        for candidate in (os.path.join(os.path.dirname(path), name), os.path.join(csrc, name)):
            if os.path.isfile(candidate):
                found.append(os.path.normpath(candidate))
                break
    return found


def translation_unit(source, csrc=None):
    """``source`` and every csrc/ file it includes, directly or not (tests/test_layering.py's rules
    walk the same way)."""
    csrc = csrc or os.path.join(ROOT, "csrc")
    found, todo = set(), [os.path.normpath(source)]
    while todo:
        path = todo.pop()
        if path not in found:
            found.add(path)
            todo += _includes(path, csrc)
    return found


def reaches_a_version_gate(source):
    """True when ``source`` or a csrc/ header it includes, directly or not, uses a version gate."""
    for path in translation_unit(source):
        with open(path) as f:
            if VERSION_GATE.search(f.read()):
                return True
    return False


def gated_sources():
    return [s for s in sources() if reaches_a_version_gate(s)]


def compile_one(args):
    source, flags = args
    proc = subprocess.run(["g++", "-fsyntax-only", *flags, source], capture_output=True, text=True)
    return source, proc.returncode, proc.stderr


def check(version, jobs, files):
    folder = headers_for(version)
    include = os.path.join(folder, "torch", "include")
    std = cxx_standard(folder)
    flags = [std, "-fPIC", "-Wall", "-Wno-unused-parameter", "-Wno-interference-size",
             "-DDDPLITE_WITH_NCCL=1", f'-DDDPLITE_TORCH_VERSION="{version}"', '-DDDPLITE_BUILD_FLAGS=""',
             '-DDDPLITE_NCCL_INCLUDE=""', '-DDDPLITE_NCCL_LIBRARY=""',
             "-DTORCH_API_INCLUDE_EXTENSION_H", "-DTORCH_EXTENSION_NAME=_C", "-D_GLIBCXX_USE_CXX11_ABI=1",
             f"-I{os.path.join(ROOT, 'csrc')}", "-isystem", include,
             "-isystem", os.path.join(include, "torch", "csrc", "api", "include"),
             f"-I{os.path.join(CUDA_HOME, 'include')}", f"-I{sysconfig.get_paths()['include']}"] + mpi_flags()
    started = time.monotonic()
    header = precompiled_header(version, flags)
    flags = flags + ["-Winvalid-pch", "-include", header]
    failures, warnings = [], []
    try:
        with concurrent.futures.ThreadPoolExecutor(jobs) as pool:
            # the largest files first, so that the last one to finish is a short one
            largest_first = sorted(files, key=os.path.getsize, reverse=True)
            for source, rc, stderr in pool.map(compile_one, [(s, flags) for s in largest_first]):
                if rc != 0:
                    failures.append((source, stderr))
                elif any("warning:" in line and line.startswith(os.path.join(ROOT, "csrc"))
                         for line in stderr.splitlines()):
                    warnings.append((source, stderr))
    finally:
        shutil.rmtree(os.path.dirname(header), ignore_errors=True)  # the .gch is about 350 MB
    return std, failures, warnings, time.monotonic() - started


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--versions", nargs="*", default=list(torch_versions.TESTED))
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 2)
    parser.add_argument("--show", type=int, default=12, help="error lines shown per failing file")
    parser.add_argument("--strict", action="store_true", help="a warning in csrc/ fails the version too")
    parser.add_argument("--gated", action="store_true",
                        help="only the files a version gate of compat.hpp reaches (CI's quick slice; "
                             "the others are the same code for every release)")
    args = parser.parse_args()
    files = gated_sources() if args.gated else sources()
    which = "files a version gate reaches" if args.gated else "files"
    bad = 0
    for version in args.versions:
        std, failures, warnings, seconds = check(version, args.jobs, files)
        print(f"torch {version}: {std}, {len(files) - len(failures)}/{len(files)} {which} compile, "
              f"{len(warnings)} with warnings ({seconds:.0f} s)", flush=True)
        for source, stderr in failures + warnings:
            lines = [l for l in stderr.splitlines() if "error" in l or "warning:" in l][: args.show]
            print(f"  {os.path.relpath(source, ROOT)}:\n    " + "\n    ".join(lines))
        bad += bool(failures) or (args.strict and bool(warnings))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
