"""Timing and agreement between ranks, over the control group (the default gloo group).

Every decision that changes how many ops a rank issues (warm-up length, iteration counts,
skipping an unsupported op) is taken from values all ranks agree on, so the ranks never
disagree on the sequence of collectives and cannot hang on each other.
"""

import statistics
import time
from dataclasses import dataclass

import torch
import torch.distributed as dist

from torch_ddp_lite.bench.sweep import plan_iterations, rotated, split_evenly


def slowest_rank(values):
    """Element-wise maximum over ranks of a list of floats (per-iteration times, say)."""
    tensor = torch.tensor(values, dtype=torch.float64)
    dist.all_reduce(tensor, op=dist.ReduceOp.MAX)
    return tensor.tolist()


def run_everywhere(attempt):
    """Runs ``attempt()`` on every rank: (its value, None) if it succeeded on all, else (None, why not).

    Why not is the first failing rank's exception, as ``"rank R: Type: message"``.
    """
    value, error = None, ""
    try:
        value = attempt()
    except Exception as exception:  # noqa: BLE001 - any failure means "not supported here"
        first_line = (str(exception).strip().splitlines() or [""])[0]
        error = f"{type(exception).__name__}: {first_line}"
    errors = [None] * dist.get_world_size()
    dist.all_gather_object(errors, error)
    failures = [f"rank {rank}: {text}" for rank, text in enumerate(errors) if text]
    return (None, failures[0]) if failures else (value, None)


def line_up():
    """Barrier on the control group: every rank starts the next batch of ops together."""
    dist.barrier()


def timed_iterations(run_once, iterations):
    """Per-iteration wall times (seconds) of `iterations` back-to-back calls."""
    times = []
    start = time.perf_counter()
    for _ in range(iterations):
        run_once()
        now = time.perf_counter()
        times.append(now - start)
        start = now
    return times


@dataclass(frozen=True)
class Plan:
    """How long to measure one point: iteration bounds, time budgets (seconds), rounds."""

    min_iters: int
    max_iters: int
    time_per_point: float
    warmup_iters: int
    warmup_time: float
    rounds: int


def warm_up(run_once, plan):
    """Runs the warm-up iterations; returns the agreed estimate of one iteration (seconds).

    The first call (which pays one-off costs such as connection set-up or first touch of the
    buffers) only sizes the rest of the warm-up; the estimate is the median of the others.
    """
    first = slowest_rank(timed_iterations(run_once, 1))[0]
    more = plan_iterations(first, plan.warmup_time, 0, plan.warmup_iters - 1)
    if more == 0:
        return first
    return slowest_rank([statistics.median(timed_iterations(run_once, more))])[0]


def interleaved_medians(calls, plan):
    """{name: median seconds per iteration of the slowest rank} for each ``run_once`` in `calls`.

    Each name's iterations are split into ``plan.rounds`` batches; round r runs one batch of
    every name, in an order rotated by r, each batch starting on a control barrier. Drift in the
    machine's load therefore hits every name alike.
    """
    names = list(calls)
    iterations = {}
    for name in names:
        estimate = warm_up(calls[name], plan)
        iterations[name] = plan_iterations(estimate, plan.time_per_point, plan.min_iters, plan.max_iters)
    batches = {name: split_evenly(iterations[name], plan.rounds) for name in names}
    times = {name: [] for name in names}
    for round_index in range(plan.rounds):
        for name in rotated(names, round_index):
            if batches[name][round_index]:
                line_up()
                times[name] += timed_iterations(calls[name], batches[name][round_index])
    return {name: statistics.median(slowest_rank(times[name])) for name in names}
