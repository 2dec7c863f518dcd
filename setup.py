"""Builds the ddplite C++ extension against the torch that is installed.

Install with ``pip install --no-build-isolation -e .`` (an isolated build would compile against a
different torch than the one that imports the extension, and the C++ ABI is not stable across
torch versions). ``scripts/setup.sh`` does this idempotently.
"""
import glob
import os
import shlex
import shutil
import subprocess

import torch
from setuptools import setup
from torch.utils.cpp_extension import BuildExtension, CppExtension

ROOT = os.path.dirname(os.path.abspath(__file__))
CSRC = os.path.join(ROOT, "csrc")


def sources():
    found = []
    for folder in ("common", "rendezvous", "cpu", "backend"):
        found += glob.glob(os.path.join("csrc", folder, "**", "*.cpp"), recursive=True)
    return sorted(found) + [os.path.join("csrc", "bindings.cpp")]


OPTIMISATION_FLAGS = ["-O3", "-Wall", "-Wno-unused-parameter"]


def mpi_flags():
    """Compile and link flags of the MPI that ``mpicxx`` wraps (Debian: libopenmpi-dev), or None.

    DDPLITE_WITH_MPI=0 builds without MPI even where it is installed; DDPLITE_MPICXX names another
    wrapper (an HPC site's MPI).
    """
    if os.environ.get("DDPLITE_WITH_MPI", "1") == "0":
        return None
    wrapper = shutil.which(os.environ.get("DDPLITE_MPICXX", "mpicxx"))
    if wrapper is None:
        return None
    try:
        compile_flags = subprocess.check_output([wrapper, "--showme:compile"], text=True).split()
        link_flags = subprocess.check_output([wrapper, "--showme:link"], text=True).split()
    except (OSError, subprocess.CalledProcessError):  # MPICH's wrapper has -compile_info instead
        try:
            compile_flags = shlex.split(subprocess.check_output([wrapper, "-compile_info"], text=True))[1:]
            link_flags = shlex.split(subprocess.check_output([wrapper, "-link_info"], text=True))[1:]
        except (OSError, subprocess.CalledProcessError):
            return None
    # The C++ bindings (-lmpi_cxx) are deprecated and unused: only the C API is called, and
    # <mpi.h> is told not to declare them.
    link_flags = [flag for flag in link_flags if flag != "-lmpi_cxx"]
    compile_flags += ["-DOMPI_SKIP_MPICXX=1", "-DMPICH_SKIP_MPICXX=1"]
    return compile_flags, link_flags


MPI = mpi_flags()
print(f"ddplite: building {'with MPI (' + ' '.join(MPI[1]) + ')' if MPI else 'without MPI (mpicxx not found)'}")

extension = CppExtension(
    name="torch_ddp_lite._C",
    sources=sources(),
    include_dirs=[CSRC],
    extra_link_args=MPI[1] if MPI else [],
    extra_compile_args={
        "cxx": OPTIMISATION_FLAGS + (MPI[0] + ["-DDDPLITE_WITH_MPI=1"] if MPI else []) + [
            f'-DDDPLITE_TORCH_VERSION="{torch.__version__}"',
            # Recorded in the binary for collect_env (torch adds its own flags around these).
            f'-DDDPLITE_BUILD_FLAGS="{" ".join(OPTIMISATION_FLAGS)}"',
        ]
    },
)

setup(
    ext_modules=[extension],
    cmdclass={"build_ext": BuildExtension.with_options(use_ninja=True)},
)
