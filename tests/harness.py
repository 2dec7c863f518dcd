"""Runs a function on N real processes joined in one process group.

Ranks are forked from a forkserver that has already imported torch and torch_ddp_lite, so a
4-rank job starts in well under a second instead of paying torch's import four times. Each rank
initialises the group through a fresh file:// store, runs ``fn(rank, world_size, *args)`` and
sends back its return value or its traceback. A rank that does not finish in time fails the
test as a hang, naming the rank.
"""

import io
import multiprocessing
import os
import queue as queue_module
import tempfile
import time
import traceback
from datetime import timedelta

_PRELOAD = ["torch", "torch.distributed", "torch_ddp_lite", "workers", "sweeps", "groups_p2p", "companions",
            "mismatch_workers", "shm_workers", "fuzz_workers", "soak_workers", "trace_workers",
            "parity_workers", "teardown_workers", "review_workers", "observability_workers", "scale_workers", "fork_workers", "shrink_workers", "departure_workers"]
_context = None


def _mp_context():
    global _context
    if _context is None:
        _context = multiprocessing.get_context("forkserver")
        _context.set_forkserver_preload(_PRELOAD)
    return _context


class RankFailed(AssertionError):
    pass


def _rank_entry(fn, rank, world_size, store_path, backend, pg_timeout_s, env, args, results):
    os.environ.update(env)
    try:
        import torch
        import torch.distributed as dist

        torch.manual_seed(1234 + rank)
        if backend is not None:
            dist.init_process_group(
                backend,
                init_method=f"file://{store_path}",
                rank=rank,
                world_size=world_size,
                timeout=timedelta(seconds=pg_timeout_s),
            )
        value = fn(rank, world_size, *args)
        # Plain bytes: tensors put on the queue directly would travel as shared-memory handles
        # that die with this process.
        buffer = io.BytesIO()
        torch.save(value, buffer)
        results.put((rank, "ok", buffer.getvalue()))
        if backend is not None and dist.is_initialized():
            dist.destroy_process_group()
    except BaseException:  # noqa: BLE001 - report everything to the parent
        results.put((rank, "error", traceback.format_exc()))


def _stacks_of(pid):
    """Every thread's native stack of a process that would not exit (gdb, where installed), so a
    teardown hang seen once in CI says where it was."""
    import shutil
    import subprocess

    if shutil.which("gdb") is None:
        return "(gdb is not installed: no stacks)"
    try:
        done = subprocess.run(["gdb", "-p", str(pid), "-batch", "-nx", "-ex", "thread apply all bt 30"],
                              capture_output=True, text=True, timeout=90)
    except subprocess.TimeoutExpired:
        return "(gdb did not answer within 90 s)"
    lines = [line for line in done.stdout.splitlines() if line.startswith(("Thread ", "#"))]
    return "\n".join(lines[-400:]) or done.stderr[-2000:]


def run_ranks(fn, world_size, *args, backend="ddplite", timeout_s=240, pg_timeout_s=120, env=None,
              may_exit=()):
    """Returns [result of rank 0, ..., result of rank N-1].

    ``may_exit``: ranks allowed to end without a result (they exit on purpose); their slot is None.
    """
    context = _mp_context()
    results = context.Queue()
    with tempfile.TemporaryDirectory(prefix="ddplite-test-") as folder:
        store_path = os.path.join(folder, "store")
        processes = [
            context.Process(
                target=_rank_entry,
                args=(fn, rank, world_size, store_path, backend, pg_timeout_s, dict(env or {}), args, results),
                daemon=True,
            )
            for rank in range(world_size)
        ]
        for process in processes:
            process.start()
        outcomes = {}
        deadline = time.monotonic() + timeout_s
        try:
            while len(outcomes) < world_size:
                waiting = [r for r in range(world_size) if r not in outcomes]
                if all(r in may_exit and not processes[r].is_alive() for r in waiting):
                    break
                try:
                    rank, status, value = results.get(timeout=0.2)
                    outcomes[rank] = (status, value)
                except queue_module.Empty:
                    pass
                if time.monotonic() > deadline:
                    raise RankFailed(f"hang: rank(s) {waiting} did not finish within {timeout_s} s")
        finally:
            stuck_stacks = {}
            for rank, process in enumerate(processes):
                process.join(timeout=10)
                if process.is_alive():
                    stuck_stacks[rank] = _stacks_of(process.pid)
                    process.kill()
                    process.join()
    errors = [f"--- rank {r} ---\n{value}" for r, (status, value) in sorted(outcomes.items()) if status == "error"]
    if not errors:
        # A rank that reported its result must then exit cleanly (destroy_process_group included).
        errors = [f"--- rank {rank} ---\nexited with code {process.exitcode} after reporting its result"
                  + (f" (it did not exit within 10 s; its threads then:\n{stuck_stacks[rank]})" if rank in stuck_stacks else "")
                  for rank, process in enumerate(processes) if rank not in may_exit and process.exitcode != 0]
    if errors:
        raise RankFailed("\n".join(errors))
    import torch

    return [torch.load(io.BytesIO(outcomes[rank][1]), weights_only=False) if rank in outcomes else None
            for rank in range(world_size)]


_REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def mpirun_environment(**extra):
    """What our scripts set for Open MPI: root is allowed (CI containers run as root), more ranks
    than cores, no cross-memory attach (refused in containers), one thread per rank."""
    env = dict(os.environ)
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "DDPLITE_CPU_TRANSPORT"):
        env.pop(name, None)
    env.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1", OMPI_MCA_rmaps_base_oversubscribe="1",
               OMPI_MCA_btl_vader_single_copy_mechanism="none", OMP_NUM_THREADS="1",
               PYTHONPATH=os.pathsep.join(filter(None, [_REPO, env.get("PYTHONPATH")])))
    env.update(extra)
    return env
