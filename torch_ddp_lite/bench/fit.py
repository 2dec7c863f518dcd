"""α-β fit of measured times: how much of each op is per-step latency, how much bandwidth.

    python -m torch_ddp_lite.bench.fit docs/data/allreduce_2ranks_before.json [--max-bytes 1M] ...

Model: t(S) = A + S / R, fitted by least squares on the *relative* error (every size counts alike,
not just the largest). For an algorithm of ``steps(P)`` latency-bound steps:

* α = A / steps(P): the cost of one step (a send/receive pair and its synchronisation);
* busbw∞ = factor(P) x R: the bus bandwidth the op tends to at large sizes, i.e. 1/β with β the
  per-byte cost of the busiest link in the nccl-tests sense (see :mod:`.sweep`).

Steps per algorithm (csrc/cpu/algorithms/): ring allreduce 2(P-1), ring allgather P-1, binary-tree
broadcast ceil(log2 P). A ring that works in rounds of P segments pays its 2(P-1) steps once per
round, so beyond one round those extra steps show up in β, not α. A negative A (sizes too
large for the latency to show) is printed as n/r, not resolved.
"""

import argparse
import json
import math

import numpy as np

from torch_ddp_lite.bench.sweep import bus_bandwidth_factor, parse_size

STEPS = {
    "all_reduce": lambda n: 2 * (n - 1),
    "all_gather_into_tensor": lambda n: n - 1,
    "broadcast": lambda n: math.ceil(math.log2(n)),
}


def fit_line(sizes, seconds):
    """(A seconds, 1/R seconds per byte) minimising the sum of ((A + S/R - t) / t)^2."""
    sizes = np.asarray(sizes, dtype=np.float64)
    seconds = np.asarray(seconds, dtype=np.float64)
    design = np.stack([1 / seconds, sizes / seconds], axis=1)
    (intercept, slope), *_ = np.linalg.lstsq(design, np.ones_like(seconds), rcond=None)
    return float(intercept), float(slope)


def fit_series(op, world_size, sizes, seconds):
    """The fit of one (op, backend, world size) series, with its relative residuals."""
    intercept, slope = fit_line(sizes, seconds)
    predicted = intercept + slope * np.asarray(sizes, dtype=np.float64)
    residuals = np.abs(predicted / np.asarray(seconds) - 1)
    return {
        "A_us": intercept * 1e6,
        "alpha_us": intercept * 1e6 / STEPS[op](world_size),
        "busbw_inf": bus_bandwidth_factor(op, world_size) / slope / 1e9 if slope > 0 else math.inf,
        "median_residual": float(np.median(residuals)),
        "max_residual": float(residuals.max()),
        "points": len(sizes),
    }


def fit_rows(rows, min_bytes, max_bytes):
    """{(op, backend, world_size): fit} for every series with a step model and >= 2 sizes in range."""
    series = {}
    for row in rows:
        if row["op"] in STEPS and min_bytes <= row["bytes"] <= max_bytes:
            key = (row["op"], row["backend"], row["world_size"])
            series.setdefault(key, []).append((row["bytes"], row["time_us"] / 1e6))
    return {key: fit_series(key[0], key[2], *zip(*sorted(points)))
            for key, points in series.items() if len(points) >= 2}


def markdown_table(fits, min_bytes, max_bytes):
    lines = [f"Sizes {min_bytes} B to {max_bytes} B.", "",
             "| op | backend | ranks | A (us) | α per step (us) | busbw∞ (GB/s) | median / max residual | sizes |",
             "|---|---|---|---|---|---|---|---|"]
    for (op, backend, world_size), fit in sorted(fits.items()):
        lines.append(f"| {op} | {backend} | {world_size} | {_latency_text(fit['A_us'])} | "
                     f"{_latency_text(fit['alpha_us'])} | "
                     f"{fit['busbw_inf']:.2f} | {fit['median_residual']:.0%} / {fit['max_residual']:.0%} | "
                     f"{fit['points']} |")
    return "\n".join(lines)


def _latency_text(microseconds):
    """A negative intercept means the sizes are too large to resolve latency: say so, not a number."""
    return f"{microseconds:.1f}" if microseconds >= 0 else "n/r"


def main():
    parser = argparse.ArgumentParser(prog="python -m torch_ddp_lite.bench.fit", description=__doc__.splitlines()[0])
    parser.add_argument("files", nargs="+", help="JSON rows written by python -m torch_ddp_lite.bench --json")
    parser.add_argument("--min-bytes", type=parse_size, default=1)
    parser.add_argument("--max-bytes", type=parse_size, default=parse_size("1G"))
    options = parser.parse_args()
    rows = []
    for path in options.files:
        with open(path) as handle:
            rows += json.load(handle)
    print(markdown_table(fit_rows(rows, options.min_bytes, options.max_bytes), options.min_bytes, options.max_bytes))


if __name__ == "__main__":
    main()
