"""One rank of an mpirun job started by test_mpi.py: ``mpirun -np N python tests/mpi_job.py MODE OUT``.

Every rank writes its result to OUT/rank<R>.pt (torch.save), which the test compares.
  sweeps  mpi:// rendezvous; the set-up broadcast; every quick collective sweep (sweeps.py:
          closed form and gloo on identical inputs) on the transport DDPLITE_CPU_TRANSPORT picks,
          then again on the dtypes gloo refuses (closed form only)
  ddp     DDP through ddplite over mpi://, then again through gloo over mpi:// (the oracle)
  env     init_process_group("ddplite") with env:// and no MASTER_ADDR/RANK: found through MPI
  groups  overlapping subgroups and new_subgroups with async ops in flight (groups_p2p.py)
  stall   rank 1 skips an all_reduce: rank 0 must fail within the group's timeout, not hang
  mismatch  the ranks disagree (a gather refused on the root, then all_reduce against broadcast):
          every rank must raise, none may return a value (mismatch_workers.py)
  health  DDP with the last rank 30% slower per step: torch_ddp_lite.stragglers() on every rank,
          and the live status query (python -m torch_ddp_lite.status at rank 0's mpi:// store)
          while the other ranks wait in a barrier (straggler_workers.py)
  parity  the calls gloo serves that ddplite once refused (parity_workers.py: all_gather_coalesced,
          coalescing, sparse all_reduce, split_group, monitored_barrier with a rank that never
          arrives), as tests/test_parity.py runs them, under mpirun
"""

import datetime
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

import groups_p2p  # noqa: E402
import mismatch_workers  # noqa: E402
import parity_workers  # noqa: E402
import sweeps  # noqa: E402
import torch_ddp_lite  # noqa: E402
import workers  # noqa: E402


def cpu_backend():
    return dist.group.WORLD._get_backend(torch.device("cpu"))


def group_facts():
    extension = torch_ddp_lite._load_extension()
    transport, bootstrap = extension.group_transport(cpu_backend())
    blob = f"set-up blob from rank 0 of {dist.get_world_size()}".encode() if dist.get_rank() == 0 else b""
    shared = extension.bootstrap_broadcast(cpu_backend(), "test", blob, 0)
    return {"transport": transport, "bootstrap": bootstrap, "shared": shared.decode()}


def run_sweeps(rank, size):
    dist.init_process_group("ddplite", init_method="mpi://")
    result = {"rank": dist.get_rank(), "size": dist.get_world_size(), **group_facts(), "sweeps": {}}
    for name, sweep in sweeps.SWEEPS.items():
        result["sweeps"][name] = sweep(rank, size, sweeps.QUICK_COUNTS)
    result["extra dtypes"] = sweeps.sweep_extra_dtypes(rank, size, sweeps.QUICK_COUNTS)
    return result


def run_ddp(rank, size):
    dist.init_process_group("ddplite", init_method="mpi://")
    facts = group_facts()
    ddplite = workers.ddp_train(rank, size, steps=8)
    dist.destroy_process_group()
    dist.init_process_group("gloo", init_method="mpi://")
    gloo = workers.ddp_train(rank, size, steps=8)
    return {**facts, "ddplite": ddplite, "gloo": gloo}


def run_env(rank, size):
    assert "MASTER_ADDR" not in os.environ and "RANK" not in os.environ
    dist.init_process_group("ddplite")  # env://, torch's default
    tensor = torch.full((5,), float(dist.get_rank() + 1))
    dist.all_reduce(tensor)
    return {"rank": dist.get_rank(), "size": dist.get_world_size(), **group_facts(), "sum": tensor}


def run_groups(rank, size):
    dist.init_process_group("ddplite", init_method="mpi://")
    subgroup = dist.new_group(list(range(1, size)))
    facts = {}
    if rank >= 1:
        transport, bootstrap = torch_ddp_lite._load_extension().group_transport(
            subgroup._get_backend(torch.device("cpu")))
        facts = {"subgroup transport": transport, "subgroup bootstrap": bootstrap}
    return {**facts, "failures": groups_p2p.overlapping_groups(rank, size)}


