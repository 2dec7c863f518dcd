"""Rank bodies for tests/test_departure.py: a live rank leaves a group (abort(), a failure it saw,
destroy) while its peers wait for it, and every peer must raise naming it within seconds, however
the pairs connect. Each scenario runs on a fresh ddplite group of every rank (new_group); the
default group only keeps the scenarios in step."""

import time

import torch
import torch.distributed as dist

# The victims stay alive this long after they left: their process and their sockets' ends must not
# be what tells the peers (that is the point of these tests), so nothing may end before the peers raised.
STAY_ALIVE_S = 4.0
SETTLE_S = 1.0  # how long the others are given to be waiting inside the op before the victim leaves


def _outcome(call):
    start = time.time()
    try:
        call()
        return {"raised": None, "at": time.time(), "seconds": time.time() - start}
    except Exception as error:  # noqa: BLE001 - the outcome is the result
        return {"raised": type(error).__name__, "message": str(error), "at": time.time(),
                "seconds": time.time() - start}


def _abort_while_peers_wait(rank, world_size, group):
    """Rank 0 aborts while every other rank waits for it in an all_reduce."""
    dist.all_reduce(torch.ones(4), group=group)  # the group works, every path is set up
    if rank == 0:
        time.sleep(SETTLE_S)
        left_at = time.time()
        group._get_backend(torch.device("cpu")).abort()
        time.sleep(STAY_ALIVE_S)
        return {"victim": True, "left_at": left_at}
    return _outcome(lambda: dist.all_reduce(torch.ones(4), group=group))


def _reduce_with_a_wrong_dtype(rank, world_size, group):
    """The last rank passes float64 to a reduce whose root is rank 0: the root raises (and that
    rank too, where it receives anything), the others may return. The ranks that raised stay
    alive, out of the group; those that returned all_reduce again, and must not wait on them."""
    odd = world_size - 1
    dist.all_reduce(torch.ones(4), group=group)
    tensor = torch.ones(8, dtype=torch.float64 if rank == odd else torch.float32)
    first = _outcome(lambda: dist.reduce(tensor, dst=0, group=group))
    if first["raised"] is not None:
        time.sleep(STAY_ALIVE_S)
        return {"victim": True, "first": first, "left_at": first["at"]}
    return {"victim": False, "first": first, "next": _outcome(lambda: dist.all_reduce(torch.ones(4), group=group))}


def _destroy_while_peers_run_one_more_op(rank, world_size, group):
    """Rank 1 destroys the group; the others run one more all_reduce on it."""
    victim = 1
    dist.all_reduce(torch.ones(4), group=group)
    if rank == victim:
        left_at = time.time()
        dist.destroy_process_group(group)
        time.sleep(STAY_ALIVE_S)
        return {"victim": True, "left_at": left_at}
    return _outcome(lambda: dist.all_reduce(torch.ones(4), group=group))


SCENARIOS = {"abort": _abort_while_peers_wait, "reduce_dtype": _reduce_with_a_wrong_dtype,
             "destroy": _destroy_while_peers_run_one_more_op}


def departures(rank, world_size, names):
    """Runs each scenario in `names` on a fresh ddplite group of every rank; their outcomes by name."""
    outcomes = {}
    for name in names:
        group = dist.new_group(backend="ddplite")
        outcomes[name] = SCENARIOS[name](rank, world_size, group)
        dist.barrier()  # the default group: every rank is done with this scenario
    return outcomes
