"""Per-rank sweeps: every collective x algorithm x dtype x reduce op x element count.

Each sweep runs on every rank of a ddplite group (see harness.run_ranks). For each case it
computes the closed-form result, runs gloo once on the same inputs (the oracle; None where gloo
refuses the dtype or op), then runs ddplite once per algorithm of the collective (each pinned
with torch_ddp_lite.set_algorithm, then the automatic choice) and compares every result with
both. Inputs are small integers (workers.make_input), so results are exact in every dtype; AVG
on floats is compared with the dtype's tolerance. PREMUL_SUM uses the factor 0.5, exact too.
"""

import os

import torch
import torch.distributed as dist

import torch_ddp_lite
from workers import (BITWISE_OPS, DTYPES, FLOAT8_DTYPES, GLOO_REFUSED_DTYPES, REDUCE_OPS, WIDER_INTEGER_DTYPES,
                     ReduceOp, Sweep, gloo_refuses, make_input, op_name, supported)

QUICK_COUNTS = [0, 1, 3, 1000]
LARGE_COUNTS = [2 ** 20 + 1]
PREMUL = "PREMUL_SUM"
PREMUL_FACTOR = 0.5


# ---- cases and closed forms --------------------------------------------------------------------

# Large counts exercise segmentation and pipelining, which do not depend on the op: one op of
# each kind (sum-like, order, bitwise, averaging) keeps the slow sweep within CI's time.
LARGE_COUNT_OPS = [ReduceOp.SUM, ReduceOp.AVG, ReduceOp.MAX, ReduceOp.BXOR]


def reduce_cases(dtypes=None, counts=()):
    """(dtype, op) for every reduce op defined for the dtype, plus PREMUL_SUM on floating dtypes;
    for counts above 100,000 only LARGE_COUNT_OPS (and PREMUL_SUM)."""
    ops = LARGE_COUNT_OPS if max(counts, default=0) > 100_000 else REDUCE_OPS
    for dtype in dtypes or DTYPES:
        for op in ops:
            if supported(dtype, op):
                yield dtype, op
        if dtype.is_floating_point and dtype not in FLOAT8_DTYPES:
            yield dtype, PREMUL


def input_op(op):
    return ReduceOp.SUM if op == PREMUL else op


def torch_op(op):
    return dist._make_nccl_premul_sum(PREMUL_FACTOR) if op == PREMUL else op


def compare_op(op):
    return ReduceOp.SUM if op == PREMUL else op


def label_of(op):
    return op if op == PREMUL else op_name(op)


def reduced(tensors, dtype, op, world_size):
    """The closed-form reduction of `tensors` (all of `dtype`): bitwise ops on the integers, and
    the product of integers, wrapping as the dtype does; everything else in float64 (exact: the
    inputs are bounded so that every sum is)."""
    if op in BITWISE_OPS:  # on the tensors themselves: int64's 62 random bits do not fit a float64
        combine = {ReduceOp.BAND: torch.bitwise_and, ReduceOp.BOR: torch.bitwise_or,
                   ReduceOp.BXOR: torch.bitwise_xor}[op]
        result = tensors[0].clone()
        for tensor in tensors[1:]:
            result = combine(result, tensor)
        return result
    if op == ReduceOp.PRODUCT and not dtype.is_floating_point and dtype != torch.bool:
        # Past about 31 ranks a product of factors in {-2, -1, 1, 2} leaves int32: the ranks'
        # product wraps (two's complement, in any order), which int64 arithmetic cut to the dtype
        # gives; float64 cast to the dtype would not.
        result = tensors[0].to(torch.int64)
        for tensor in tensors[1:]:
            result = result * tensor.to(torch.int64)
        return result.to(dtype)
    stacked = torch.stack([t.to(torch.float64) for t in tensors])
    if dtype == torch.bool:
        return (stacked.amax(0) > 0) if op in (ReduceOp.SUM, ReduceOp.MAX) else (stacked.amin(0) > 0)
    if op == PREMUL:
        return (stacked * PREMUL_FACTOR).sum(0).to(dtype)
    if op == ReduceOp.AVG:
        total = stacked.sum(0)
        return (total / world_size if dtype.is_floating_point else torch.trunc(total / world_size)).to(dtype)
    combine = {ReduceOp.SUM: lambda s: s.sum(0), ReduceOp.PRODUCT: lambda s: s.prod(0),
               ReduceOp.MIN: lambda s: s.amin(0), ReduceOp.MAX: lambda s: s.amax(0)}[op]
    return combine(stacked).to(dtype)


