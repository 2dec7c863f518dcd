"""Builds a variant of the extension from the objects of the current build (setup.py keeps them in
build/temp.<platform>-<python>): only the sources that depend on a build option are recompiled.

``without_mpi(folder)`` is a real MPI-less build: the two sources that read DDPLITE_WITH_MPI
(no header does; checked here) are compiled without MPI's flags, and every object is linked
without -lmpi into ``folder/torch_ddp_lite/_C*.so`` beside a copy of the Python package.
"""

import glob
import os
import re
import shlex
import shutil
import subprocess
import sys
import sysconfig

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BUILD_TEMP = os.path.join(REPO, "build", f"temp.{sysconfig.get_platform()}-{sys.implementation.cache_tag}")
MPI_SOURCES = ("csrc/rendezvous/mpi.cpp", "csrc/cpu/mpi_collectives.cpp")


class StaleBuild(AssertionError):
    pass


def sources_reading(macro):
    """Every file under csrc/ that mentions `macro`."""
    found = []
    for path in glob.glob(os.path.join(REPO, "csrc", "**", "*.*pp"), recursive=True):
        with open(path) as handle:
            if macro in handle.read():
                found.append(os.path.relpath(path, REPO))
    return sorted(found)


def ninja_build():
    """(cflags, post_cflags, {source: object}) of the current build, checked to be up to date."""
    ninja_file = os.path.join(BUILD_TEMP, "build.ninja")
    if not os.path.isfile(ninja_file):
        raise StaleBuild(f"no {ninja_file}: build the extension first (bash scripts/setup.sh)")
    with open(ninja_file) as handle:
        text = handle.read()
    variables = dict(re.findall(r"^(cflags|post_cflags) = (.*)$", text, re.MULTILINE))
    objects = {os.path.relpath(source, REPO): obj
               for obj, source in re.findall(r"^build (\S+\.o): compile (\S+)$", text, re.MULTILINE)}
    for source, obj in objects.items():
        if not os.path.isfile(obj) or os.path.getmtime(obj) < os.path.getmtime(os.path.join(REPO, source)):
            raise StaleBuild(f"{obj} is older than {source}: rebuild (bash scripts/setup.sh)")
    return shlex.split(variables["cflags"]), shlex.split(variables["post_cflags"]), objects


def _without_mpi_flags(flags):
    return [flag for flag in flags
            if flag != "-DDDPLITE_WITH_MPI=1" and "SKIP_MPICXX" not in flag
            and not (flag.startswith("-I") and ("openmpi" in flag or "mpich" in flag))]


def _link_arguments(build_info):
    import torch

    torch_lib = os.path.join(os.path.dirname(torch.__file__), "lib")
    arguments = [f"-L{torch_lib}", "-lc10", "-ltorch", "-ltorch_cpu", "-ltorch_python"]
    nccl = build_info["nccl"]
    if nccl and nccl["compiled_in"]:
        nccl_lib = os.path.dirname(nccl["library"])
        cuda_lib = os.path.join(os.environ.get("CUDA_HOME", "/usr/local/cuda"), "lib64")
        arguments = [f"-L{nccl_lib}", f"-L{cuda_lib}", "-lc10_cuda", "-ltorch_cuda", "-lcudart"] + arguments + \
            ["-l:libnccl.so.2", f"-Wl,-rpath,{nccl_lib}"]
    return arguments


def without_mpi(folder, build_info):
    """Builds the MPI-less extension under `folder`; returns the folder to put on PYTHONPATH."""
    readers = sources_reading("DDPLITE_WITH_MPI")
    assert readers == sorted(MPI_SOURCES), f"DDPLITE_WITH_MPI is read by {readers}; update MPI_SOURCES"
    cflags, post_cflags, objects = ninja_build()
    assert set(MPI_SOURCES) <= set(objects), "the current build has no MPI sources"
    linked = [obj for source, obj in sorted(objects.items()) if source not in MPI_SOURCES]
    for source in MPI_SOURCES:
        obj = os.path.join(folder, os.path.basename(source).replace(".cpp", ".o"))
        command = ["c++", *_without_mpi_flags(cflags), "-c", os.path.join(REPO, source), "-o", obj,
                   *_without_mpi_flags(post_cflags)]
        subprocess.run(command, check=True, capture_output=True, text=True, timeout=600)
        linked.append(obj)
    package = os.path.join(folder, "site", "torch_ddp_lite")
    shutil.copytree(os.path.join(REPO, "torch_ddp_lite"), package,
                    ignore=shutil.ignore_patterns("*.so", "__pycache__"))
    shutil.copy(os.path.join(REPO, "_ddplite_autoload.py"), os.path.dirname(package))
    library = os.path.join(package, "_C" + sysconfig.get_config_var("EXT_SUFFIX"))
    subprocess.run(["c++", "-shared", *linked, "-o", library, *_link_arguments(build_info)], check=True,
                   capture_output=True, text=True, timeout=600)
    return os.path.dirname(package), library
