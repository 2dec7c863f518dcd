"""The collectives benchmark, run on every rank: each op swept over sizes on every backend.

For one op and size all backends share the same buffers, and their iterations are interleaved in
rounds (see :func:`torch_ddp_lite.bench.control.interleaved_medians`). Before an op is swept,
each backend runs it once on the smallest size; if that fails on any rank, the backend is
reported as not supporting the op and its rows are skipped.

Rank 0 prints the tables as it goes and writes the JSON rows and the plot.
"""

import datetime
import os
import platform
import time

import torch
import torch.distributed as dist

from torch_ddp_lite.bench import report
from torch_ddp_lite.bench.control import Plan, interleaved_medians, run_everywhere
from torch_ddp_lite.bench.launch import MEMCPY, is_reporting_rank, measured_groups, rank_device, synchronizer
from torch_ddp_lite.bench.sweep import bandwidths, describe_sizes, op_shape, size_sweep

IN_PLACE_OPS = ("all_reduce", "broadcast", "barrier")


def run(options):
    """Entry point of every rank (see launch.run_ranks)."""
    device = rank_device(options.device)
    dtype = getattr(torch, options.dtype)
    groups = measured_groups(options.backends)
    plan = Plan(options.min_iters, options.max_iters, options.time_per_point, options.warmup_iters,
                options.time_per_point / 4, options.rounds)
    sizes = requested_sizes(options)
    reporting = is_reporting_rank()
    if reporting:
        print(run_header(options, sizes), flush=True)
    rows = []
    for op in options.ops:
        rows += sweep_op(op, sizes, groups, dtype, device, plan, options.backends, reporting)
    if getattr(options, "breakdown", False):
        breakdown_rows = stage_breakdown(sizes, groups, dtype, device, plan, reporting)
        rows += breakdown_rows
    if reporting and options.json:
        report.write_json(options.json, rows)
        print(f"# wrote {len(rows)} rows to {options.json}", flush=True)
    if reporting and options.plot:
        report.write_plot(options.plot, rows, plot_title(options))
        print(f"# wrote {options.plot}", flush=True)


def requested_sizes(options):
    """--sizes when given, else the -b/-e/-f sweep."""
    if options.sizes:
        return list(options.sizes)
    return size_sweep(options.min_bytes, options.max_bytes, options.step_factor)


def sweep_op(op, sizes, groups, dtype, device, plan, backends, reporting):
    """Rows of one op over all sizes and supporting backends; prints its table on rank 0."""
    world_size = dist.get_world_size()
    element_size = torch.empty((), dtype=dtype).element_size()
    requested = [0] if op == "barrier" else sizes
    shapes = [shape for shape in (op_shape(op, size, element_size, world_size) for size in requested) if shape]
    if not shapes:
        if reporting:
            print(f"# {op}: no requested size holds {world_size} elements of {dtype}; skipped\n", flush=True)
        return []
    supported, notes = probe_backends(op, shapes[0], groups, dtype, device)
    if reporting:
        print(report.table_header(op, backends), flush=True)
    rows = []
    for shape in shapes:
        size_rows = measure_size(op, shape, {name: groups[name] for name in supported}, dtype, device, plan)
        rows += size_rows.values()
        if reporting and size_rows:
            print(report.table_line(size_rows, backends), flush=True)
    if reporting:
        footer = report.table_footer(rows, notes, backends)
        print(footer + "\n" if footer else "", flush=True)
    return rows


def probe_backends(op, shape, groups, dtype, device):
    """(backends that ran `op` on every rank, [(backend, why not)] for the others)."""
    supported, notes = [], []
    for backend, group in groups.items():
        if group is None and op == "barrier":
            notes.append((backend, "a barrier moves no bytes"))
            continue
        call = memcpy_call(shape, device) if group is None else \
            op_call(op, group, *make_buffers(op, shape, dtype, device), synchronizer(device))
        _, failure = run_everywhere(call)
        if failure is None:
            supported.append(backend)
        else:
            notes.append((backend, failure))
    return supported, notes


