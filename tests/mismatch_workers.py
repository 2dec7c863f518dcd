"""Per-rank programs where the ranks disagree about a collective (see test_mismatch.py).

Each returns, per step, either the value the collective produced or the error it raised, so the
test can assert that no rank ever returns a value computed from another collective's bytes.
"""

import os
import time

import torch
import torch.distributed as dist


def outcome(call):
    """{"value": list, "seconds": s} or {"error": type, "message": str, "dist": bool, "seconds": s}."""
    start = time.monotonic()
    try:
        value = call()
        result = {"value": value.tolist() if isinstance(value, torch.Tensor) else value}
    except Exception as error:  # noqa: BLE001 - the test inspects it
        result = {"error": type(error).__name__, "message": str(error),
                  "dist": isinstance(error, dist.DistBackendError)}
    result["seconds"] = time.monotonic() - start
    return result


def all_reduce_of(tensor, **kwargs):
    dist.all_reduce(tensor, **kwargs)
    return tensor


def gather_one_short(rank, world_size):
    """The trust issue's case: the root passes a gather_list one short; the others gather."""
    steps = {}
    mine = torch.full((1,), float(rank + 10))
    if rank == 0:
        short = [torch.zeros(1) for _ in range(world_size - 1)]
        steps["gather"] = outcome(lambda: dist.gather(mine, gather_list=short, dst=0))
    else:
        steps["gather"] = outcome(lambda: dist.gather(mine, dst=0))
    steps["all_reduce"] = outcome(lambda: all_reduce_of(torch.full((3,), 1.0)))
    steps["next"] = outcome(lambda: all_reduce_of(torch.full((3,), 1.0)))
    return steps


def allreduce_against_broadcast(rank, world_size):
    """Rank 0 all-reduces 1000 elements while every other rank broadcasts 7 from rank 1."""
    steps = {}
    if rank == 0:
        steps["first"] = outcome(lambda: all_reduce_of(torch.ones(1000)))
    else:
        steps["first"] = outcome(lambda: _broadcast(torch.ones(7) * rank, src=1))
    steps["second"] = outcome(lambda: all_reduce_of(torch.full((3,), 1.0)))
    steps["third"] = outcome(lambda: all_reduce_of(torch.full((3,), 1.0)))
    return steps


def _broadcast(tensor, src):
    dist.broadcast(tensor, src=src)
    return tensor


def one_rank_differs(rank, world_size, case):
    """Every rank but the last runs the common call; the last runs the variant of `case`."""
    odd = rank == world_size - 1
    calls = {
        "dtype": lambda: all_reduce_of(torch.ones(4, dtype=torch.int32 if odd else torch.float32)),
        "numel": lambda: all_reduce_of(torch.ones(5 if odd else 4)),
        "reduce_op": lambda: all_reduce_of(torch.ones(4), op=dist.ReduceOp.MAX if odd else dist.ReduceOp.SUM),
        "op": lambda: (all_reduce_of(torch.ones(4)) if not odd else _all_gather(torch.ones(2), world_size)),
        "root": lambda: _broadcast(torch.ones(4) * rank, src=world_size - 1 if odd else 0),
        "reduce_root": lambda: _reduce(torch.ones(4), dst=world_size - 1 if odd else 0),
        "order": lambda: _in_order(rank, odd, world_size),
        "alltoall_splits": lambda: _alltoall_splits(rank, world_size, odd),
        "seq": lambda: all_reduce_of(torch.ones(4)) if not odd else _refused_then_all_reduce(),
    }
    steps = {"first": outcome(calls[case])}
    steps["second"] = outcome(lambda: all_reduce_of(torch.full((3,), 1.0)))
    steps["third"] = outcome(lambda: all_reduce_of(torch.full((3,), 1.0)))
    return steps


def _refused_then_all_reduce():
    """A refused call (sparse input with MAX) takes a sequence number on this rank only; the
    all_reduce that follows matches the others' in everything but its number."""
    try:
        dist.all_reduce(torch.eye(3).to_sparse(), op=dist.ReduceOp.MAX)
    except ValueError:
        pass
    return all_reduce_of(torch.ones(4))


def _all_gather(tensor, world_size):
    outputs = [torch.zeros_like(tensor) for _ in range(world_size)]
    dist.all_gather(outputs, tensor)
    return torch.cat(outputs)


def _reduce(tensor, dst):
    dist.reduce(tensor, dst=dst)
    return tensor


def _in_order(rank, odd, world_size):
    """allreduce then broadcast, except the odd rank: broadcast then allreduce."""
    first, second = torch.ones(6), torch.ones(6)
    if odd:
        dist.broadcast(first, src=0)
        dist.all_reduce(second)
    else:
        dist.all_reduce(first)
        dist.broadcast(second, src=0)
    return torch.cat([first, second])


def _alltoall_splits(rank, world_size, odd):
    """Every rank sends 2 rows to each; the odd rank expects 3 from rank 0."""
    send = [2] * world_size
    recv = [2] * world_size
    if odd:
        recv[0] = 3
    source = torch.arange(2 * world_size, dtype=torch.float32) + 100 * rank
    output = torch.zeros(sum(recv))
    dist.all_to_all_single(output, source, recv, send)
    return output


