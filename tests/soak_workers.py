"""Soak: many random collectives on integer data, each run through ddplite and through
gloo on identical inputs and compared bit for bit; the process's RSS, descriptors and threads
sampled before and after; then rounds of new_group / destroy. Run by tests/test_soak.py (a slice)
and scripts/soak.py (the full run).
"""

import os
import random

import torch
import torch.distributed as dist
from torch.distributed import ReduceOp

OPS = ("all_reduce", "broadcast", "reduce", "all_gather_into_tensor", "reduce_scatter_tensor", "all_to_all_single",
       "barrier")
DTYPES = (torch.int32, torch.int64, torch.uint8)
COUNTS = (0, 1, 7, 1000, 65_537)
REDUCE_OPS = (ReduceOp.SUM, ReduceOp.MAX, ReduceOp.MIN, ReduceOp.PRODUCT, ReduceOp.BAND, ReduceOp.BXOR)
WARM_UP_OPS = 300
GROUP_WARM_UP_ROUNDS = 5


def resources():
    """(RSS in KiB, open descriptors, threads) of this process, once what is unreferenced is
    collected (a destroyed group's backend, and its threads, go when its last reference does)."""
    import gc
    import time

    gc.collect()
    time.sleep(0.2)
    status = {}
    with open("/proc/self/status") as lines:
        for line in lines:
            key, _, value = line.partition(":")
            status[key] = value.split()
    return int(status["VmRSS"][0]), len(os.listdir("/proc/self/fd")), int(status["Threads"][0])


def _input(rng_seed, rank, count, dtype):
    generator = torch.Generator().manual_seed(rng_seed * 4099 + rank)
    high = 4 if dtype == torch.uint8 else 1000  # small values: PRODUCT wraps the same on both
    return torch.randint(0, high, (count,), generator=generator, dtype=torch.int64).to(dtype)


def _run(op, group, data, world_size, root, reduce_op, rank):
    """Runs `op` on `group` with a copy of `data`; returns the tensor(s) to compare."""
    if op == "all_reduce":
        tensor = data.clone()
        dist.all_reduce(tensor, op=reduce_op, group=group)
        return tensor
    if op == "broadcast":
        tensor = data.clone()
        dist.broadcast(tensor, src=root, group=group)
        return tensor
    if op == "reduce":
        tensor = data.clone()
        dist.reduce(tensor, dst=root, op=reduce_op, group=group)
        return tensor if rank == root else None  # other ranks' tensors are unspecified
    if op == "all_gather_into_tensor":
        output = torch.empty(data.numel() * world_size, dtype=data.dtype)
        dist.all_gather_into_tensor(output, data, group=group)
        return output
    if op == "reduce_scatter_tensor":
        usable = data[: data.numel() - data.numel() % world_size]
        output = torch.empty(usable.numel() // world_size, dtype=data.dtype)
        dist.reduce_scatter_tensor(output, usable.clone(), op=reduce_op, group=group)
        return output
    if op == "all_to_all_single":
        usable = data[: data.numel() - data.numel() % world_size]
        output = torch.empty_like(usable)
        dist.all_to_all_single(output, usable.clone(), group=group)
        return output
    dist.barrier(group=group)
    return None


def soak(rank, world_size, ops, seed, group_rounds):
    rng = random.Random(seed)
    gloo = dist.new_group(backend="gloo")
    second = dist.new_group(backend="ddplite")  # a second ddplite group, used alternately
    mismatches, samples = [], {}
    for index in range(ops):
        op, dtype, count = rng.choice(OPS), rng.choice(DTYPES), rng.choice(COUNTS)
        root, reduce_op = rng.randrange(world_size), rng.choice(REDUCE_OPS)
        group = rng.choice((None, second))
        data = _input(seed * 1_000_003 + index, rank, count, dtype)
        mine = _run(op, group, data, world_size, root, reduce_op, rank)
        theirs = _run(op, gloo, data, world_size, root, reduce_op, rank)
        if mine is not None and not torch.equal(mine, theirs):
            mismatches.append(f"#{index} {op} {dtype} n={count} root={root} {reduce_op}")
        if index == WARM_UP_OPS - 1:
            samples["after_warm_up"] = resources()
    samples["after_ops"] = resources()
    dist.destroy_process_group(second)
    for round_index in range(group_rounds):
        if round_index == GROUP_WARM_UP_ROUNDS:
            # the first rounds allocate once what later ones reuse (2 descriptors, measured)
            samples["before_groups"] = resources()
        group = dist.new_group(backend="ddplite")
        tensor = torch.full((5,), rank + round_index, dtype=torch.int64)
        dist.all_reduce(tensor, group=group)
        expected = sum(r + round_index for r in range(world_size))
        if tensor.tolist() != [expected] * 5:
            mismatches.append(f"new_group round {round_index}: {tensor.tolist()}")
        dist.destroy_process_group(group)
    samples["after_groups"] = resources()
    return {"mismatches": mismatches, "samples": samples}


def growth(samples, first, last):
    """(RSS, descriptors, threads) growth from `first` to `last`, as fractions."""
    a, b = samples[first], samples[last]
    return tuple((after - before) / before for before, after in zip(a, b))
