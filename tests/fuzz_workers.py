"""Bad-input fuzz: random invalid calls of every collective, the same call on every
rank (so the call is invalid everywhere and nothing may go on the wire). Each must raise a
Python exception (never crash, never hang), a ddplite message naming its op and rank, and the
group must stay usable: every few calls a valid all_reduce checks it.

Run by tests/test_fuzz.py (a quick slice) and scripts/fuzz_inputs.py (the full run).
"""

import random

import torch
import torch.distributed as dist
from torch.distributed import ReduceOp

EXPECTED_TYPES = ("ValueError", "RuntimeError", "TypeError", "DistBackendError", "NotImplementedError")
CHECK_EVERY = 5


def _dtype(rng):
    return rng.choice([torch.float32, torch.float64, torch.int32, torch.int64, torch.float16, torch.bfloat16])


def _count(rng):
    return rng.choice([1, 3, 7, 64, 1001])


def _out_of_range(rng, world_size):
    return rng.choice([-1, world_size, world_size + rng.randint(1, 50)])


def _wrong_length(rng, world_size):
    return rng.choice([0, world_size - 1, world_size + 1, world_size + rng.randint(2, 5)]) or world_size + 1


def _bad_tensor(rng, count):
    """A tensor no collective may take: (kind, tensor)."""
    # Not meta tensors: torch's own meta kernels take every collective on them (a no-op, for
    # tracing) before any backend sees the call, gloo's as ddplite's.
    kind = rng.choice(["sparse", "quantized", "overlapping", "huge_overlapping", "float8_fnuz", "complex_noncontig"])
    if kind == "sparse":
        return kind, torch.eye(max(2, count % 17)).to_sparse()
    if kind == "quantized":
        return kind, torch.quantize_per_tensor(torch.ones(count), 0.1, 0, torch.quint8)
    if kind == "overlapping":
        return kind, torch.ones(1).expand(count + 1)
    if kind == "huge_overlapping":
        return kind, torch.ones(1).expand(2**31 + rng.randint(0, 9))
    if kind == "float8_fnuz":
        return kind, torch.ones(count, dtype=torch.float8_e4m3fnuz)  # unsupported dtype
    return kind, torch.ones(count, 2, dtype=torch.complex64)[:, 0].expand(2, count)  # overlapping complex