def each_algorithm(collective):
    """Yields each algorithm name of `collective` with it pinned on this rank, then "auto"; every
    rank walks the same list, so all ranks run the same algorithm for each op. Under
    DDPLITE_CPU_TRANSPORT=mpi, MPI picks the algorithm, so there is one run: "mpi"."""
    if os.environ.get("DDPLITE_CPU_TRANSPORT") == "mpi":
        yield "mpi"
        return
    for name in torch_ddp_lite.available_algorithms()[collective] + ["auto"]:
        torch_ddp_lite.set_algorithm(collective, name)
        yield name
    torch_ddp_lite.set_algorithm(collective, "auto")


def check_all(sweep, label, actual, expected, reference, op=ReduceOp.SUM):
    sweep.check(label, actual, expected, op)
    if reference is not None:
        sweep.check(label + " vs gloo", actual, reference, op)


# ---- reductions ----------------------------------------------------------------------------------

def sweep_allreduce(rank, world_size, counts, dtypes=None):
    sweep = Sweep(rank)
    for dtype, op in reduce_cases(dtypes, counts):
        for count in counts:
            inputs = [make_input(r, count, dtype, input_op(op)) for r in range(world_size)]
            expected = reduced(inputs, dtype, op, world_size)

            def run_gloo():
                tensor = inputs[rank].clone()
                dist.all_reduce(tensor, op=torch_op(op), group=sweep.gloo)
                return tensor
            reference = sweep.reference(run_gloo, refused=gloo_refuses(dtype, op))
            for algorithm in each_algorithm("allreduce"):
                tensor = inputs[rank].clone()
                dist.all_reduce(tensor, op=torch_op(op))
                check_all(sweep, f"allreduce[{algorithm}] {dtype} {label_of(op)} n={count}", tensor, expected,
                          reference, compare_op(op))
    return sweep.result()


def sweep_allreduce_coalesced(rank, world_size, counts, dtypes=None):
    sweep = Sweep(rank)
    for dtype, op in reduce_cases(dtypes, counts):
        for count in counts:
            sizes = [count, count + 1, 2]
            inputs = [[make_input(r + k, n, dtype, input_op(op)) for k, n in enumerate(sizes)] for r in range(world_size)]
            expected = [reduced([inputs[r][k] for r in range(world_size)], dtype, op, world_size)
                        for k in range(len(sizes))]
            for algorithm in each_algorithm("allreduce"):
                tensors = [t.clone() for t in inputs[rank]]
                dist.all_reduce_coalesced(tensors, op=torch_op(op))
                for k, tensor in enumerate(tensors):
                    sweep.check(f"all_reduce_coalesced[{algorithm}] {dtype} {label_of(op)} n={count} #{k}", tensor,
                                expected[k], compare_op(op))
    return sweep.result()


def sweep_reduce(rank, world_size, counts, dtypes=None):
    sweep = Sweep(rank)
    roots = sorted({0, world_size - 1})
    for dtype, op in reduce_cases(dtypes, counts):
        for count in counts:
            inputs = [make_input(r, count, dtype, input_op(op)) for r in range(world_size)]
            expected = reduced(inputs, dtype, op, world_size)
            for root in roots:
                def run_gloo():
                    tensor = inputs[rank].clone()
                    dist.reduce(tensor, dst=root, op=torch_op(op), group=sweep.gloo)
                    return tensor
                reference = sweep.reference(run_gloo, refused=gloo_refuses(dtype, op))
                for algorithm in each_algorithm("reduce"):
                    label = f"reduce[{algorithm}] {dtype} {label_of(op)} n={count} root={root}"
                    tensor = inputs[rank].clone()
                    dist.reduce(tensor, dst=root, op=torch_op(op))
                    if rank == root:
                        check_all(sweep, label, tensor, expected, reference, compare_op(op))
                    else:
                        sweep.check(label + " (non-root input unchanged)", tensor, inputs[rank])
    return sweep.result()


def reduce_scatter_inputs(rank, world_size, count, dtype, op):
    """Block b of rank r's input: make_input(r + b); rank b's result reduces block b over ranks."""
    return [make_input(rank + block, count, dtype, input_op(op)) for block in range(world_size)]


