"""Starting the benchmark's ranks and giving each one its groups and device.

Under torchrun (``RANK``/``WORLD_SIZE`` set) or an MPI launcher (Open MPI's
``OMPI_COMM_WORLD_*`` or MPICH/Intel MPI's ``PMI_*``), every process is already a rank: it joins
through ``env://`` (an MPI launch defaults ``MASTER_ADDR=127.0.0.1``, ``MASTER_PORT=29500``,
which is right for one host; export them for several). Otherwise the benchmark starts
``--world-size`` ranks itself with multiprocessing's spawn method and a file:// store in a
temporary folder.

Every rank's default group is gloo: it is the *control* group that synchronises rounds and
agrees on iteration counts and timings, so no measured group carries any traffic but the op
being measured. Each measured backend gets its own group over all ranks (``new_group``),
created in the same order on every rank.
"""

import multiprocessing
import multiprocessing.connection
import os
import sys
import tempfile
from datetime import timedelta

import torch
import torch.distributed as dist

from torch_ddp_lite.rendezvous import launcher_rank

CONTROL_BACKEND = "gloo"


def launcher_ranks():
    """(rank, world_size, local_rank) set by torchrun or an MPI launcher, or None."""
    env = os.environ
    if "RANK" in env and "WORLD_SIZE" in env:
        rank = int(env["RANK"])
        return rank, int(env["WORLD_SIZE"]), int(env.get("LOCAL_RANK", rank))
    launch = launcher_rank()
    if launch is not None and launch.launcher.uses_mpi:
        return launch.rank, launch.world_size, int(os.environ.get(launch.launcher.local_rank, launch.rank))
    return None


def run_ranks(entry, options):
    """Runs ``entry(options)`` on every rank once the control group is up; returns an exit code."""
    launched = launcher_ranks()
    if launched is None:
        return _spawn_ranks(entry, options)
    rank, world_size, local_rank = launched
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29500")
    _run_rank(entry, options, rank, world_size, local_rank, "env://")
    return 0


def _spawn_ranks(entry, options):
    context = multiprocessing.get_context("spawn")
    with tempfile.TemporaryDirectory(prefix="ddplite-bench-") as folder:
        init_method = f"file://{os.path.join(folder, 'store')}"
        processes = [
            context.Process(target=_run_rank, args=(entry, options, rank, options.world_size, rank, init_method),
                            name=f"bench-rank-{rank}")
            for rank in range(options.world_size)
        ]
        for process in processes:
            process.start()
        return _wait_for_ranks(processes)


def _wait_for_ranks(processes):
    """Waits for every rank; once one fails the others are stopped (they would wait for it until the timeout)."""
    running = list(processes)
    while running:
        multiprocessing.connection.wait([process.sentinel for process in running])
        running = [process for process in running if process.exitcode is None]
        failed = [process for process in processes if process.exitcode not in (None, 0)]
        if failed:
            for process in running:
                process.terminate()
            for process in processes:
                process.join()
            names = ", ".join(f"{process.name} (exit code {process.exitcode})" for process in failed)
            print(f"torch_ddp_lite.bench: {names} failed; see its traceback above", file=sys.stderr)
            return 1
    return 0


def _run_rank(entry, options, rank, world_size, local_rank, init_method):
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world_size), LOCAL_RANK=str(local_rank))
    if options.algo:
        os.environ["DDPLITE_ALGO"] = options.algo  # read by ddplite when its groups are created
    _share_cores(world_size)
    dist.init_process_group(CONTROL_BACKEND, init_method=init_method, rank=rank, world_size=world_size,
                            timeout=timedelta(seconds=options.timeout))
    try:
        entry(options)
    finally:
        dist.destroy_process_group()


def _share_cores(world_size):
    """Without OMP_NUM_THREADS, gives each rank its share of the cores instead of all of them."""
    if "OMP_NUM_THREADS" not in os.environ:
        local_ranks = int(os.environ.get("LOCAL_WORLD_SIZE", world_size))
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // local_ranks))


