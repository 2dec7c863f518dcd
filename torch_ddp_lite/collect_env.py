"""What to paste into a bug report or next to a benchmark: versions, build, machine, ddplite's options.

    python -m torch_ddp_lite.collect_env

Prints one ``key: value`` line per fact, in sections: torch, CUDA and NCCL (what torch links and
what ``libnccl.so.2`` reports when loaded), MPI, compilers, the machine, and ddplite (its build,
transports, algorithms and ``DDPLITE_*`` settings). A probe that fails prints why instead of
stopping the report.
"""

import ctypes
import os
import platform
import shutil
import subprocess
import sys

import torch

import torch_ddp_lite

_SETTINGS_SHOWN = ("OMP_NUM_THREADS", "GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME", "MASTER_ADDR", "MASTER_PORT")


def command_first_line(*command):
    """First line of a command's output, or why there is none."""
    if shutil.which(command[0]) is None:
        return "not found"
    try:
        result = subprocess.run(command, capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.SubprocessError) as error:
        return f"failed ({error})"
    lines = (result.stdout or result.stderr).strip().splitlines()
    return lines[0] if lines else f"no output (exit code {result.returncode})"


def torch_section():
    return {
        "torch": torch.__version__,
        "torch git": torch.version.git_version,
        "torch debug build": torch.version.debug,
        "torch CXX11 ABI": torch._C._GLIBCXX_USE_CXX11_ABI,
        "torch compiler": torch_build_line("GCC") or torch_build_line("clang") or "unknown",
        "torch CPU capability": torch.backends.cpu.get_cpu_capability(),
        "torch.distributed backends": distributed_backends(),
    }


def distributed_backends():
    """torch's own backends this build has, then the third-party ones registered in this process
    (ddplite among them, once torch_ddp_lite or torch's autoload registered it)."""
    import torch.distributed as dist

    builtin = [name for name, available in (("gloo", dist.is_gloo_available()), ("nccl", dist.is_nccl_available()),
                                            ("mpi", dist.is_mpi_available())) if available]
    plugins = sorted(name.lower() for name in getattr(dist.Backend, "_plugins", {}))
    return ", ".join(builtin + [f"{name} (third-party, registered)" for name in plugins])


def torch_build_line(word):
    """The line of torch.__config__.show() that starts with `word` (e.g. the compiler), if any."""
    for line in torch.__config__.show().splitlines():
        if line.strip(" -").startswith(word):
            return line.strip(" -")
    return None


def cuda_section():
    available = torch.cuda.is_available()
    section = {
        "CUDA available": available,
        "torch built with CUDA": torch.version.cuda or "no",
        "cuDNN": torch.backends.cudnn.version() if available else "n/a",
    }
    if available:
        for index in range(torch.cuda.device_count()):
            section[f"GPU {index}"] = torch.cuda.get_device_name(index)
    return section


def nccl_section():
    return {
        "NCCL used by torch": torch_nccl_version(),
        "libnccl.so.2 loaded": loaded_nccl_version(),
        "ddplite NCCL": ddplite_nccl_text(),
    }


def ddplite_nccl_text():
    """ddplite's own NCCL: the header it was compiled against and the library loaded at run time."""
    try:
        versions = torch_ddp_lite.nccl_version()
    except RuntimeError:
        return "not compiled in (this build has no CUDA path)"
    compiled, loaded = (".".join(map(str, versions[key])) for key in ("compiled", "loaded"))
    verdict = "compatible" if versions["compatible"] else "INCOMPATIBLE: rebuild ddplite against the loaded NCCL"
    return f"compiled {compiled}, loaded {loaded} ({verdict})"


def torch_nccl_version():
    try:
        return ".".join(str(part) for part in torch.cuda.nccl.version())
    except Exception as error:  # noqa: BLE001 - a CPU-only torch has no NCCL
        return f"none ({error})"


def loaded_nccl_version():
    """ncclGetVersion() of the libnccl.so.2 the dynamic loader finds (torch's, when it has one)."""
    try:
        library = ctypes.CDLL("libnccl.so.2")
    except OSError as error:
        return f"not loadable ({error})"
    code = ctypes.c_int()
    if library.ncclGetVersion(ctypes.byref(code)) != 0:
        return "ncclGetVersion failed"
    major, rest = divmod(code.value, 10000)
    minor, patch = divmod(rest, 100)
    return f"{major}.{minor}.{patch} (code {code.value})"


