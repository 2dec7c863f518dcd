"""Builds the ddplite C++ extension against the torch that is installed.

Install with ``pip install --no-build-isolation -e .`` (an isolated build would compile against a
different torch than the one that imports the extension, and the C++ ABI is not stable across
torch versions). ``scripts/setup.sh`` does this idempotently. A wheel:
``python -m build --wheel --no-isolation`` makes ``dist/torch_ddp_lite-0.1.0+torch2.15-...whl``,
named for the torch it was built against and requiring that release (docs/compatibility.md).

NCCL (CUDA tensors, docs/gpu.md) is compiled in only when all three are found: a CUDA build of
torch, ``nccl.h`` and ``libnccl.so.2``. Otherwise the extension is CPU-only and says so in
``build_info()``. The extension stays a plain CppExtension either way: the CUDA path calls the
host APIs of NCCL and the CUDA runtime only, so g++ compiles it and nvcc is not needed.
"""
import contextlib
import fcntl
import glob
import hashlib
import os
import re
import shlex
import shutil
import subprocess
import sys
import sysconfig

import torch
from setuptools import setup
from torch.utils import cpp_extension
from torch.utils.cpp_extension import BuildExtension, CppExtension, include_paths

ROOT = os.path.dirname(os.path.abspath(__file__))
CSRC = os.path.join(ROOT, "csrc")


def package_version():
    """torch_ddp_lite.__version__ with the torch release built against as local label: 0.1.0+torch2.15."""
    with open(os.path.join(ROOT, "torch_ddp_lite", "__init__.py")) as f:
        base = re.search(r'^__version__ = "([^"]+)"', f.read(), re.M).group(1)
    major, minor = torch.__version__.split(".")[:2]
    return f"{base}+torch{major}.{minor}", f"torch=={major}.{minor}.*"


VERSION, TORCH_REQUIREMENT = package_version()


def nccl_wheel_folder():
    """site-packages/nvidia/nccl of the nvidia-nccl-cu* wheel torch depends on, or None."""
    try:
        import nvidia.nccl
    except ImportError:
        return None
    folders = list(getattr(nvidia.nccl, "__path__", []))
    return folders[0] if folders else None


def find_nccl():
    """(include folder, library folder) of the NCCL to build against, or None, with the reason.

    Order: DDPLITE_NCCL_HOME (include/ and lib/ under it), then the nvidia-nccl wheel (the very
    libnccl.so.2 torch loads), then the header in CUDA_HOME with the wheel's or CUDA's library.
    DDPLITE_WITH_NCCL=0 builds without NCCL even where it is found.
    """
    if os.environ.get("DDPLITE_WITH_NCCL", "1") == "0":
        return None, "DDPLITE_WITH_NCCL=0"
    if not torch.version.cuda:
        return None, "torch is a CPU-only build"
    wheel = nccl_wheel_folder()
    cuda_home = os.environ.get("CUDA_HOME", "/usr/local/cuda")
    candidates = []
    if os.environ.get("DDPLITE_NCCL_HOME"):
        home = os.environ["DDPLITE_NCCL_HOME"]
        candidates.append((os.path.join(home, "include"), os.path.join(home, "lib")))
    if wheel:
        candidates.append((os.path.join(wheel, "include"), os.path.join(wheel, "lib")))
        candidates.append((os.path.join(cuda_home, "include"), os.path.join(wheel, "lib")))
    candidates.append((os.path.join(cuda_home, "include"), os.path.join(cuda_home, "lib64")))
    for include, lib in candidates:
        if os.path.isfile(os.path.join(include, "nccl.h")) and os.path.isfile(os.path.join(lib, "libnccl.so.2")):
            return (include, lib), ""
    return None, "no nccl.h with a libnccl.so.2 next to it (set DDPLITE_NCCL_HOME)"


def sources(with_nccl):
    found = []
    # csrc/cuda/rules holds the NCCL path's decisions without CUDA types: every build has them.
    folders = ["common", "rendezvous", "cpu", "health", "backend", "cuda/rules"] + (["cuda"] if with_nccl else [])
    for folder in folders:
        found += glob.glob(os.path.join("csrc", folder, "**", "*.cpp"), recursive=True)
    # The module: the user's surface (bindings.cpp) and what only the tests bind (test_hooks.cpp).
    return sorted(set(found)) + [os.path.join("csrc", "bindings.cpp"), os.path.join("csrc", "test_hooks.cpp")]


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


