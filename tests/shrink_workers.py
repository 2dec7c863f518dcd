"""Rank bodies for tests/test_shrink.py: a rank dies (or hangs), the others shrink the group."""

import os
import signal
import time

import torch
import torch.distributed as dist

import torch_ddp_lite


def _fail(rank, victim, how):
    """The victim dies (SIGKILL) or hangs (SIGSTOP) here; others return at once."""
    if rank == victim:
        os.kill(os.getpid(), signal.SIGKILL if how == "kill" else signal.SIGSTOP)


def _victim_dies_and_is_seen(rank, victim):
    """After a working round, `victim` SIGKILLs itself; the others meet its death in an all_reduce."""
    dist.all_reduce(torch.ones(4))
    dist.barrier()
    if rank == victim:
        os.kill(os.getpid(), signal.SIGKILL)
    try:
        dist.all_reduce(torch.ones(10))
    except Exception:  # noqa: BLE001 - the death is what the callers go on from
        pass


def _check_group(old_ranks):
    """A collective round on the (new) default group; returns what every rank can check in closed form."""
    tensor = torch.full((1001,), float(old_ranks[dist.get_rank()] + 1))
    dist.all_reduce(tensor)
    gathered = [torch.zeros(3) for _ in range(dist.get_world_size())]
    dist.all_gather(gathered, torch.full((3,), float(dist.get_rank())))
    root = torch.arange(5.0) * (dist.get_rank() + 1)
    dist.broadcast(root, src=dist.get_world_size() - 1)
    return {"sum": tensor[0].item(), "gathered": [g[0].item() for g in gathered], "broadcast": root}


def shrink_after_failures(rank, world_size, victims, how, flags):
    """Each victim in turn fails; the survivors see the failure (a kill: DistBackendError naming
    it; a hang: at the group's timeout), shrink the default group without it and run a collective
    round on the new one. Returns, per shrink, what the survivor saw and the new group's values."""
    old_ranks = list(range(world_size))  # global rank of each rank of the current default group
    pids = [None] * world_size
    dist.all_gather_object(pids, os.getpid())
    dist.all_reduce(torch.ones(4))
    rounds = []
    for victim in victims:  # victims: global ranks
        dist.barrier()
        _fail(rank, victim, how)
        started = time.monotonic()
        try:
            dist.all_reduce(torch.ones(1000))
            error = None
        except Exception as failure:  # noqa: BLE001
            error = (type(failure).__name__, str(failure))
        noticed = time.monotonic() - started
        failed = torch_ddp_lite.failed_ranks(wait=2.0)  # ranks of the current group, agreed by every survivor
        agreed = time.monotonic() - started
        expected = [old_ranks.index(victim)]
        dist.shrink_group(failed, shrink_flags=flags)
        old_ranks.remove(victim)
        values = _check_group(old_ranks)
        if how == "stop" and rank == old_ranks[0]:
            os.kill(pids[victim], signal.SIGKILL)  # the stopped rank would otherwise outlive the test
        rounds.append({"error": error, "noticed": noticed, "failed": failed, "expected": expected, "agreed": agreed,
                       "recovered": time.monotonic() - started, "rank": dist.get_rank(),
                       "size": dist.get_world_size(), **values})
    return rounds


def shrink_with_disagreeing_lists(rank, world_size):
    """Rank 3 dies; ranks 0 and 1 exclude [3], rank 2 excludes [1, 3]. Every survivor must raise."""
    _victim_dies_and_is_seen(rank, 3)
    started = time.monotonic()
    try:
        dist.shrink_group([1, 3] if rank == 2 else [3])
        return {"raised": None}
    except Exception as error:  # noqa: BLE001
        return {"raised": type(error).__name__, "message": str(error), "seconds": time.monotonic() - started}