def mpi_section():
    try:
        from mpi4py import MPI

        mpi4py_text = MPI.Get_library_version().strip().splitlines()[0]
    except ImportError:
        mpi4py_text = "not installed"
    build = torch_ddp_lite._load_extension().build_info()
    ddplite_mpi = (f"compiled in: {build['mpi_library']} (MPI {build['mpi_standard']})" if build["mpi"]
                   else "not compiled in (mpi:// and DDPLITE_CPU_TRANSPORT=mpi unavailable)")
    return {"mpirun": command_first_line("mpirun", "--version"), "mpi4py": mpi4py_text, "ddplite MPI": ddplite_mpi}


def compiler_section():
    return {"gcc": command_first_line("gcc", "--version"), "c++": command_first_line("c++", "--version")}


def machine_section():
    return {
        "platform": platform.platform(),
        "python": sys.version.split()[0],
        "CPU": cpu_model(),
        "CPUs (os.cpu_count)": os.cpu_count(),
        "CPUs usable by this process": len(os.sched_getaffinity(0)),
        "torch threads": torch.get_num_threads(),
    }


def cpu_model():
    try:
        with open("/proc/cpuinfo") as cpuinfo:
            for line in cpuinfo:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def cpu_path_rule():
    """What DDPLITE_CPU_TRANSPORT does for a group on this machine (a group's own choice and reason:
    torch_ddp_lite.cpu_path(group))."""
    requested = os.environ.get("DDPLITE_CPU_TRANSPORT", "auto").lower() or "auto"
    try:
        stats = os.statvfs("/dev/shm")
        free = f"/dev/shm has {stats.f_bavail * stats.f_frsize / 2**30:.1f} GiB free"
    except OSError as error:
        free = f"/dev/shm unusable: {error.strerror}"
    if requested in ("auto", "shm"):
        other = "TCP" if requested == "auto" else "an error"
        return f"{requested}: shared memory when all ranks share this host ({free}), else {other}"
    return f"{requested} (DDPLITE_CPU_TRANSPORT)"


def kernel_sets_line():
    """The reduction kernel set a group created now would use, and the sets this CPU runs."""
    try:
        active, runnable = torch_ddp_lite._load_extension().kernel_sets()
    except ValueError as error:  # DDPLITE_CPU_KERNELS names a set this CPU lacks
        return f"none: {error}"
    return f"{active} (this CPU runs: {', '.join(runnable)})"


def ddplite_section():
    build = torch_ddp_lite._load_extension().build_info()
    section = {
        "torch_ddp_lite": torch_ddp_lite.__version__,
        "extension": torch_ddp_lite._load_extension().__file__,
        "extension built against torch": torch_ddp_lite.built_torch_version(),
        "extension compiler": f"{build['compiler']} (C++ standard {build['cplusplus']})",
        "extension build flags": build["flags"],
        "transports": ", ".join(build["cpu_transports"]),
        "CPU path of a group": cpu_path_rule(),
        "CPU reduction kernels": kernel_sets_line(),
        "CPU algorithms": "; ".join(f"{op}: {', '.join(names)}"
                                    for op, names in torch_ddp_lite.available_algorithms().items()),
        "CPU algorithm pins": ", ".join(f"{op}:{name}" for op, name in torch_ddp_lite.get_algorithms().items()),
        "CUDA": ("NCCL path compiled in (docs/gpu.md)" if build["nccl"]["compiled_in"]
                 else "not compiled in (CUDA tensors raise NotImplementedError)"),
    }
    for name, default, _ in torch_ddp_lite.env_knobs():
        section[name] = f"{os.environ[name]} (set)" if name in os.environ else f"{default or 'unset'} (default)"
    for name in sorted(set(os.environ) - set(section)):
        if name.startswith("DDPLITE_"):
            section[name] = f"{os.environ[name]} (set)"
    for name in _SETTINGS_SHOWN:
        section[name] = os.environ.get(name, "unset")
    return section


def collect():
    """{section title: {key: value}}."""
    return {
        "torch": torch_section(),
        "CUDA": cuda_section(),
        "NCCL": nccl_section(),
        "MPI": mpi_section(),
        "compilers": compiler_section(),
        "machine": machine_section(),
        "ddplite": ddplite_section(),
    }


def render(report):
    lines = []
    for title, section in report.items():
        lines.append(f"## {title}")
        lines += [f"{key}: {value}" for key, value in section.items()]
        lines.append("")
    return "\n".join(lines)


if __name__ == "__main__":
    print(render(collect()), end="")
