"""torch-ddp-lite: the ``ddplite`` torch.distributed backend.

Importing this package registers the backend (the ``torch.backends`` entry point normally has
already done so) and checks that the C++ extension matches the running torch::

    import torch.distributed as dist
    dist.init_process_group(backend="ddplite")
"""

import atexit
import importlib
import sys


def _run_as_the_status_tool():
    """True while ``python -m torch_ddp_lite.status`` imports this package on its way to the tool:
    the tool reads a store and asks sockets, and importing torch (about 2.5 s) would spend most of
    the 2 s it has. (runpy imports the package with sys.argv[0] == "-m"; orig_argv names the module.)"""
    argv = getattr(sys, "orig_argv", [])
    return sys.argv[:1] == ["-m"] and "-m" in argv and argv[argv.index("-m") + 1:][:1] == ["torch_ddp_lite.status"]


_STATUS_TOOL_ONLY = _run_as_the_status_tool()
if not _STATUS_TOOL_ONLY:
    import torch
    import torch.distributed  # noqa: F401 - registers c10d types the extension needs

import _ddplite_autoload  # noqa: E402 - imports nothing heavy
from torch_ddp_lite import torch_versions  # noqa: E402 - imports nothing

__version__ = "0.1.0"
BACKEND_NAME = _ddplite_autoload.BACKEND_NAME

_REBUILD_HINT = (
    "rebuild it against the installed torch from the repository root with:\n"
    "    pip install --no-build-isolation --no-deps -e .\n"
    "(or run scripts/setup.sh, which does this when needed)"
)

_extension = None


def _load_extension():
    """Imports the C++ extension once, checking it was built against the running torch."""
    global _extension
    if _extension is not None:
        return _extension
    try:
        module = importlib.import_module("torch_ddp_lite._C")
    except ImportError as error:
        raise ImportError(
            f"torch_ddp_lite: the C++ extension could not be loaded ({error}); {_REBUILD_HINT}"
        ) from error
    built = module.built_torch_version()
    if built != torch.__version__:
        raise ImportError(
            f"torch_ddp_lite was built against torch {built} but torch {torch.__version__} is running; "
            f"{_REBUILD_HINT}"
        )
    # MPI_Finalize at exit when ddplite initialised MPI (mpi:// or DDPLITE_CPU_TRANSPORT=mpi);
    # a no-op otherwise. Open MPI reports a process that exits without it as a failure.
    atexit.register(module.mpi_finalize)
    # Registered after mpi_finalize, so it runs first (atexit is last-in, first-out): every thread
    # of every ddplite group ends while Python is still whole. A thread of ours that frees a tensor
    # with a Python object during finalization would be ended by Python, aborting the process.
    atexit.register(module.stop_all_for_exit)
    _extension = module
    return module


def torch_has(feature):
    """Whether the running torch has ``feature`` (a key of ``torch_versions.FEATURES``: "split",
    "shrink", "split_keeps_order", ...); torch-ddp-lite serves each from that release on."""
    return torch_versions.has(feature, torch.__version__)


def require_torch(feature, rank=None):
    """Raises RuntimeError naming the torch release that has ``feature`` when the running one
    lacks it (what torch-ddp-lite refuses on an older torch)."""
    if torch_has(feature):
        return
    where = "" if rank is None else f"[rank {rank}] "
    raise RuntimeError(
        f"{where}ddplite: {torch_versions.FEATURES[feature][1]} needs torch {torch_versions.first_with(feature)} "
        f"or later; this is torch {torch.__version__}. Upgrade torch (torch-ddp-lite supports "
        f"{torch_versions.supported_range()}) or do without it (dist.new_group(ranks) makes any group on every torch)"
    )


def register_backend():
    """Registers 'ddplite' with torch.distributed (idempotent)."""
    return _ddplite_autoload.register_backend()


def built_torch_version():
    """The torch version the C++ extension was compiled against."""
    return _load_extension().built_torch_version()


def build_info():
    """How the extension was built: compiler, flags, C++ standard; ``mpi`` (bool), ``mpi_library``
    and ``mpi_standard``; and ``nccl`` (``{"compiled_in": bool, "version": (major, minor, patch)
    or None, ...}``)."""
    return dict(_load_extension().build_info())