# Columns that are ddplite with other settings: {column: (torch backend, DDPLITE_* variables read
# when the column's group is created)}. "ddplite-mpi" is MPI's own collectives and needs the ranks
# launched by mpirun; "ddplite-unchecked" has the wire fingerprint off (its cost, docs/reliability.md);
# "ddplite-generic" reduces with the x86-64 baseline kernels instead of the widest set the CPU runs;
# "ddplite-flat" and "ddplite-tree" pin how the shared-memory steps synchronise (docs/scale.md);
# "ddplite-ondemand" and "ddplite-atinit" pin when TCP pairs connect (DDPLITE_CONNECT), which across
# hosts also decides whether gather, scatter and all_to_all go through the hosts' leaders;
# "ddplite-handoff" hands every op to the group's worker thread and sleeps in poll() at once on TCP
# (DDPLITE_SYNC_ON_CALLER=0, DDPLITE_TCP_SPIN_US=0: ddplite before 2026-11-28), to measure both;
# "ddplite-leaders" carries every all_reduce across hosts through the hosts' leaders, never on rails
# (DDPLITE_RAILS_BYTES=0); "ddplite-xspin" and "ddplite-nospin" set how long a wait on shared memory
# or TCP spins before it sleeps: 3 ms, and none (the default is 50 us; where each spins and how it
# yields: docs/benchmarks.md's columns table; docs/data/crosshost/spin_4x2_2026-11-30.md).
BACKEND_VARIANTS = {
    "ddplite-leaders": ("ddplite", {"DDPLITE_RAILS_BYTES": "0"}),
    "ddplite-handoff": ("ddplite", {"DDPLITE_SYNC_ON_CALLER": "0", "DDPLITE_TCP_SPIN_US": "0"}),
    # one send() per remaining buffer (the TCP transport before DDPLITE_TCP_SEND_CHUNK_BYTES)
    "ddplite-wholesend": ("ddplite", {"DDPLITE_TCP_SEND_CHUNK_BYTES": "0"}),
    "ddplite-mpi": ("ddplite", {"DDPLITE_CPU_TRANSPORT": "mpi"}),
    "ddplite-tcp": ("ddplite", {"DDPLITE_CPU_TRANSPORT": "tcp"}),
    "ddplite-shm": ("ddplite", {"DDPLITE_CPU_TRANSPORT": "shm"}),
    "ddplite-unchecked": ("ddplite", {"DDPLITE_FINGERPRINT": "0"}),
    "ddplite-generic": ("ddplite", {"DDPLITE_CPU_KERNELS": "generic"}),
    # how the shared-memory steps synchronise (DDPLITE_SHM_SYNC), whatever the group's size
    "ddplite-flat": ("ddplite", {"DDPLITE_SHM_SYNC": "flat"}),
    "ddplite-tree": ("ddplite", {"DDPLITE_SHM_SYNC": "tree"}),
    "ddplite-ondemand": ("ddplite", {"DDPLITE_CONNECT": "on_demand"}),
    "ddplite-atinit": ("ddplite", {"DDPLITE_CONNECT": "at_init"}),
    "ddplite-xspin": ("ddplite", {"DDPLITE_SHM_SPIN_US": "3000", "DDPLITE_TCP_SPIN_US": "3000"}),
    "ddplite-nospin": ("ddplite", {"DDPLITE_SHM_SPIN_US": "0", "DDPLITE_TCP_SPIN_US": "0"}),
    # a blocked caller's waits spin up to 1 ms (DDPLITE_CALLER_SPIN_US; off by default): always, and
    # where the group's trial of spinning against sleeping keeps it (DDPLITE_CALLER_SPIN_TRIAL)
    "ddplite-callerspin": ("ddplite", {"DDPLITE_CALLER_SPIN_US": "1000", "DDPLITE_CALLER_SPIN_TRIAL": "0"}),
    "ddplite-spintrial": ("ddplite", {"DDPLITE_CALLER_SPIN_US": "1000"}),
}


# Not a backend: the memcpy reference column (every rank copies the same bytes between two of its
# own buffers at the same time), the physical yardstick of the CPU collectives.
MEMCPY = "memcpy"


def measured_groups(backends):
    """{backend: group over all ranks}, one new group per backend (or variant); None for memcpy."""
    ranks = list(range(dist.get_world_size()))
    return {backend: None if backend == MEMCPY else _new_group(ranks, backend) for backend in backends}


def _new_group(ranks, backend):
    if backend not in BACKEND_VARIANTS:
        return dist.new_group(ranks=ranks, backend=backend)
    torch_backend, settings = BACKEND_VARIANTS[backend]
    saved = {name: os.environ.get(name) for name in settings}
    os.environ.update(settings)  # read when the group's backend is created
    try:
        return dist.new_group(ranks=ranks, backend=torch_backend)
    finally:
        for name, value in saved.items():
            if value is None:
                del os.environ[name]
            else:
                os.environ[name] = value


def rank_device(kind):
    """This rank's device: the CPU, or GPU LOCAL_RANK modulo the visible GPUs (shared when fewer)."""
    if kind == "cpu":
        return torch.device("cpu")
    if torch.cuda.device_count() == 0:
        raise RuntimeError("--device cuda, but this rank sees no GPU")
    index = int(os.environ["LOCAL_RANK"]) % torch.cuda.device_count()
    torch.cuda.set_device(index)
    return torch.device("cuda", index)


def synchronizer(device):
    """What makes an op's time include its device work: a CUDA synchronize, nothing on CPU."""
    if device.type == "cuda":
        return torch.cuda.synchronize
    return lambda: None


def is_reporting_rank():
    return dist.get_rank() == 0
