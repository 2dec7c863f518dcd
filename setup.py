"""Builds the ddplite C++ extension against the torch that is installed.

Install with ``pip install --no-build-isolation -e .`` (an isolated build would compile against a
different torch than the one that imports the extension, and the C++ ABI is not stable across
torch versions). ``scripts/setup.sh`` does this idempotently.
"""
import glob
import os

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

extension = CppExtension(
    name="torch_ddp_lite._C",
    sources=sources(),
    include_dirs=[CSRC],
    extra_compile_args={
        "cxx": OPTIMISATION_FLAGS + [
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