def measure_size(op, shape, groups, dtype, device, plan):
    """{backend: row} for one size."""
    buffers = make_buffers(op, shape, dtype, device)
    sync = synchronizer(device)
    calls = {backend: memcpy_call(shape, device) if group is None else op_call(op, group, *buffers, sync)
             for backend, group in groups.items()}
    medians = interleaved_medians(calls, plan) if calls else {}
    world_size = dist.get_world_size()
    dtype_name = str(dtype).removeprefix("torch.")
    return {
        backend: report.make_row(op, backend, world_size, device.type, dtype_name, shape, seconds,
                                 memcpy_bandwidths(shape.nbytes, seconds) if backend == MEMCPY
                                 else bandwidths(op, shape.nbytes, seconds, world_size))
        for backend, seconds in medians.items()
    }


def memcpy_call(shape, device):
    """The memcpy reference: this rank copies the op's size in bytes between two of its own
    buffers (every rank at once, timed like the collectives)."""
    source = torch.ones(shape.nbytes, dtype=torch.uint8, device=device)
    target = torch.zeros_like(source)
    sync = synchronizer(device)

    def run_once():
        target.copy_(source)
        sync()

    return run_once


def memcpy_bandwidths(nbytes, seconds):
    """(algbw, busbw) of the memcpy reference: both bytes copied / time (GB/s)."""
    algbw = nbytes / 1e9 / seconds
    return algbw, algbw


def make_buffers(op, shape, dtype, device):
    """(input, output) of `shape`; one tensor for in-place ops. Written once, so every page is real."""
    source = torch.empty(shape.input_numel, dtype=dtype, device=device).zero_()
    if op in IN_PLACE_OPS:
        return source, source
    return source, torch.empty(shape.output_numel, dtype=dtype, device=device).zero_()


def op_call(op, group, source, target, sync):
    """A no-argument callable issuing `op` once on `group` and waiting for it (device work included)."""
    issue = {
        "all_reduce": lambda: dist.all_reduce(target, group=group),
        "broadcast": lambda: dist.broadcast(target, src=0, group=group),
        "all_gather_into_tensor": lambda: dist.all_gather_into_tensor(target, source, group=group),
        "reduce_scatter_tensor": lambda: dist.reduce_scatter_tensor(target, source, group=group),
        "all_to_all_single": lambda: dist.all_to_all_single(target, source, group=group),
        "gather": lambda: dist.gather(source, list(target.chunk(dist.get_world_size(group))) if is_root() else None,
                                      dst=dist.get_global_rank(group, 0), group=group),
        "scatter": lambda: dist.scatter(target, list(source.chunk(dist.get_world_size(group))) if is_root() else None,
                                        src=dist.get_global_rank(group, 0), group=group),
        "barrier": lambda: dist.barrier(group=group),
        "sendrecv": lambda: send_to_next(source, target, group),
    }[op]

    def is_root():  # gather and scatter are rooted at the group's rank 0
        return dist.get_rank(group) == 0

    def run_once():
        issue()
        sync()

    return run_once


def send_to_next(source, target, group):
    """nccl-tests' sendrecv: `source` to rank + 1 and `target` from rank - 1, both in flight at once."""
    rank, size = dist.get_rank(group), dist.get_world_size(group)
    ops = [dist.P2POp(dist.isend, source, dist.get_global_rank(group, (rank + 1) % size), group),
           dist.P2POp(dist.irecv, target, dist.get_global_rank(group, (rank - 1) % size), group)]
    for work in dist.batch_isend_irecv(ops):
        work.wait()