def nccl_version():
    """The NCCL of ddplite's CUDA path: ``{"compiled": (2, 28, 9), "loaded": (2, 28, 9),
    "compatible": True}``. ``compiled`` is the nccl.h the extension was built against, ``loaded``
    what ``ncclGetVersion()`` of the libnccl.so.2 in this process reports (torch's; no GPU needed).
    ``compatible`` is False when the loaded NCCL has another major version or is older than the
    header; the first CUDA collective then fails with a DistBackendError saying so.

    Raises RuntimeError when the extension was built without NCCL.
    """
    versions = _load_extension().nccl_version()
    if versions is None:
        raise RuntimeError(
            "torch_ddp_lite was built without NCCL (setup.py needs a CUDA build of torch, nccl.h and "
            "libnccl.so.2), so CUDA tensors are not supported by this build; " + _REBUILD_HINT
        )
    return dict(versions)


def env_knobs():
    """Every DDPLITE_* environment variable as a list of (name, default, help)."""
    return [tuple(knob) for knob in _load_extension().env_knobs()]


def available_algorithms():
    """The CPU algorithms of each collective, e.g. ``{"allreduce": ["naive", "ring", ...], ...}``."""
    return {name: list(algorithms) for name, algorithms in _load_extension().available_algorithms()}


def get_algorithms():
    """The algorithm pinned for each collective, or ``"auto"`` for the size-based choice."""
    return dict(_load_extension().algorithm_pins())


def set_algorithm(collective, algorithm):
    """Pins ``collective`` (e.g. ``"allreduce"``) to ``algorithm`` (e.g. ``"ring"``); ``"auto"``
    restores the automatic choice.

    Same syntax and effect as ``DDPLITE_ALGO=allreduce:ring`` and process-wide (every ddplite
    group). Every rank must pin the same algorithms before the collectives they affect; a rank
    that runs another algorithm for the same op desynchronises the group. Raises ValueError for
    an unknown collective or algorithm.
    """
    _load_extension().set_algorithm_pins(f"{collective}:{algorithm}")


def set_algorithms(spec):
    """Pins several at once from a ``DDPLITE_ALGO``-style spec: ``"allreduce:ring,broadcast:tree"``;
    ``"auto"`` or ``""`` unpins everything."""
    _load_extension().set_algorithm_pins(spec)


def _call_on_cpu_backend(group, call):
    """``call(extension, backend)`` on the ddplite CPU backend of ``group`` (the default group when
    None); ValueError when the group has no CPU backend or it is not ddplite's."""
    import torch.distributed as dist

    group = dist.group.WORLD if group is None else group
    try:
        backend = group._get_backend(torch.device("cpu"))
    except RuntimeError as error:
        raise ValueError(f"this group has no CPU backend: {error}") from None
    try:
        return call(_load_extension(), backend)
    except TypeError:
        raise ValueError(f"the group's CPU backend is {backend.name()}, not ddplite") from None


def cpu_path(group=None):
    """``(path, reason)`` for the CPU collectives of a ddplite process group (the default group
    when ``group`` is None): path is ``"shm"``, ``"tcp"``, ``"mpi"`` or ``"hierarchical"`` (a group
    across hosts: all_reduce through shared memory inside each host, TCP between them); reason
    says why, e.g.
    ``"DDPLITE_CPU_TRANSPORT=auto, and all 2 ranks share this host; steps synchronise through flat
    waits (...)"``. Raises ValueError for a
    group whose CPU backend is not ddplite."""
    return tuple(_call_on_cpu_backend(group, lambda extension, backend: extension.group_cpu_path(backend)))


