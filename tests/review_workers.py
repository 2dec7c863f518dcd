"""Rank functions for tests/test_shm_review.py: the defects a review of the shared-memory path
found, each driven to the state that exposed it."""

import os
import tempfile
import time

import torch
import torch.distributed as dist


def _outcome(call):
    try:
        call()
        return ("ok", "")
    except Exception as error:  # noqa: BLE001 - the type and text are the result
        return (type(error).__name__, str(error))


def abandoned_step(rank, world_size):
    """DDPLITE_TEST_HOOKS=shm_fault=1:2: rank 1 throws right after it posts the first step of
    collective #2, a large all_reduce (the reduce-scatter/allgather steps). Every rank must
    raise (none may return a sum made of rank 1's unreduced slice), the peers within seconds,
    and the group must stay failed on every rank."""
    warm = torch.ones(4)
    dist.all_reduce(warm)  # collective #1
    big = torch.full((100_000,), float(rank + 1))
    start = time.monotonic()
    first = _outcome(lambda: dist.all_reduce(big))  # collective #2
    seconds = time.monotonic() - start
    expected = float(world_size * (world_size + 1) // 2)
    after = _outcome(lambda: dist.all_reduce(torch.ones(4)))
    return {"first": first, "seconds": seconds, "after": after,
            "wrong_sum": first[0] == "ok" and not bool((big == expected).all())}


def broadcasts_across_the_wrap(rank, world_size):
    """DDPLITE_TEST_HOOKS=shm_first_step=4294967290: the step counter wraps to 0 a few steps in.
    Broadcasts from one root (whose posts check is deferred) and all_reduces across the wrap must
    all be right; a deferred check lost at step 0 leaves the root's step unconsumed, and the
    peers then time out."""
    wrong = []
    for i in range(14):
        tensor = torch.full((5,), float(rank * 100 + i))
        dist.broadcast(tensor, src=0)
        if tensor.tolist() != [float(i)] * 5:
            wrong.append(("broadcast", i, tensor.tolist()))
        if i % 3 == 0:
            total = torch.full((3,), float(rank + i))
            dist.all_reduce(total)
            if total.tolist() != [float(sum(r + i for r in range(world_size)))] * 3:
                wrong.append(("all_reduce", i, total.tolist()))
    big = torch.full((300_000,), float(rank + 1))  # several steps at once
    dist.all_reduce(big)
    if not bool((big == world_size * (world_size + 1) / 2).all()):
        wrong.append(("big all_reduce",))
    return wrong


def _stderr_of(call):
    """Runs `call` with file descriptor 2 sent to a file; returns what was written there."""
    with tempfile.TemporaryFile(mode="w+") as capture:
        saved = os.dup(2)
        os.dup2(capture.fileno(), 2)
        try:
            call()
        finally:
            os.dup2(saved, 2)
            os.close(saved)
        capture.seek(0)
        return capture.read()


def broadcast_as_last_op(rank, world_size):
    """Rank 1 broadcasts (as root) as its last op while rank 0 runs an all_reduce: rank 0 raises
    the mismatch; rank 1's broadcast returns (its check of the others is deferred), and its
    destroy_process_group must then say what the check finds, naming rank 0."""
    tensor = torch.ones(8)
    if rank == 1:
        result = _outcome(lambda: dist.broadcast(tensor, src=1))
        time.sleep(1.0)  # rank 0 has posted its all_reduce by now
    else:
        time.sleep(0.3)  # rank 1's broadcast comes first, so its check is deferred
        result = _outcome(lambda: dist.all_reduce(tensor))
        time.sleep(1.5)  # rank 1 settles its check against this rank's post before it goes
    stderr = _stderr_of(dist.destroy_process_group)
    return {"result": result, "stderr": stderr}


def second_root(rank, world_size):
    """3 ranks: ranks 0 and 1 broadcast from root 0, rank 2 from root 2 (it believes itself root).
    Rank 1 got root 0's data; it must still learn of rank 2's disagreement, at its next op at the
    latest, and raise a mismatch naming rank 2."""
    tensor = torch.full((6,), float(rank))
    first = _outcome(lambda: dist.broadcast(tensor, src=2 if rank == 2 else 0))
    time.sleep(0.5)
    second = _outcome(lambda: dist.all_reduce(torch.ones(3)))
    return {"first": first, "second": second}


def refused_then_late_leader(rank, world_size, late_rank):
    """Every rank refuses one call (ValueError, the same on all), then `late_rank` (a host's
    leader) enters the next all_reduce late: the other leader's first TCP message for it is
    already waiting on its socket. That is no mismatch: the all_reduce must give the sum."""
    # ddplite refuses it (sparse all_reduce is SUM only) and still numbers it, on every rank
    refused = _outcome(lambda: dist.all_reduce(torch.ones(3).to_sparse(), op=dist.ReduceOp.MAX))
    if rank == late_rank:
        time.sleep(0.5)
    total = torch.full((1000,), float(rank + 1))
    result = _outcome(lambda: dist.all_reduce(total))
    return {"refused": refused, "result": result,
            "right": bool((total == world_size * (world_size + 1) / 2).all())}


def job_with_key_file(rank, world_size, store_path, key_files, timeout_s=20):
    """Joins a ddplite group with DDPLITE_AUTH_KEY_FILE=key_files[rank] (None: unset) through
    the file store at `store_path` (the group's timeout: timeout_s), runs an all_reduce; returns
    the outcome and the store's bytes (and, on an error, the seconds it took to come)."""
    from datetime import timedelta

    if key_files[rank] is None:
        os.environ.pop("DDPLITE_AUTH_KEY_FILE", None)
    else:
        os.environ["DDPLITE_AUTH_KEY_FILE"] = key_files[rank]
    import time

    outcome = {}
    started = time.monotonic()
    try:
        dist.init_process_group("ddplite", init_method=f"file://{store_path}", rank=rank, world_size=world_size,
                                timeout=timedelta(seconds=timeout_s))
        total = torch.full((5,), float(rank + 1))
        dist.all_reduce(total)
        outcome["sum"] = total.tolist()
        with open(store_path, "rb") as store:
            outcome["store"] = store.read()
        dist.barrier()
        dist.destroy_process_group()
    except Exception as error:  # noqa: BLE001 - the type and text are the result
        outcome["error"] = (type(error).__name__, str(error))
        outcome["failed_after_s"] = time.monotonic() - started
    return outcome


def plain_allreduce(rank, world_size):
    """An all_reduce of rank + 1 on the group's path; returns (path, the sum)."""
    import torch_ddp_lite

    tensor = torch.full((5,), float(rank + 1))
    dist.all_reduce(tensor)
    return torch_ddp_lite.cpu_path()[0], tensor[0].item()