def run_header(options, sizes):
    """The lines above the tables: what ran, where, when, and how time is measured."""
    algo = os.environ.get("DDPLITE_ALGO") or "default (DDPLITE_ALGO unset)"
    knobs = " ".join(f"{name}={value}" for name, value in sorted(os.environ.items())
                     if name.startswith("DDPLITE_") and name != "DDPLITE_ALGO")
    return "\n".join([
        f"# torch_ddp_lite.bench  {datetime.datetime.now().isoformat(timespec='seconds')}  "
        f"host {platform.node()} ({os.cpu_count()} CPUs)  torch {torch.__version__}",
        f"# world_size {dist.get_world_size()}  device {options.device}  dtype {options.dtype}  "
        f"backends {','.join(options.backends)}  threads/rank {torch.get_num_threads()}",
        f"# ddplite algo: {algo}" + (f"  {knobs}" if knobs else ""),
        f"# sizes {describe_sizes(sizes, None if options.sizes else options.step_factor)};"
        f" per point and backend: {options.min_iters}..{options.max_iters} iterations within"
        f" {options.time_per_point} s, {options.rounds} interleaved rounds, up to {options.warmup_iters} warm-up",
        "# time: median over iterations of the slowest rank's per-iteration wall time;"
        " algbw = size/time, busbw = algbw * nccl-tests factor, GB/s = 1e9 B/s",
        "",
    ])


def plot_title(options):
    return (f"{','.join(options.backends)}: world size {dist.get_world_size()}, {options.device}, {options.dtype}"
            f" ({datetime.date.today().isoformat()})")


STAGES = ("call", "hand-off", "collective", "completion", "return")


def stage_breakdown(sizes, groups, dtype, device, plan, reporting):
    """Where a synchronous all_reduce's time goes on each ddplite group, per size: rows with the
    median microseconds of each stage, the slowest rank's per iteration (rank 0 prints a table).

    The stages, from the Work's own clock (steady_clock, the clock of time.perf_counter_ns):
    call = Python's all_reduce up to the backend taking it; hand-off = taken to a thread starting
    it (0 when the caller runs it itself); collective = the algorithm and the wire; completion =
    its end to the Work completed; return = completed to the caller back in Python."""
    import torch_ddp_lite

    extension = torch_ddp_lite._load_extension()
    rows = []
    for backend, group in groups.items():
        if group is None or not backend.startswith("ddplite") or device.type != "cpu":
            continue
        if reporting:
            print(f"# all_reduce on {backend}: where the time goes (median us of the slowest rank per stage; "
                  "call = Python to the backend, hand-off = to the thread that runs it, collective = algorithm "
                  "and wire, completion = to the Work completed, return = back in Python)", flush=True)
            print("#" + "".join(f"{name:>12}" for name in ("size (B)", "total", *STAGES)), flush=True)
        for nbytes in sizes:
            count = max(1, nbytes // torch.empty((), dtype=dtype).element_size())
            tensor = torch.zeros(count, dtype=dtype, device=device)
            options = dist.AllreduceOptions()
            options.asyncOp = False  # what dist.all_reduce(t) passes
            iterations = max(plan.min_iters, min(plan.max_iters, 200))
            samples = []
            for _ in range(iterations):
                start = time.perf_counter_ns()
                work = group.allreduce([tensor], options)
                work.wait()
                back = time.perf_counter_ns()
                issued, running, ran, finished = extension.work_stages(work)
                running = running or issued
                samples.append([issued - start, running - issued, ran - running, finished - ran, back - finished])
            stages = torch.tensor(samples, dtype=torch.float64)
            dist.all_reduce(stages, op=dist.ReduceOp.MAX)  # the slowest rank's, stage by stage
            medians = stages.median(dim=0).values / 1e3
            total = float(stages.sum(dim=1).median()) / 1e3
            row = {"op": "all_reduce", "backend": backend, "bytes": nbytes, "kind": "breakdown", "total_us": total,
                   **{f"{name}_us": float(value) for name, value in zip(STAGES, medians)}}
            rows.append(row)
            if reporting:
                print(" " + f"{nbytes:>12}{total:>12.1f}" + "".join(f"{float(v):>12.1f}" for v in medians), flush=True)
        if reporting:
            print(flush=True)
    return rows