def run_stall(rank, size):
    dist.init_process_group("ddplite", init_method="mpi://", timeout=datetime.timedelta(seconds=5))
    dist.all_reduce(torch.ones(4))
    result = {"raised": None}
    if rank != 1:
        start = time.monotonic()
        try:
            dist.all_reduce(torch.ones(4))
        except Exception as error:  # noqa: BLE001
            result = {"raised": type(error).__name__, "message": str(error)}
        result["seconds"] = time.monotonic() - start
    return result


def every_rank_arrives(size):
    """A barrier over MPI_COMM_WORLD (the group itself is broken here): each rank in turn is the
    root of a broadcast, so none returns before all have called it."""
    for root in range(size):
        torch_ddp_lite._load_extension().mpi_broadcast_world(b"", root)


def run_mismatch(rank, size):
    dist.init_process_group("ddplite", init_method="mpi://", timeout=datetime.timedelta(seconds=30))
    result = {"gather": mismatch_workers.gather_one_short(rank, size)}
    # No rank tears the group down (and with it rank 0's store, where the first failure is
    # recorded) while a peer still runs its steps.
    every_rank_arrives(size)
    dist.destroy_process_group()  # the group is unusable now; a fresh one for the second case
    dist.init_process_group("ddplite", init_method="mpi://", timeout=datetime.timedelta(seconds=30))
    result["broadcast"] = mismatch_workers.allreduce_against_broadcast(rank, size)
    every_rank_arrives(size)
    return result


def run_parity(rank, size):
    dist.init_process_group("ddplite", init_method="mpi://", timeout=datetime.timedelta(seconds=60))
    splits = [[list(range(size))], [[r] for r in range(size)]]
    missing = {size - 1} if size > 1 else set()
    return {**group_facts(),
            "all_gather_coalesced": parity_workers.all_gather_coalesced(rank, size),
            "coalescing": parity_workers.coalescing(rank, size),
            "sparse": parity_workers.sparse_all_reduce(rank, size, "ddplite"),
            "split": parity_workers.split_group(rank, size, "ddplite", splits),
            "monitored": parity_workers.monitored_barrier(rank, size, "ddplite", missing, False, 1.0, 3.0)}


def run_health(rank, size):
    import json
    import subprocess

    import straggler_workers

    dist.init_process_group("ddplite", init_method="mpi://", timeout=datetime.timedelta(seconds=120))
    straggler_workers._train(rank, size - 1, 30, straggler_workers.STEP_S, 1.3)
    table = torch_ddp_lite.stragglers()
    result = {**group_facts(), "rows": [tuple(row) for row in table], "text": str(table)}
    if rank == 0:  # the others wait in the barrier meanwhile
        from torch_ddp_lite import status

        port = int(os.environ["MASTER_PORT"])  # where the mpi:// store listens when it is set
        time.sleep(1.0)  # the others wait in the barrier longer than --stall-after before the tool asks
        asked = subprocess.run([sys.executable, "-m", "torch_ddp_lite.status", f"127.0.0.1:{port}", "--json",
                                "--stall-after", "0.5"], capture_output=True, text=True, timeout=120)
        result["status"] = {"code": asked.returncode, "stderr": asked.stderr,
                            "port": status.root_store(dist.distributed_c10d._get_default_store()).port,
                            "report": json.loads(asked.stdout) if asked.returncode == 0 else None}
    dist.barrier()
    return result


MODES = {"health": run_health, "parity": run_parity, "sweeps": run_sweeps, "ddp": run_ddp, "env": run_env, "groups": run_groups, "stall": run_stall,
         "mismatch": run_mismatch}


def main():
    mode, out_dir = sys.argv[1], sys.argv[2]
    rank = int(os.environ["OMPI_COMM_WORLD_RANK"])
    size = int(os.environ["OMPI_COMM_WORLD_SIZE"])
    torch.manual_seed(1234 + rank)
    result = MODES[mode](rank, size)
    torch.save(result, os.path.join(out_dir, f"rank{rank}.pt"))
    if mode not in ("stall", "mismatch") and dist.is_initialized():
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