def make_call(rng, world_size):
    """(description, zero-argument call) of one invalid call; the same on every rank for one rng state."""
    case = rng.choice(["bad_tensor", "root", "list_length", "output_size", "mixed_dtypes", "dtype_pair",
                       "splits", "reduce_op"])
    count, dtype = _count(rng), _dtype(rng)
    if case == "bad_tensor":
        kind, tensor = _bad_tensor(rng, count)
        op = rng.choice(["all_reduce", "broadcast", "reduce", "all_gather_into_tensor", "reduce_scatter_tensor"])
        if op == "all_reduce" and kind == "sparse":  # a sparse SUM is served (as gloo does); MAX is not
            return f"all_reduce MAX on {kind}", lambda: dist.all_reduce(tensor, op=dist.ReduceOp.MAX)
        if op == "all_reduce":
            return f"all_reduce on {kind}", lambda: dist.all_reduce(tensor)
        if op == "broadcast":
            return f"broadcast of {kind}", lambda: dist.broadcast(tensor, src=0)
        if op == "reduce":
            return f"reduce of {kind}", lambda: dist.reduce(tensor, dst=0)
        if op == "all_gather_into_tensor":
            return f"all_gather_into_tensor into {kind}", lambda: dist.all_gather_into_tensor(
                tensor, torch.ones(max(1, tensor.numel() // world_size)))
        return f"reduce_scatter_tensor into {kind}", lambda: dist.reduce_scatter_tensor(
            tensor, torch.ones(tensor.numel() * world_size if kind not in ("huge_overlapping",) else 8))
    if case == "root":
        root = _out_of_range(rng, world_size)
        op = rng.choice(["broadcast", "reduce"])
        if op == "broadcast":
            return f"broadcast src={root}", lambda: dist.broadcast(torch.ones(count, dtype=dtype), src=root)
        return f"reduce dst={root}", lambda: dist.reduce(torch.ones(count, dtype=dtype), dst=root)
    if case == "list_length":
        length = _wrong_length(rng, world_size)
        op = rng.choice(["all_gather", "all_to_all"])
        if op == "all_gather":
            return (f"all_gather into {length} tensors",
                    lambda: dist.all_gather([torch.zeros(count, dtype=dtype) for _ in range(length)],
                                            torch.ones(count, dtype=dtype)))
        return (f"all_to_all with {length} outputs",
                lambda: dist.all_to_all([torch.zeros(count, dtype=dtype) for _ in range(length)],
                                        [torch.ones(count, dtype=dtype) for _ in range(world_size)]))
    if case == "output_size":
        extra = rng.choice([-1, 1, 2, count])
        op = rng.choice(["all_gather_into_tensor", "reduce_scatter_tensor", "all_gather"])
        if op == "all_gather_into_tensor":
            return (f"all_gather_into_tensor output off by {extra}",
                    lambda: dist.all_gather_into_tensor(torch.zeros(count * world_size + extra, dtype=dtype),
                                                        torch.ones(count, dtype=dtype)))
        if op == "reduce_scatter_tensor":
            return (f"reduce_scatter_tensor input off by {extra}",
                    lambda: dist.reduce_scatter_tensor(torch.zeros(count, dtype=dtype),
                                                       torch.ones(count * world_size + extra, dtype=dtype)))
        return (f"all_gather with outputs of {count + extra}",
                lambda: dist.all_gather([torch.zeros(count + extra, dtype=dtype) for _ in range(world_size)],
                                        torch.ones(count, dtype=dtype)))
    if case == "mixed_dtypes":
        other = torch.float64 if dtype != torch.float64 else torch.int32
        return (f"all_gather with one output of {other}",
                lambda: dist.all_gather([torch.zeros(count, dtype=other if i == world_size - 1 else dtype)
                                         for i in range(world_size)], torch.ones(count, dtype=dtype)))
    if case == "dtype_pair":
        other = torch.float64 if dtype != torch.float64 else torch.int32
        op = rng.choice(["all_gather_into_tensor", "reduce_scatter_tensor"])
        if op == "all_gather_into_tensor":
            return (f"all_gather_into_tensor {dtype} into {other}",
                    lambda: dist.all_gather_into_tensor(torch.zeros(count * world_size, dtype=other),
                                                        torch.ones(count, dtype=dtype)))
        return (f"reduce_scatter_tensor {dtype} into {other}",
                lambda: dist.reduce_scatter_tensor(torch.zeros(count, dtype=other),
                                                   torch.ones(count * world_size, dtype=dtype)))
    if case == "splits":
        splits = [rng.randint(0, 3) for _ in range(world_size)]
        total = sum(splits) + rng.choice([1, 2, 5])  # input larger than its splits say
        return (f"all_to_all_single splits {splits} over {total}",
                lambda: dist.all_to_all_single(torch.zeros(sum(splits), dtype=dtype), torch.ones(total, dtype=dtype),
                                               output_split_sizes=splits, input_split_sizes=splits))
    if case == "reduce_op":
        bad = rng.choice([(ReduceOp.BAND, torch.float32), (ReduceOp.BOR, torch.float64),
                          (ReduceOp.BXOR, torch.bfloat16), (ReduceOp.AVG, torch.bool)])
        return (f"all_reduce {bad[0]} on {bad[1]}",
                lambda: dist.all_reduce(torch.ones(count, dtype=bad[1]), op=bad[0]))
    raise AssertionError(case)


def fuzz_invalid_calls(rank, world_size, calls, seed):
    """Runs `calls` invalid calls (the same sequence on every rank); returns what went wrong."""
    rng = random.Random(seed)
    problems, ddplite_messages, kinds = [], 0, {}
    check = torch.zeros(3)
    for index in range(calls):
        what, call = make_call(rng, world_size)
        try:
            call()
            problems.append(f"#{index} {what}: returned instead of raising")
        except Exception as error:  # noqa: BLE001
            name = type(error).__name__
            kinds[name] = kinds.get(name, 0) + 1
            message = str(error)
            if name not in EXPECTED_TYPES:
                problems.append(f"#{index} {what}: {name}: {message[:200]}")
            if message.startswith("ddplite"):
                ddplite_messages += 1
                if f"rank {rank}/" not in message:
                    problems.append(f"#{index} {what}: message does not name the rank: {message[:200]}")
        if index % CHECK_EVERY == CHECK_EVERY - 1:
            check.fill_(rank + 1.0)
            dist.all_reduce(check)
            if check.tolist() != [world_size * (world_size + 1) / 2] * 3:
                problems.append(f"after #{index} {what}: the group computed {check.tolist()}")
    return {"problems": problems, "ddplite_messages": ddplite_messages, "kinds": kinds}

