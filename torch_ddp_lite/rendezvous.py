"""Rendezvous for launchers that are not torchrun: ``mpi://`` and env:// under mpirun or Slurm.

``init_method="mpi://"`` (registered by the ``ddplite`` entry point, so a stock script needs no
import): rank and world size come from MPI; rank 0 starts a c10d TCPStore on a free port and
``MPI_Bcast`` tells the other ranks where it is. Nothing else need be set::

    mpirun -np 4 python train.py        # dist.init_process_group("ddplite", init_method="mpi://")

``env://`` (torch's default) keeps torch's behaviour whenever RANK and WORLD_SIZE are set. When
they are not, but an MPI launcher's or Slurm's rank variables are, the rank and world size are
taken from those; MASTER_ADDR/MASTER_PORT are then used if set, else (under mpirun, with MPI
compiled in) the store is found through MPI as for ``mpi://``; otherwise the error lists what is
missing and how to set it.
"""

import datetime
import os
import socket
import urllib.parse
from dataclasses import dataclass

import torch.distributed as dist

DEFAULT_TIMEOUT = datetime.timedelta(minutes=30)


@dataclass(frozen=True)
class LauncherVariables:
    launcher: str
    rank: str
    size: str
    local_rank: str
    uses_mpi: bool  # its processes are one MPI job (MPI_COMM_WORLD spans them)


LAUNCHERS = (
    LauncherVariables("Open MPI's mpirun", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK", True),
    LauncherVariables("MPICH / Intel MPI (PMI)", "PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", True),
    LauncherVariables("Slurm (srun)", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", False),
)


@dataclass(frozen=True)
class LauncherRank:
    launcher: LauncherVariables
    rank: int
    world_size: int
    local_rank: int


def launcher_rank(env=None):
    """The rank an MPI launcher or Slurm describes in the environment, or None."""
    env = os.environ if env is None else env
    for launcher in LAUNCHERS:
        if launcher.rank in env and launcher.size in env:
            return LauncherRank(launcher, int(env[launcher.rank]), int(env[launcher.size]),
                                int(env.get(launcher.local_rank, 0)))
    return None


def _extension():
    from torch_ddp_lite import _load_extension

    return _load_extension()


def _init_mpi():
    """MPI_Init_thread once (MPI_THREAD_MULTIPLE; MPI_Finalize at exit is registered by the
    extension's loader); (rank, size)."""
    extension = _extension()
    if not extension.build_info()["mpi"]:
        raise RuntimeError(
            "ddplite: init_method='mpi://' needs MPI, and this ddplite was built without it.\n"
            f"Hint: {extension.mpi_rebuild_hint()}")
    return extension.mpi_init_world()


def _query(url):
    return dict(urllib.parse.parse_qsl(urllib.parse.urlparse(url).query))


def _check_against_mpi(url, rank, size):
    """A rank or world_size passed to init_process_group must agree with MPI's."""
    query = _query(url)
    for name, mpi_value in (("rank", rank), ("world_size", size)):
        given = int(query.get(name, -1))
        if given not in (-1, mpi_value):
            raise ValueError(
                f"ddplite mpi:// rendezvous: init_process_group got {name}={given}, but MPI says {mpi_value} "
                f"(MPI rank {rank} of {size}).\nHint: leave rank and world_size out with init_method='mpi://': "
                "MPI provides them")


def _store_over_mpi(rank, size, timeout):
    """Rank 0 hosts a TCPStore on a free port; MPI_Bcast carries 'hostname address port'."""
    extension = _extension()
    store = None
    if rank == 0:
        address, _ = extension.listen_address()
        store = dist.TCPStore("127.0.0.1", 0, size, True, timeout, wait_for_workers=False, multi_tenant=True)
        announcement = f"{socket.gethostname()} {address} {store.port}"
    else:
        announcement = ""
    host, address, port = extension.mpi_broadcast_world(announcement.encode(), 0).decode().split()
    if store is None:
        # Same machine as rank 0: loopback always works, whatever the interfaces.
        target = "127.0.0.1" if host == socket.gethostname() else address
        store = dist.TCPStore(target, int(port), size, False, timeout)
    return store


def mpi_rendezvous_handler(url, timeout=DEFAULT_TIMEOUT, **kwargs):
    """torch.distributed rendezvous handler for ``mpi://``: yields (store, rank, world size)."""
    rank, size = _init_mpi()
    _check_against_mpi(url, rank, size)
    yield _store_over_mpi(rank, size, timeout), rank, size
    raise RuntimeError("ddplite: the mpi:// rendezvous cannot re-rendezvous (MPI jobs have a fixed size)")


def _with_query(url, **values):
    parts = urllib.parse.urlparse(url)
    query = dict(urllib.parse.parse_qsl(parts.query))
    query.update({key: str(value) for key, value in values.items()})
    return urllib.parse.urlunparse(parts._replace(query=urllib.parse.urlencode(query)))


def _missing_master_error(launch, missing):
    hint = {
        True: "export MASTER_ADDR=<rank 0's host> MASTER_PORT=29500 in the job, or use "
              "init_method='mpi://' (ddplite built with MPI), which needs neither",
        False: 'export MASTER_ADDR=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1) '
               "MASTER_PORT=29500 in the batch script before srun",
    }[launch.launcher.uses_mpi]
    return ValueError(
        f"ddplite env:// rendezvous: launched by {launch.launcher.launcher} (rank {launch.rank} of "
        f"{launch.world_size} from {launch.launcher.rank}/{launch.launcher.size}), but "
        f"{' and '.join(missing)} {'is' if len(missing) == 1 else 'are'} not set, and torch's env:// needs "
        f"{'it' if len(missing) == 1 else 'them'} to find the store.\nHint: {hint}")


def env_rendezvous_handler(torch_handler, url, timeout=DEFAULT_TIMEOUT, **kwargs):
    """torch's env:// handler, extended to MPI launchers' and Slurm's rank variables."""
    query = _query(url)
    env = os.environ
    has_rank = "rank" in query or "RANK" in env
    has_size = "world_size" in query or "WORLD_SIZE" in env
    launch = launcher_rank()
    if (has_rank and has_size) or launch is None:
        return torch_handler(url, timeout=timeout, **kwargs)
    missing = [name for name in ("MASTER_ADDR", "MASTER_PORT") if name not in env]
    if not missing:
        return torch_handler(_with_query(url, rank=launch.rank, world_size=launch.world_size), timeout=timeout,
                             **kwargs)
    if launch.launcher.uses_mpi and _extension().build_info()["mpi"]:
        return mpi_rendezvous_handler(_with_query(url, rank=launch.rank, world_size=launch.world_size),
                                      timeout=timeout, **kwargs)
    raise _missing_master_error(launch, missing)
