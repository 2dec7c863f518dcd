"""Rank-side code for tests/test_scale.py (issue 27: per-rank costs that do not grow)."""

import gc
import os
import resource
import time
from datetime import timedelta

import torch
import torch.distributed as dist


def _threads_and_fds():
    return len(os.listdir("/proc/self/task")), len(os.listdir("/proc/self/fd"))


def group_rounds(rank, world_size, rounds):
    """`rounds` times: a new group of every rank, an all_reduce and a send/recv ring on it, and its
    destruction. Returns the (threads, fds) before the first round and after every round."""
    before = _threads_and_fds()
    after = []
    for round_ in range(rounds):
        group = dist.new_group(list(range(world_size)))
        total = torch.full((4,), float(rank))
        dist.all_reduce(total, group=group)
        assert total.tolist() == [float(sum(range(world_size)))] * 4, total
        if world_size > 1:
            got = torch.zeros(3)
            send = dist.isend(torch.full((3,), float(rank + round_)), (rank + 1) % world_size, group=group)
            dist.recv(got, (rank - 1) % world_size, group=group)
            send.wait()
            assert got.tolist() == [float((rank - 1) % world_size + round_)] * 3, got
        dist.destroy_process_group(group)
        del group, total  # the last Python references: the group's backend ends with them
        if world_size > 1:
            del send, got
        gc.collect()
        after.append(_threads_and_fds())
    return {"before": before, "after": after}


def descriptors_run_out(rank, world_size, store_path, victim, headroom):
    """`victim` lowers its descriptor limit to what it has open plus `headroom` before
    init_process_group (group timeout 20 s). Returns init's outcome and how long it took."""
    if rank == victim:
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        resource.setrlimit(resource.RLIMIT_NOFILE, (len(os.listdir("/proc/self/fd")) + headroom, hard))
    start = time.monotonic()
    try:
        dist.init_process_group("ddplite", init_method=f"file://{store_path}", rank=rank, world_size=world_size,
                                timeout=timedelta(seconds=20))
        dist.all_reduce(torch.ones(1))
        outcome = {"type": None, "message": ""}
    except Exception as error:  # noqa: BLE001
        outcome = {"type": type(error).__name__, "message": str(error)}
    outcome["seconds"] = time.monotonic() - start
    return outcome
