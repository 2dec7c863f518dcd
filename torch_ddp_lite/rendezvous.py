"""Rendezvous for launchers that are not torchrun: ``mpi://``, and env:// under mpirun or Slurm.

``init_method="mpi://"`` (registered by the ``ddplite`` entry point, so a stock script needs no
import): rank and world size come from MPI; rank 0 starts a c10d TCPStore on MASTER_PORT if set
(for the status query), else on a free port, and ``MPI_Bcast`` tells the other ranks where it
is. Nothing else need be set::

    mpirun -np 4 python train.py        # dist.init_process_group("ddplite", init_method="mpi://")

``env://`` (torch's default) is torch's own for every backend but ddplite, and for ddplite too
whenever RANK and WORLD_SIZE are set. For a ddplite group without them, the rank and world size
come from the launcher that started the process:

* mpirun (Open MPI's OMPI_COMM_WORLD_*, MPICH's PMI_*): the store at MASTER_ADDR:MASTER_PORT if
  set, else (MPI compiled in) found through MPI as for ``mpi://``;
* a Slurm job step (``srun``: SLURM_PROCID, SLURM_STEP_NUM_TASKS, SLURM_LOCALID): the store at
  MASTER_ADDR:MASTER_PORT if set, else on the step's first node (SLURM_STEP_NODELIST) at port
  slurm_port() (from SLURM_JOB_ID and SLURM_STEP_ID), task 0 checking it runs there;
* a Slurm batch script's own process (SLURM_JOB_ID but no SLURM_STEP_ID) with more than one task
  in the job fails at once: its tasks were never started (the script lacks ``srun``).

Which backend asks is read from the ``init_process_group`` call being served, before this module
is imported (``_ddplite_autoload._serves_ddplite``); a direct ``dist.rendezvous("env://")`` is
torch's.
"""

import datetime
import os
import re
import socket
import sys
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
    size_fallback: str = ""  # read when `size` is not set


OPEN_MPI = LauncherVariables("Open MPI's mpirun", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE",
                             "OMPI_COMM_WORLD_LOCAL_RANK", True)
PMI = LauncherVariables("MPICH / Intel MPI (PMI)", "PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", True)
# Inside a job step: the step's tasks (SLURM_NTASKS is the job's where a step runs on part of it).
SLURM = LauncherVariables("Slurm (srun)", "SLURM_PROCID", "SLURM_STEP_NUM_TASKS", "SLURM_LOCALID", False,
                          size_fallback="SLURM_NTASKS")
# In this order: an MPI launcher inside a Slurm allocation starts its processes through srun, which
# leaves them the SLURM_* variables of its own daemons' step.
LAUNCHERS = (OPEN_MPI, PMI, SLURM)


@dataclass(frozen=True)
class LauncherRank:
    launcher: LauncherVariables
    rank: int
    world_size: int
    local_rank: int
    size_variable: str  # where world_size came from


def _slurms_own_pmi(env):
    """srun --mpi=pmi2 sets PMI_RANK/PMI_SIZE itself, PMI_SIZE equal to the step's task count:
    Slurm started the process, not an MPI launcher (whose MPI may lack Slurm's PMI: Debian's Open
    MPI). The same answer on every rank of a launch (no rank-dependent comparison)."""
    return "SLURM_STEP_ID" in env and env.get("PMI_SIZE") == env.get("SLURM_STEP_NUM_TASKS")


def launcher_rank(env=None):
    """The rank an MPI launcher or a Slurm job step describes in the environment, or None."""
    env = os.environ if env is None else env
    for launcher in LAUNCHERS:
        size_variable = launcher.size if launcher.size in env else launcher.size_fallback
        if launcher.rank not in env or size_variable not in env:
            continue
        if launcher is PMI and _slurms_own_pmi(env):
            continue
        return LauncherRank(launcher, int(env[launcher.rank]), int(env[size_variable]),
                            int(env.get(launcher.local_rank, 0)), size_variable)
    return None