def refused_everywhere(rank, world_size):
    """A call every rank refuses (ValueError) leaves the group in step and usable."""
    steps = {
        "unsupported_dtype": outcome(lambda: all_reduce_of(torch.ones(3, dtype=torch.float8_e4m3fnuz))),
        "expanded": outcome(lambda: all_reduce_of(torch.ones(1).expand(2 ** 31))),
        "expanded_gather": outcome(
            lambda: _all_gather_into(torch.ones(1).expand(2 * world_size), torch.ones(2))),
        "after": outcome(lambda: all_reduce_of(torch.full((3,), float(rank + 1)))),
        "broadcast_after": outcome(lambda: _broadcast(torch.full((2,), float(rank)), src=world_size - 1)),
    }
    return steps


def _all_gather_into(output, tensor):
    dist.all_gather_into_tensor(output, tensor)
    return output


def fingerprint_off_env():
    """The TCP path with its check off (shared memory always checks its headers)."""
    return {"DDPLITE_FINGERPRINT": "0", "DDPLITE_CPU_TRANSPORT": "tcp"}


def pid(rank, world_size):
    return os.getpid()


def coalesced_parts_with_mixed_algorithms(rank, world_size, rounds):
    """Legitimate coalesced ops whose parts run different algorithms (ring above 64 KB, butterfly,
    doubling or halving below): a rank that finishes one part early sends the next part's header
    to a peer still in the previous one. That must never be reported as a mismatch."""
    failures = []
    total = float(sum(range(1, world_size + 1)))
    for round_ in range(rounds):
        big = torch.full((40000,), float(rank + 1))             # float32, 160 KB: ring
        small = torch.full((3,), rank + 1, dtype=torch.int64)    # int64, 24 B: butterfly
        wide = torch.full((20000,), float(rank + 1), dtype=torch.float64)  # 160 KB: ring
        with dist._coalescing_manager(async_ops=True) as manager:  # one allreduce_coalesced, 3 dtypes
            for tensor in (big, small, wide):
                dist.all_reduce(tensor)
        manager.wait()
        for name, tensor in (("big", big), ("small", small), ("wide", wide)):
            if not torch.equal(tensor, torch.full_like(tensor, total)):
                failures.append(f"round {round_} {name}: {tensor[:3].tolist()}")
        outputs = [torch.zeros(world_size * 40000), torch.zeros(world_size * 2)]
        with dist._coalescing_manager(async_ops=True) as manager:
            dist.all_gather_into_tensor(outputs[0], torch.full((40000,), float(rank)))  # ring
            dist.all_gather_into_tensor(outputs[1], torch.full((2,), float(rank)))      # doubling
        manager.wait()
        for index, per_rank in enumerate((40000, 2)):
            expected = torch.arange(world_size, dtype=torch.float32).repeat_interleave(per_rank)
            if not torch.equal(outputs[index], expected):
                failures.append(f"round {round_} all_gather part {index}: {outputs[index][:4].tolist()}")
    return failures


def _disagreeing_call(kind, odd):
    """Collective #2 of detail_mismatch: the same on every rank but `odd` ones, which differ by `kind`."""
    if kind == "op":
        return (lambda: dist.broadcast(torch.ones(4), src=0)) if odd else (lambda: all_reduce_of(torch.ones(4)))
    if kind == "dtype":
        return lambda: all_reduce_of(torch.ones(4, dtype=torch.float64 if odd else torch.float32))
    if kind == "numel":
        return lambda: all_reduce_of(torch.ones(5 if odd else 4))
    if kind == "shape":
        return lambda: all_reduce_of(torch.ones((2, 2) if odd else (4,)))
    if kind == "root":
        return lambda: dist.broadcast(torch.ones(4), src=1 if odd else 0)
    if kind == "reduce_op":
        return lambda: all_reduce_of(torch.ones(4), op=dist.ReduceOp.MAX if odd else dist.ReduceOp.SUM)
    raise ValueError(kind)


def detail_mismatch(rank, world_size, kind):
    """Under DDPLITE_DEBUG=DETAIL: one matching all_reduce, then the last rank differs from the
    others by `kind` ("order": it swaps two collectives), then a matching all_reduce of 1.0s."""
    odd = rank == world_size - 1
    steps = {"first": outcome(lambda: all_reduce_of(torch.ones(4)))}
    if kind == "order":
        calls = [lambda: dist.broadcast(torch.ones(4), src=0), lambda: all_reduce_of(torch.ones(4))]
        if odd:
            calls.reverse()
        steps["mismatch"] = outcome(calls[0])
        steps["mismatch_2"] = outcome(calls[1])
    else:
        steps["mismatch"] = outcome(_disagreeing_call(kind, odd))
    steps["after"] = outcome(lambda: all_reduce_of(torch.full((3,), 1.0)))
    return steps


def detail_two_roots(rank, world_size):
    """Under DETAIL: each rank thinks it is the root of a reduce (no message would ever cross)."""
    steps = {"mismatch": outcome(lambda: dist.reduce(torch.ones(4), dst=rank))}
    steps["after"] = outcome(lambda: all_reduce_of(torch.full((3,), 1.0)))
    return steps