def libstdcxx_link_args():
    """The libstdc++ the extension links against, where the compiler would otherwise copy one in.

    g++ links ``-lstdc++`` as ``libstdc++.so`` when its development link exists and silently as
    ``libstdc++.a`` when only the archive does (an image that dropped the link: seen on the
    Ubuntu 24.04 GPU machine, g++ 13). The copied library's locale tables are not the ones of the
    libstdc++.so.6 torch loads, and the first ``ostream << long`` crashed the process (env
    knobs' help text, docs/gpu.md "What has run"). There the libstdc++.so.6 this very process
    loaded with torch is named on the link line, so ``-lstdc++`` finds nothing left to copy.
    """
    compiler = shlex.split(os.environ.get("CXX", "c++"))  # CXX may carry a launcher: "ccache g++"
    try:
        found = subprocess.run(compiler + ["-print-file-name=libstdc++.so"], capture_output=True, text=True,
                               check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return []  # the build's own compile fails louder; check_libstdcxx_not_copied still guards
    if os.path.isabs(found) and os.path.exists(found):  # the usual case: a working development link
        return []
    loaded = []  # in the order the loader mapped them (the first is the one symbols bind to)
    try:
        with open("/proc/self/maps") as maps:
            for line in maps:
                fields = line.rstrip("\n").split(None, 5)
                path = fields[5] if len(fields) == 6 else ""
                if "/libstdc++.so" in path and not path.endswith("(deleted)") and path not in loaded:
                    loaded.append(path)
    except OSError:
        return []
    if not loaded:
        return []
    print(f"ddplite: {' '.join(compiler)} has no libstdc++.so to link (only its archive); linking {loaded[0]} instead")
    return [loaded[0]]


def check_libstdcxx_not_copied(library):
    """Fails the build when the linked extension defines libstdc++'s own code (a copy of
    libstdc++.a: libstdcxx_link_args did not see the case, e.g. the archive found first in one of
    the -L folders). Skipped where binutils' nm is missing."""
    try:
        defined = subprocess.run(["nm", "-D", "--defined-only", library], capture_output=True, text=True,
                                 check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return
    if "_ZNSo9_M_insertIlEERSoT_" in defined:  # std::ostream::_M_insert<long>, defined only in libstdc++
        raise RuntimeError(
            f"ddplite: {library} carries a copy of libstdc++ (the linker found libstdc++.a, not libstdc++.so); it "
            "would crash next to the libstdc++.so.6 torch loads. Install the compiler's libstdc++ development "
            "package (libstdc++-<N>-dev), or set CXX to a compiler that has it, and rebuild.")


MPI = mpi_flags()
print(f"ddplite: building {'with MPI (' + ' '.join(MPI[1]) + ')' if MPI else 'without MPI (mpicxx not found)'}")

nccl, nccl_reason = find_nccl()
include_dirs = [CSRC]
library_dirs = []
libraries = []
link_args = []
nccl_flags = []
if nccl:
    nccl_include, nccl_lib = nccl
    cuda_torch_lib = os.path.join(os.path.dirname(torch.__file__), "lib")
    cuda_home = os.environ.get("CUDA_HOME", "/usr/local/cuda")
    # CUDA headers (cuda_runtime_api.h) come from the toolkit; torch's own include folders are
    # added by CppExtension.
    include_dirs += [nccl_include] + [p for p in include_paths("cuda") if p not in include_paths("cpu")]
    library_dirs += [nccl_lib, cuda_torch_lib, os.path.join(cuda_home, "lib64")]
    # NCCL is linked by soname (-l:libnccl.so.2; the wheel ships no libnccl.so symlink) rather than
    # dlopen'ed: libtorch_cuda.so has the same DT_NEEDED entry, so at run time the loader reuses
    # the libnccl.so.2 torch already loaded (one NCCL in the process, as pytorch#119932 asks);
    # the rpath only matters if the extension were loaded before torch. cudart is linked by its
    # soname libcudart.so.13, which torch loads from the nvidia-cuda-runtime wheel.
    libraries += ["c10_cuda", "torch_cuda", "cudart"]
    link_args += ["-l:libnccl.so.2", f"-Wl,-rpath,{nccl_lib}"]
    # -Wno-interference-size: c10/cuda/CUDAEvent.h trips it with every g++ >= 12.
    nccl_flags = ["-DDDPLITE_WITH_NCCL=1", "-Wno-interference-size", f'-DDDPLITE_NCCL_INCLUDE="{nccl_include}"',
                  f'-DDDPLITE_NCCL_LIBRARY="{os.path.join(nccl_lib, "libnccl.so.2")}"']
    print(f"ddplite: building with NCCL ({nccl_include}/nccl.h, {nccl_lib}/libnccl.so.2)")
else:
    print(f"ddplite: building without NCCL ({nccl_reason}); CUDA tensors are unsupported in this build")


extension = CppExtension(
    name="torch_ddp_lite._C",
    sources=sources(nccl is not None),
    include_dirs=include_dirs,
    library_dirs=library_dirs,
    libraries=libraries,
    extra_link_args=link_args + (MPI[1] if MPI else []) + libstdcxx_link_args(),
    extra_compile_args={
        "cxx": OPTIMISATION_FLAGS + nccl_flags + (MPI[0] + ["-DDDPLITE_WITH_MPI=1"] if MPI else []) + [
            f'-DDDPLITE_TORCH_VERSION="{torch.__version__}"',
            # Recorded in the binary for collect_env (torch adds its own flags around these).
            f'-DDDPLITE_BUILD_FLAGS="{" ".join(OPTIMISATION_FLAGS)}"',
        ]
    },
)

# Object files in a fixed folder (the name build_ext --inplace uses), not in the temporary folder
# that pip's editable install would otherwise throw away: a later `pip install -e` or
# scripts/setup.sh then recompiles only what changed, and tests/test_mpi.py links an MPI-less
# extension from these objects (tests/build_variants.py).
BUILD_TEMP = os.path.join(ROOT, "build", f"temp.{sysconfig.get_platform()}-{sys.implementation.cache_tag}")


# A precompiled header of torch's headers (csrc/common/precompiled.hpp), made with the very flags
# of the build and force-included in every file: torch's headers are most of each file's compile
# time. It lives in BUILD_TEMP and is remade when what went into it changes: the flags (they name
# torch's version), the header, the compiler, or any file it read (a torch rebuilt under the same
# version). ninja does not see the .gch, so a -D naming the .gch's identity goes on every file's
# command line: a remade .gch changes the command, and ninja recompiles every file.
PRECOMPILED_SOURCE = os.path.join(CSRC, "common", "precompiled.hpp")


def _files_identity(paths):
    """Size and modification time of each file, as one string (a missing file counts too)."""
    parts = []
    for path in sorted(paths):
        try:
            info = os.stat(path)
            parts.append(f"{path} {info.st_size} {info.st_mtime_ns}")
        except OSError:
            parts.append(f"{path} missing")
    return "\n".join(parts)


def _read_dependencies(depfile):
    """The files a `-MD -MF depfile` compile read (make syntax: `target: a b \\` lines; a space
    in a path is written `\\ `)."""
    with open(depfile) as f:
        text = f.read().replace("\\\n", " ")
    words = re.split(r"(?<!\\)\s+", text.split(": ", 1)[-1])
    return [word.replace("\\ ", " ").replace("\\#", "#").replace("$$", "$") for word in words if word]


def precompiled_header(cflags, post_cflags, build_directory):
    """The flags that force-include the precompiled header (its .gch made when stale), or [].

    ``cflags`` and ``post_cflags`` are the shell-quoted flags torch writes into build.ninja; the
    .gch is made with them around ``-x c++-header``, as the ninja rule puts them around ``-c``.
    """
    folder = os.path.join(build_directory, "precompiled")
    header = os.path.join(folder, "precompiled.hpp")
    with open(PRECOMPILED_SOURCE) as f:
        text = f.read()
    # The compiler as torch runs it (CXX, else c++). torch 2.15 puts ccache in front where it is
    # installed; ccache caches a compile that uses a .gch only with sloppiness=pch_defines,time_macros.
    compiler = os.environ.get("CXX", "c++")
    try:
        compiler_version = subprocess.check_output(f"{compiler} -dumpfullversion", shell=True, text=True).strip()
    except subprocess.CalledProcessError:
        return []
    command = " ".join([compiler, *cflags, "-x", "c++-header", shlex.quote(header), "-o",
                        shlex.quote(header + ".gch"), "-MD", "-MF", shlex.quote(header + ".d"), *post_cflags])
    inputs = "\n".join([command, compiler_version, text])
    stamp = os.path.join(folder, "stamp")
    try:
        with open(stamp) as f:
            recorded_inputs, recorded_files = f.read().split("\n\0\n")
        if recorded_inputs == inputs and recorded_files == "FAILED":
            return []  # it failed with these very inputs: not tried again until they change
        if recorded_inputs == inputs and os.path.isfile(header + ".gch") and \
                recorded_files == _files_identity(_read_dependencies(header + ".d")):
            return _force_include(header, recorded_files)
    except (OSError, ValueError):
        pass
    os.makedirs(folder, exist_ok=True)
    for stale in (stamp, header + ".gch", header + ".d"):
        with contextlib.suppress(FileNotFoundError):
            os.remove(stale)
    with open(header, "w") as f:
        f.write(text)
    print("ddplite: precompiling torch's headers (csrc/common/precompiled.hpp)", flush=True)
    try:
        made = subprocess.run(command, shell=True).returncode == 0
        files = _files_identity(_read_dependencies(header + ".d")) if made else "FAILED"
    except (OSError, ValueError):
        made, files = False, "FAILED"
    with open(stamp, "w") as f:
        f.write(inputs + "\n\0\n" + files)
    if not made:
        print("ddplite: the precompiled header failed; building without it", flush=True)
        return []
    return _force_include(header, files)


def _force_include(header, files):
    """The flags for every file: include the header (its .gch), and name the .gch's identity."""
    return ["-include", shlex.quote(header), f"-DDDPLITE_PCH={hashlib.sha256(files.encode()).hexdigest()[:16]}"]


def with_precompiled_header(write_and_compile):
    """Wraps torch's private ninja step (cpp_extension._write_ninja_file_and_compile_objects,
    called with keywords from 2.8 to 2.15); a torch that calls it otherwise builds without it."""
    def wrapped(*args, **kwargs):
        if {"cflags", "post_cflags", "build_directory"} <= kwargs.keys() and os.environ.get("DDPLITE_WITH_PCH", "1") != "0":
            flags = precompiled_header(kwargs["cflags"], kwargs["post_cflags"], kwargs["build_directory"])
            kwargs["post_cflags"] = list(kwargs["post_cflags"]) + flags
        return write_and_compile(*args, **kwargs)
    return wrapped


class PersistentBuildExt(BuildExtension.with_options(use_ninja=True)):
    def finalize_options(self):
        super().finalize_options()
        # setuptools' editable_wheel sets its own temporary build_temp, ignoring setup(options=...)
        self.build_temp = BUILD_TEMP

    def build_extensions(self):
        # One build at a time in BUILD_TEMP (pip install -e and python -m build share it): the
        # precompiled header is remade in place, and torch's ninja file and objects are too.
        os.makedirs(self.build_temp, exist_ok=True)
        with open(os.path.join(self.build_temp, ".lock"), "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            original = cpp_extension._write_ninja_file_and_compile_objects
            cpp_extension._write_ninja_file_and_compile_objects = with_precompiled_header(original)
            try:
                super().build_extensions()
            finally:
                cpp_extension._write_ninja_file_and_compile_objects = original
        for ext in self.extensions:
            check_libstdcxx_not_copied(self.get_ext_fullpath(ext.name))


setup(
    version=VERSION,
    install_requires=[TORCH_REQUIREMENT, "numpy"],
    ext_modules=[extension],
    cmdclass={"build_ext": PersistentBuildExt},
)