def sweep_reduce_scatter(rank, world_size, counts, dtypes=None):
    sweep = Sweep(rank)
    for dtype, op in reduce_cases(dtypes, counts):
        for count in counts:
            blocks = reduce_scatter_inputs(rank, world_size, count, dtype, op)
            expected = reduced([make_input(r + rank, count, dtype, input_op(op)) for r in range(world_size)],
                               dtype, op, world_size)

            def run_gloo():
                output = torch.zeros(count, dtype=dtype)
                dist.reduce_scatter_tensor(output, torch.cat(blocks), op=torch_op(op), group=sweep.gloo)
                return output
            if op != PREMUL and not sweep.gloo_honours_reduce_scatter(op):
                reference = None  # torch 2.8's gloo sums whatever the op: the closed form is the oracle
            else:
                reference = sweep.reference(run_gloo, refused=gloo_refuses(dtype, op),
                                            gloo_checks=sweep.gloo_checks_reduce_scatter())
            for algorithm in each_algorithm("reduce_scatter"):
                label = f"reduce_scatter[{algorithm}] {dtype} {label_of(op)} n={count}"
                flat_input = torch.cat(blocks)
                output = torch.zeros(count, dtype=dtype)
                dist.reduce_scatter_tensor(output, flat_input, op=torch_op(op))
                check_all(sweep, label + " (tensor)", output, expected, reference, compare_op(op))
                sweep.check(label + " (input unchanged)", flat_input, torch.cat(blocks))
                listed = torch.zeros(count, dtype=dtype)
                dist.reduce_scatter(listed, [b.clone() for b in blocks], op=torch_op(op))
                check_all(sweep, label + " (list)", listed, expected, reference, compare_op(op))
                pair = [torch.zeros(count, dtype=dtype), torch.zeros(count, dtype=dtype)]
                with dist._coalescing_manager(async_ops=True) as manager:
                    dist.reduce_scatter_tensor(pair[0], torch.cat(blocks), op=torch_op(op))
                    dist.reduce_scatter_tensor(pair[1], torch.cat(blocks[::-1]), op=torch_op(op))
                manager.wait()
                sweep.check(label + " (coalesced #0)", pair[0], expected, compare_op(op))
                mirrored = [make_input(r + world_size - 1 - rank, count, dtype, input_op(op)) for r in range(world_size)]
                sweep.check(label + " (coalesced #1)", pair[1], reduced(mirrored, dtype, op, world_size),
                            compare_op(op))
    return sweep.result()


# ---- data movement --------------------------------------------------------------------------------

def sweep_broadcast(rank, world_size, counts, dtypes=None):
    sweep = Sweep(rank)
    for dtype in dtypes or DTYPES:
        for count in counts:
            roots = range(world_size) if count <= 1000 else sorted({0, world_size - 1})
            for root in roots:
                def run_gloo():
                    tensor = make_input(rank, count, dtype)
                    dist.broadcast(tensor, src=root, group=sweep.gloo)
                    return tensor
                reference = sweep.reference(run_gloo, refused=dtype in GLOO_REFUSED_DTYPES)
                for algorithm in each_algorithm("broadcast"):
                    tensor = make_input(rank, count, dtype)
                    dist.broadcast(tensor, src=root)
                    check_all(sweep, f"broadcast[{algorithm}] {dtype} n={count} root={root}", tensor,
                              make_input(root, count, dtype), reference)
    return sweep.result()


def sweep_allgather(rank, world_size, counts, dtypes=None):
    sweep = Sweep(rank)
    for dtype in dtypes or DTYPES:
        for count in counts:
            expected = torch.cat([make_input(r, count, dtype) for r in range(world_size)])
            mine = make_input(rank, count, dtype)

            def run_gloo():
                output = torch.zeros(world_size * count, dtype=dtype)
                dist.all_gather_into_tensor(output, mine, group=sweep.gloo)
                return output
            reference = sweep.reference(run_gloo, refused=dtype in GLOO_REFUSED_DTYPES)
            for algorithm in each_algorithm("allgather"):
                label = f"allgather[{algorithm}] {dtype} n={count}"
                outputs = [torch.zeros(count, dtype=dtype) for _ in range(world_size)]
                dist.all_gather(outputs, mine)
                check_all(sweep, label + " (list)", torch.cat(outputs), expected, reference)
                flat = torch.zeros(world_size * count, dtype=dtype)
                dist.all_gather_into_tensor(flat, mine)
                check_all(sweep, label + " (tensor)", flat, expected, reference)
                second = make_input(rank + 1, 2, dtype)
                pair = [torch.zeros(world_size * count, dtype=dtype), torch.zeros(world_size * 2, dtype=dtype)]
                with dist._coalescing_manager(async_ops=True) as manager:
                    dist.all_gather_into_tensor(pair[0], mine)
                    dist.all_gather_into_tensor(pair[1], second)
                manager.wait()
                sweep.check(label + " (coalesced #0)", pair[0], expected)
                sweep.check(label + " (coalesced #1)", pair[1],
                            torch.cat([make_input(r + 1, 2, dtype) for r in range(world_size)]))
    return sweep.result()