def slurm_batch_without_srun(env=None):
    """What is wrong with a Slurm batch script's own process in a job of several tasks
    (SLURM_JOB_ID and SLURM_NTASKS > 1, but no SLURM_STEP_ID: no srun started the tasks, so no
    peer will come), with the hint; None for any other process. torch's env:// would wait for the
    peers until the timeout."""
    env = os.environ if env is None else env
    if "SLURM_JOB_ID" not in env or "SLURM_STEP_ID" in env or int(env.get("SLURM_NTASKS", "1")) <= 1:
        return None
    if "OMPI_COMM_WORLD_RANK" in env or "PMI_RANK" in env:  # mpirun's ranks on the batch node itself
        return None
    tasks = env["SLURM_NTASKS"]
    return (
        f"this process is Slurm job {env['SLURM_JOB_ID']}'s batch script "
        f"(SLURM_NTASKS={tasks}, no SLURM_STEP_ID), not one of its {tasks} tasks: nothing started the "
        f"others, so rank {env.get('SLURM_PROCID', '0')} of {tasks} would wait for them until the timeout.\n"
        "Hint: start the tasks with srun (srun python train.py), or one torchrun per node "
        "(srun --ntasks-per-node=1 torchrun --nnodes=$SLURM_NNODES --nproc-per-node=N ...)")


def first_slurm_host(nodelist):
    """The first host of a Slurm host list ("node[01-04,07],gpu5" -> "node01";
    "rack[1-2]-n[3-4]" -> "rack1-n3"), as `scontrol show hostnames` would print it first."""
    first, depth = "", 0
    for character in nodelist.strip():  # the first comma-separated entry, commas in brackets kept
        depth += {"[": 1, "]": -1}.get(character, 0)
        if character == "," and depth == 0:
            break
        first += character
    # each bracket: its first range's start, zero padding kept ("[01-04]" -> "01")
    return re.sub(r"\[([^\]\-,]+)[^\]]*\]", lambda match: match.group(1), first)


SLURM_PORT_BASE = 10000  # ports 10000-29999: below Linux's ephemeral range (32768 and up)


def slurm_port(job_id, step_id):
    """The store's port of a job step: 10000 + (32 x SLURM_JOB_ID + SLURM_STEP_ID) mod 20000, so the
    steps of one job (up to 32 at once) and jobs whose ids are near each other do not meet."""
    return SLURM_PORT_BASE + (32 * int(job_id) + int(step_id)) % 20000