def failed_ranks(group=None, wait=2.0):
    """The ranks of a ddplite process group (the default group when ``group`` is None) that are
    gone, dead or stuck, as a sorted list of group ranks: the same list on every rank that calls it,
    so that the survivors can pass it to ``torch.distributed.shrink_group``.

    Every surviving rank calls it (after its collective raised). Each caller says so in the group's
    store and waits until every rank has either called too or is known dead (a rank on this host
    whose process has ended), at most ``wait`` seconds; a rank that neither called nor is known dead
    by then (it hangs, or died on another host) is counted failed. The first caller's answer is
    everyone's (the store settles it). A rank that calls after the others' wait ended is in that
    answer and raises ``DistBackendError``. The store must outlive the failed ranks (torchrun's
    agent hosts it; under ``env://`` rank 0 does)."""
    from torch.distributed import distributed_c10d as c10d

    if group is not None and c10d._rank_not_in_group(group):
        raise ValueError("this rank is not a member of that group")
    return list(_call_on_cpu_backend(
        group, lambda extension, backend: extension.group_failed_ranks(backend, float(wait))))


def dump_flight_recorder(path=None):
    """Writes this process's flight-recorder dump (every ddplite group's last ops) in the format of
    torch's analyzer and returns its path, or None when no group records (DDPLITE_TRACE_BUFFER_SIZE=0).

    ``path`` defaults to ``$DDPLITE_TRACE_DIR/ddplite_trace_rank_<global rank>`` (else the
    ``TORCH_FR_DUMP_TEMP_FILE`` prefix, else ``/tmp/ddplite_traces/ddplite_trace_rank_``). Call it on
    every rank, then: ``python -m torch.distributed.flight_recorder.fr_trace <dir>``.
    """
    return _load_extension().dump_flight_recorder("" if path is None else str(path))


def flight_recorder_trace():
    """This process's flight-recorder dump as a dict (``version``, ``pg_config``, ``pg_status``,
    ``entries``), as torch's analyzer reads it."""
    import pickle

    return pickle.loads(_load_extension().flight_recorder_pickle())


def monitored_barrier(group=None, timeout=None, wait_all_ranks=False):
    """``torch.distributed.monitored_barrier`` for ddplite groups (torch's own refuses every backend
    but gloo before asking it). Same arguments and semantics as gloo's: rank 0 waits up to
    ``timeout`` (a timedelta or seconds; default: the group's timeout) for every other rank and
    raises naming the first one that did not arrive (every one with ``wait_all_ranks=True``):
    ``"[Rank 0]: Rank 1 failed to pass monitoredBarrier in 2000 ms"``; the ranks that did arrive
    raise as soon as rank 0 has decided. Errors are ``DistBackendError`` (a ``RuntimeError``, as
    gloo's are). Groups of another backend go to ``torch.distributed.monitored_barrier``."""
    from datetime import timedelta

    import torch.distributed as dist
    from torch.distributed import distributed_c10d as c10d

    if c10d._rank_not_in_group(group):
        return None
    if dist.get_backend(group) != BACKEND_NAME:
        return dist.monitored_barrier(group, timeout, wait_all_ranks)
    group = c10d._get_default_group() if group is None else group
    if timeout is None:
        return group.monitored_barrier(wait_all_ranks=wait_all_ranks)
    if not isinstance(timeout, timedelta):
        timeout = timedelta(seconds=timeout)
    return group.monitored_barrier(timeout, wait_all_ranks=wait_all_ranks)


if not _STATUS_TOOL_ONLY:
    from torch_ddp_lite import _torch_fixes

    register_backend()
    _torch_fixes.register_shrunk_groups_as_custom()
    _torch_fixes.refuse_split_before_2_9(require_torch)
    _load_extension()

    #: ``pg_options`` for ddplite groups: ``Options(timeout=timedelta(seconds=60))``; copyable, as
    #: dist.split_group needs. What ddplite honours and refuses: torch_ddp_lite/options.py.
    Options = _extension.DdpliteOptions

    from torch_ddp_lite.stragglers import stragglers  # noqa: F401 - needs the extension loaded

__all__ = [
    "BACKEND_NAME",
    "Options",
    "__version__",
    "available_algorithms",
    "build_info",
    "built_torch_version",
    "cpu_path",
    "dump_flight_recorder",
    "env_knobs",
    "failed_ranks",
    "flight_recorder_trace",
    "get_algorithms",
    "monitored_barrier",
    "nccl_version",
    "register_backend",
    "require_torch",
    "torch_has",
    "set_algorithm",
    "set_algorithms",
    "stragglers",
]