def sweep_gather_scatter(rank, world_size, counts, dtypes=None):
    sweep = Sweep(rank)
    for dtype in dtypes or DTYPES:
        for count in counts:
            for root in sorted({0, world_size - 1}):
                label = f"{dtype} n={count} root={root}"
                mine = make_input(rank, count, dtype)
                gathered = [torch.zeros(count, dtype=dtype) for _ in range(world_size)] if rank == root else None
                dist.gather(mine, gathered, dst=root)
                reference = [torch.zeros(count, dtype=dtype) for _ in range(world_size)] if rank == root else None
                gloo_ok = sweep.reference(lambda: dist.gather(mine, reference, dst=root, group=sweep.gloo) or True,
                                          refused=dtype in GLOO_REFUSED_DTYPES)
                if rank == root:
                    expected = torch.cat([make_input(r, count, dtype) for r in range(world_size)])
                    check_all(sweep, "gather " + label, torch.cat(gathered), expected,
                              torch.cat(reference) if gloo_ok else None)
                pieces = [make_input(root * world_size + r, count, dtype) for r in range(world_size)]
                received = torch.zeros(count, dtype=dtype)
                dist.scatter(received, pieces if rank == root else None, src=root)
                oracle = torch.zeros(count, dtype=dtype)
                gloo_ok = sweep.reference(
                    lambda: dist.scatter(oracle, pieces if rank == root else None, src=root, group=sweep.gloo) or True,
                    refused=dtype in GLOO_REFUSED_DTYPES)
                check_all(sweep, "scatter " + label, received, make_input(root * world_size + rank, count, dtype),
                          oracle if gloo_ok else None)
    return sweep.result()


def uneven_rows(sender, receiver, count):
    """Rows rank `sender` sends to rank `receiver` in the uneven all_to_all: 0, 1 or 2 x count."""
    return ((sender + 2 * receiver) % 3) * count


def sweep_alltoall(rank, world_size, counts, dtypes=None):
    sweep = Sweep(rank)
    for dtype in dtypes or DTYPES:
        for count in counts:
            label = f"{dtype} n={count}"
            # equal splits: block j of rank r is make_input(r * P + j)
            source = torch.cat([make_input(rank * world_size + j, count, dtype) for j in range(world_size)])
            expected = torch.cat([make_input(j * world_size + rank, count, dtype) for j in range(world_size)])
            output = torch.zeros(world_size * count, dtype=dtype)
            dist.all_to_all_single(output, source)
            oracle = torch.zeros(world_size * count, dtype=dtype)
            gloo_ok = sweep.reference(lambda: dist.all_to_all_single(oracle, source, group=sweep.gloo) or True,
                                      refused=dtype in GLOO_REFUSED_DTYPES)
            check_all(sweep, "all_to_all_single equal " + label, output, expected, oracle if gloo_ok else None)
            sweep.check("all_to_all_single input unchanged " + label, source,
                        torch.cat([make_input(rank * world_size + j, count, dtype) for j in range(world_size)]))
            # uneven splits, single tensor and list forms
            send_rows = [uneven_rows(rank, j, count) for j in range(world_size)]
            recv_rows = [uneven_rows(j, rank, count) for j in range(world_size)]
            pieces = [make_input(rank * world_size + j, send_rows[j], dtype) for j in range(world_size)]
            wanted = [make_input(j * world_size + rank, recv_rows[j], dtype) for j in range(world_size)]
            output = torch.zeros(sum(recv_rows), dtype=dtype)
            dist.all_to_all_single(output, torch.cat(pieces), recv_rows, send_rows)
            oracle = torch.zeros(sum(recv_rows), dtype=dtype)
            gloo_ok = sweep.reference(
                lambda: dist.all_to_all_single(oracle, torch.cat(pieces), recv_rows, send_rows, group=sweep.gloo) or True,
                refused=dtype in GLOO_REFUSED_DTYPES)
            check_all(sweep, "all_to_all_single uneven " + label, output, torch.cat(wanted), oracle if gloo_ok else None)
            outputs = [torch.zeros(n, dtype=dtype) for n in recv_rows]
            dist.all_to_all(outputs, pieces)
            sweep.check("all_to_all list uneven " + label, torch.cat(outputs), torch.cat(wanted))
    return sweep.result()


SWEEPS = {
    "allreduce": sweep_allreduce,
    "allreduce_coalesced": sweep_allreduce_coalesced,
    "reduce": sweep_reduce,
    "reduce_scatter": sweep_reduce_scatter,
    "broadcast": sweep_broadcast,
    "allgather": sweep_allgather,
    "gather_scatter": sweep_gather_scatter,
    "alltoall": sweep_alltoall,
}


REDUCING = ("allreduce", "allreduce_coalesced", "reduce", "reduce_scatter")


def extra_dtypes(collective):
    """The dtypes gloo refuses that ddplite serves: the wider integers everywhere, float8 where
    nothing is reduced."""
    return WIDER_INTEGER_DTYPES + ([] if collective in REDUCING else FLOAT8_DTYPES)


def sweep_extra_dtypes(rank, world_size, counts):
    """Every sweep on extra_dtypes(): {collective: its result}, against the closed form (gloo must
    refuse each of these cases, which Sweep.reference checks)."""
    return {name: sweep(rank, world_size, counts, extra_dtypes(name)) for name, sweep in SWEEPS.items()}