def failed_ranks_when_all_live_and_with_a_late_caller(rank, world_size):
    """Round 1: every rank calls at once: nobody failed. Round 2: the last rank calls 4.5 s late while
    the others wait at most 2 s: they agree it failed, and it raises when it calls."""
    everyone = torch_ddp_lite.failed_ranks(wait=5.0)
    late = world_size - 1
    if rank == late:
        time.sleep(4.5)
    try:
        second = torch_ddp_lite.failed_ranks(wait=2.0)
    except Exception as error:  # noqa: BLE001
        second = (type(error).__name__, str(error))
    return {"everyone": everyone, "second": second}


def shrink_a_subgroup(rank, world_size):
    """A subgroup of ranks 0-2 of 4 loses rank 2; ranks 0 and 1 shrink that subgroup (the default
    group is left alone) and run an all_reduce on the result."""
    sub = dist.new_group([0, 1, 2])
    if rank == 3:
        return None
    dist.all_reduce(torch.ones(4), group=sub)
    dist.barrier(group=sub)
    if rank == 2:
        os.kill(os.getpid(), signal.SIGKILL)
    try:
        dist.all_reduce(torch.ones(10), group=sub)
    except Exception:  # noqa: BLE001
        pass
    failed = torch_ddp_lite.failed_ranks(group=sub)
    pair = dist.shrink_group(failed, group=sub)
    tensor = torch.full((5,), float(rank + 1))
    dist.all_reduce(tensor, group=pair)
    return {"failed": failed, "size": pair.size(), "rank": pair.rank(), "sum": tensor.tolist()}


def excluded_rank_calls_shrink(rank, world_size):
    """The last rank is late (4.5 s, as if stuck): the others agree it failed, shrink without it and
    run a collective round; then the late rank calls shrink_group itself, as a rank that does not
    know it was excluded would (it blames rank 0). It must raise, never hang nor join the
    survivors' group."""
    late = world_size - 1
    if rank == late:
        time.sleep(4.5)
        started = time.monotonic()
        try:
            dist.shrink_group([0])
            return {"raised": None}
        except Exception as error:  # noqa: BLE001
            return {"raised": type(error).__name__, "message": str(error), "seconds": time.monotonic() - started}
    failed = torch_ddp_lite.failed_ranks(wait=2.0)
    dist.shrink_group(failed)
    return dict(_check_group(list(range(world_size - 1))), failed=failed, size=dist.get_world_size())


def shrink_with_a_late_survivor(rank, world_size, timeout_s):
    """Rank 2 of 3 dies; rank 0 shrinks at once, rank 1 only the group's timeout + 2 s later. Rank
    0 gives up on rank 1 at the timeout, so shrink #1 is abandoned; rank 1 must raise at once,
    naming that decision, not build a group nobody joins. Both then shrink again (#2, the same
    number on both) and the new group must work."""
    _victim_dies_and_is_seen(rank, 2)
    if rank == 1:
        time.sleep(timeout_s + 2)
    started = time.monotonic()
    try:
        dist.shrink_group([2])
        first = {"raised": None}
    except Exception as error:  # noqa: BLE001
        first = {"raised": type(error).__name__, "message": str(error), "seconds": time.monotonic() - started}
    if rank == 0:
        time.sleep(2.5)  # rank 1 is still on its way to its first try; meet it in the second
    dist.shrink_group([2])
    return {"first": first, "rank": dist.get_rank(), "size": dist.get_world_size(), **_check_group([0, 1])}


def shrink_while_an_excluded_live_rank_disagrees(rank, world_size):
    """4 ranks: rank 3 dies; ranks 0 and 1 exclude [2, 3] (rank 2 is slow, say), while rank 2,
    alive, excludes [3] only and calls first (then rank 0, then rank 1). Rank 2 raises: the others
    declared it failed. The survivors' shrink must go through all the same: an excluded rank
    decides nothing for them."""
    _victim_dies_and_is_seen(rank, 3)
    time.sleep({2: 0.0, 0: 0.3, 1: 0.8}[rank])
    try:
        dist.shrink_group([3] if rank == 2 else [2, 3])
    except Exception as error:  # noqa: BLE001
        return {"raised": type(error).__name__, "message": str(error)}
    return {"raised": None, "rank": dist.get_rank(), "size": dist.get_world_size(), **_check_group([0, 1])}