def slurm_store_address(env=None):
    """(host, port, how) of the store of a Slurm job step's ranks: MASTER_ADDR and MASTER_PORT
    where set; else the step's first node (SLURM_STEP_NODELIST, the job's where that is unset),
    which runs task 0 under srun's block and cyclic distributions, and slurm_port(). None when
    neither a host nor a job id is known."""
    env = os.environ if env is None else env
    nodes = next((env[name] for name in ("SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "SLURM_NODELIST")
                  if env.get(name)), "")
    given_host = env.get("MASTER_ADDR", "").strip("[]")
    host = given_host or (first_slurm_host(nodes) if nodes else "")
    known_ids = env.get("SLURM_JOB_ID", "").isdigit() and env.get("SLURM_STEP_ID", "0").isdigit()
    port = env.get("MASTER_PORT") or (str(slurm_port(env["SLURM_JOB_ID"], env.get("SLURM_STEP_ID", "0")))
                                      if known_ids else "")
    if not host or not port:
        return None
    how = ("MASTER_ADDR" if given_host else f"the step's first node ({nodes})") + ", " + \
        ("MASTER_PORT" if env.get("MASTER_PORT") else "from SLURM_JOB_ID and SLURM_STEP_ID")
    return host, int(port), how


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
    """Rank 0 hosts a TCPStore on MASTER_PORT if set (so that ``python -m torch_ddp_lite.status``
    can be pointed at it), else on a free port; MPI_Bcast carries 'hostname address port'."""
    extension = _extension()
    store = None
    if rank == 0:
        address, _ = extension.listen_address()
        port = int(os.environ.get("MASTER_PORT") or 0)
        store = dist.TCPStore("127.0.0.1", port, size, True, timeout, wait_for_workers=False, multi_tenant=True)
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


def _check_against_launcher(launch, rank, world_size):
    """A rank or world size given (init_process_group's arguments, RANK or WORLD_SIZE) must agree
    with the launcher's."""
    for name, given, launchers in (("rank", rank, launch.rank), ("world_size", world_size, launch.world_size)):
        if given not in (None, "", "-1") and int(given) != launchers:
            raise ValueError(
                f"ddplite env:// rendezvous: {name}={given} was given, but {launch.launcher.launcher} says "
                f"{launchers} (rank {launch.rank} of {launch.world_size} from {launch.launcher.rank}/"
                f"{launch.size_variable}).\nHint: leave rank and world_size out under a launcher: it provides them")


def _with_query(url, **values):
    parts = urllib.parse.urlparse(url)
    query = dict(urllib.parse.parse_qsl(parts.query))
    query.update({key: str(value) for key, value in values.items()})
    return urllib.parse.urlunparse(parts._replace(query=urllib.parse.urlencode(query)))


def _missing_master_error(launch, missing):
    hint = {
        True: "export MASTER_ADDR=<rank 0's host> MASTER_PORT=29500 in the job, or use "
              "init_method='mpi://' (ddplite built with MPI), which needs neither",
        False: "run the tasks with srun, which sets SLURM_STEP_NODELIST and SLURM_JOB_ID, or export "
               "MASTER_ADDR=<task 0's host> MASTER_PORT=<a free port> before srun",
    }[launch.launcher.uses_mpi]
    return ValueError(
        f"ddplite env:// rendezvous: launched by {launch.launcher.launcher} (rank {launch.rank} of "
        f"{launch.world_size} from {launch.launcher.rank}/{launch.size_variable}), but "
        f"{' and '.join(missing)} {'is' if len(missing) == 1 else 'are'} not set, and torch's env:// needs "
        f"{'it' if len(missing) == 1 else 'them'} to find the store.\nHint: {hint}")


def _info(message):
    """A line in the C++ side's format, at DDPLITE_DEBUG=INFO and above (common/logging.hpp)."""
    if os.environ.get("DDPLITE_DEBUG", "WARN").upper() in ("INFO", "TRACE", "DETAIL"):
        print(f"[ddplite {os.getpid()}] INFO {message}", file=sys.stderr, flush=True)


def _torch_handler(scheme):
    return sys.modules["torch.distributed.rendezvous"]._rendezvous_handlers[scheme]


def env_rendezvous_handler(torch_handler, url, timeout=DEFAULT_TIMEOUT, **kwargs):
    """torch's env:// handler; for a ddplite group, extended to MPI launchers' and Slurm's
    variables (the module's docstring). Every other backend gets torch's own, untouched."""
    query = _query(url)
    env = os.environ
    has_rank = "rank" in query or "RANK" in env
    has_size = "world_size" in query or "WORLD_SIZE" in env
    if has_rank and has_size:  # (_ddplite_autoload sends other backends' groups to torch's handler)
        return torch_handler(url, timeout=timeout, **kwargs)
    batch_script = slurm_batch_without_srun(env)
    if batch_script is not None:
        raise ValueError(f"ddplite env:// rendezvous: {batch_script}")
    launch = launcher_rank(env)
    if launch is None:
        return torch_handler(url, timeout=timeout, **kwargs)
    _check_against_launcher(launch, query.get("rank", env.get("RANK")), query.get("world_size", env.get("WORLD_SIZE")))
    ranked = {"rank": launch.rank, "world_size": launch.world_size}
    missing = [name for name in ("MASTER_ADDR", "MASTER_PORT") if name not in env]
    if not missing:
        return torch_handler(_with_query(url, **ranked), timeout=timeout, **kwargs)
    if launch.launcher.uses_mpi and _extension().build_info()["mpi"]:
        return mpi_rendezvous_handler(_with_query(url, **ranked), timeout=timeout, **kwargs)
    store = slurm_store_address(env) if launch.launcher is SLURM else None
    if store is None:
        raise _missing_master_error(launch, missing)
    host, port, how = store
    node = env.get("SLURMD_NODENAME")
    if launch.rank == 0 and not env.get("MASTER_ADDR") and node and node != host:
        raise ValueError(
            f"ddplite env:// rendezvous: task 0 of this Slurm step runs on {node}, not on the step's first node "
            f"{host}, where its store would be (a distribution other than block or cyclic?).\nHint: export "
            f"MASTER_ADDR=<task 0's node> (and MASTER_PORT) in the batch script before srun")
    _info(f"rank {launch.rank}/{launch.world_size} from {launch.launcher.launcher} ({launch.launcher.rank}/"
          f"{launch.size_variable}); the store at {host}:{port} ({how})")
    tcp_url = _with_query(f"tcp://{f'[{host}]' if ':' in host else host}:{port}", **dict(query, **ranked))
    return _torch_handler("tcp")(tcp_url, timeout=timeout, **kwargs)
