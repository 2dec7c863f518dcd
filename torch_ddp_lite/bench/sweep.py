"""The benchmark's arithmetic: sizes, per-op buffer shapes, bandwidths. Pure functions, no I/O.

Conventions follow NVIDIA/nccl-tests ``doc/PERFORMANCE.md`` so ddplite's numbers read like
nccl-tests output:

* ``size`` (bytes) is the size of the operation: the buffer of all_reduce and broadcast, the
  **total** gathered output of all_gather and the **total** input of reduce_scatter (that is
  ``count_per_rank * element_size * n``), and the whole per-rank send (= receive) buffer of
  all_to_all.
* ``algbw = size / time`` in GB/s with GB = 10^9 bytes.
* ``busbw = algbw * factor``, the factor turning the op into the bandwidth one link needs, so
  every op can be compared with the hardware's peak: all_reduce 2(n-1)/n; all_gather,
  reduce_scatter, all_to_all, gather and scatter (n-1)/n; broadcast 1. A barrier moves no data: latency only.
"""

import re
from dataclasses import dataclass

OPS = ("all_reduce", "broadcast", "all_gather_into_tensor", "reduce_scatter_tensor", "all_to_all_single", "barrier",
       "sendrecv")
# Measured when asked for (--ops), not by default: rooted at rank 0; size is the gathered output
# (the scattered input), as nccl-tests' gather and scatter.
EXTRA_OPS = ("gather", "scatter")

_SIZE_PATTERN = re.compile(r"^\s*(\d+)\s*([KMG]?)(I?B)?\s*$", re.IGNORECASE)
_SIZE_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}


def parse_size(text):
    """'8' -> 8, '64K' -> 65536, '256M', '1G' (binary multiples, as nccl-tests' -b/-e)."""
    match = _SIZE_PATTERN.match(str(text))
    if not match:
        raise ValueError(f"bad size {text!r}: expected a byte count with an optional K, M or G suffix, e.g. 256M")
    return int(match.group(1)) * _SIZE_UNITS[match.group(2).upper()]


def format_size(nbytes):
    """8 -> '8 B', 65536 -> '64 KB', 268435456 -> '256 MB' (binary multiples)."""
    for unit, scale in (("GB", 1 << 30), ("MB", 1 << 20), ("KB", 1 << 10)):
        if nbytes >= scale and nbytes % scale == 0:
            return f"{nbytes // scale} {unit}"
    return f"{nbytes} B"


def size_sweep(min_bytes, max_bytes, step_factor):
    """[min, min*f, min*f^2, ...] up to max inclusive."""
    if min_bytes < 1 or max_bytes < min_bytes:
        raise ValueError(f"need 1 <= min-bytes <= max-bytes, got {min_bytes} and {max_bytes}")
    if step_factor < 2:
        raise ValueError(f"step factor must be an integer >= 2, got {step_factor}")
    sizes = []
    size = min_bytes
    while size <= max_bytes:
        sizes.append(size)
        size *= step_factor
    return sizes


def parse_size_list(text):
    """'8,64K,1M' -> [8, 65536, 1048576]: sorted, each size once (the --sizes option)."""
    sizes = sorted({parse_size(item) for item in str(text).split(",") if item.strip()})
    if not sizes or sizes[0] < 1:
        raise ValueError(f"bad size list {text!r}: expected positive sizes separated by commas, e.g. 8,64K,1M")
    return sizes


def describe_sizes(sizes, step_factor=None):
    """'8 B .. 1 MB (x4)' for a sweep, '8 B, 64 KB, 1 MB' for an explicit list (step_factor None)."""
    if step_factor is None:
        return ", ".join(format_size(size) for size in sizes)
    return f"{format_size(sizes[0])} .. {format_size(sizes[-1])} (x{step_factor})"


def bus_bandwidth_factor(op, world_size):
    """busbw / algbw for `op` on `world_size` ranks (nccl-tests PERFORMANCE.md); None for barrier."""
    n = world_size
    factors = {
        "all_reduce": 2 * (n - 1) / n,
        "broadcast": 1.0,
        "all_gather_into_tensor": (n - 1) / n,
        "reduce_scatter_tensor": (n - 1) / n,
        "all_to_all_single": (n - 1) / n,
        "gather": (n - 1) / n,
        "scatter": (n - 1) / n,
        "barrier": None,
        "sendrecv": 1.0,  # every rank sends the size to rank + 1 and receives it from rank - 1
    }
    if op not in factors:
        raise ValueError(f"unknown op {op!r}; known: {', '.join(OPS + EXTRA_OPS)}")
    return factors[op]


@dataclass(frozen=True)
class OpShape:
    """Buffers of one op at one size: `count` elements in `nbytes` (the nccl-tests size)."""

    count: int
    nbytes: int
    input_numel: int
    output_numel: int


def op_shape(op, nbytes, element_size, world_size):
    """The buffers for a requested size, or None when the size holds too few elements.

    Ops that split their buffer across ranks round the element count down to a multiple of the
    world size (as nccl-tests does), so the reported size may be a little below the requested one.
    """
    if op == "barrier":
        return OpShape(0, 0, 0, 0)
    if op == "sendrecv" and world_size < 2:
        return None  # no peer to send to
    count = nbytes // element_size
    n = world_size
    if op in ("all_gather_into_tensor", "reduce_scatter_tensor", "all_to_all_single", "gather", "scatter"):
        count -= count % n
    if count == 0:
        return None
    per_rank = count // n
    numels = {
        "all_reduce": (count, count),
        "broadcast": (count, count),
        "all_gather_into_tensor": (per_rank, count),
        "reduce_scatter_tensor": (count, per_rank),
        "all_to_all_single": (count, count),
        "gather": (per_rank, count),
        "scatter": (count, per_rank),
        "sendrecv": (count, count),
    }[op]
    return OpShape(count, count * element_size, *numels)


def bandwidths(op, nbytes, seconds, world_size):
    """(algbw, busbw) in GB/s (10^9 bytes); (None, None) for barrier."""
    factor = bus_bandwidth_factor(op, world_size)
    if factor is None:
        return None, None
    algbw = nbytes / 1e9 / seconds
    return algbw, algbw * factor


def plan_iterations(estimate_s, budget_s, min_iters, max_iters):
    """How many iterations of `estimate_s` each fit in `budget_s`, clamped to [min, max]."""
    fitting = budget_s / estimate_s if estimate_s > 0 else float("inf")
    return int(max(min_iters, min(max_iters, fitting)))


def rotated(items, shift):
    """`items` starting at position `shift` (wrapping): the backend order of round `shift`."""
    shift %= len(items)
    return list(items[shift:]) + list(items[:shift])


def split_evenly(total, parts):
    """`total` as `parts` counts differing by at most one, larger first: (5, 4) -> [2, 1, 1, 1]."""
    base, extra = divmod(total, parts)
    return [base + (1 if i < extra else 0) for i in range(parts)]
