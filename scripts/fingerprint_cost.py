"""The latency cost of an always-on safety feature (docs/reliability.md): the wire fingerprint
(--feature fingerprint, off with DDPLITE_FINGERPRINT=0), the flight recorder (--feature trace, off
with DDPLITE_TRACE_BUFFER_SIZE=0) or the straggler ledger (--feature stragglers, off with
DDPLITE_STRAGGLER_WINDOW=0), measured the only way a noisy 2-core machine allows: many short
blocks of back-to-back all_reduce calls, alternating between ddplite groups with the feature (the
default) and without it, in one run, on the same ranks and buffers. Each adjacent pair of blocks gives one ratio; the median of those
ratios, with a bootstrap 95% interval, is the cost.

A group's threads keep their place in the scheduler for the whole run, and that alone moves a
group's latency by a few percent (--null 1, two identical settings, shows it). So each side has
--groups groups, created in the order c u u c c u ..., and every block draws one of them at
random: the placement effect averages out instead of landing on one side.

    python scripts/fingerprint_cost.py [--feature fingerprint|trace|stragglers] [--world-size 2] [--bytes 8]
                                       [--blocks 300] [--iters 200] [--groups 4] [--null 1] [--json FILE]
"""

import argparse
import json
import os
import random
import statistics
import sys
import tempfile
import time
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


# feature: (knob, value with it, value without it); the knob is read when a group is created.
FEATURES = {
    "fingerprint": ("DDPLITE_FINGERPRINT", "1", "0"),
    "trace": ("DDPLITE_TRACE_BUFFER_SIZE", "2000", "0"),
    "stragglers": ("DDPLITE_STRAGGLER_WINDOW", "512", "0"),
}


def new_group(knob, value):
    os.environ[knob] = value
    try:
        return dist.new_group(backend="ddplite")
    finally:
        del os.environ[knob]


def timed_block(group, tensor, iters):
    """Seconds per call of `iters` all_reduce on `group`, started together on every rank."""
    dist.barrier()  # the gloo control group: no traffic on the measured groups but the op
    start = time.perf_counter()
    for _ in range(iters):
        dist.all_reduce(tensor, group=group)
    elapsed = torch.tensor([time.perf_counter() - start], dtype=torch.float64)
    dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)  # the slowest rank's time, as the benchmark does
    return elapsed.item() / iters


def rank_main(rank, args, store):
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=args.world_size,
                            timeout=timedelta(seconds=120))
    # --null 1 measures two identical settings instead: the ratio the method reports for no change.
    knob, on, off = FEATURES[args.feature]
    settings = {"checked": on, "unchecked": on if args.null else off}
    groups = {"checked": [], "unchecked": []}
    for index in range(2 * args.groups):
        name = ("checked", "unchecked")[(index + index // 2) % 2]  # c u u c c u ...
        groups[name].append(new_group(knob, settings[name]))
    tensor = torch.ones(max(1, args.bytes // 4))
    for group in groups["checked"] + groups["unchecked"]:  # warm-up: connections, scratch
        timed_block(group, tensor, args.iters)
    draw = random.Random(1)  # the same draws on every rank
    times = {name: [] for name in groups}
    order = list(groups)
    for block in range(args.blocks):
        for name in (order if block % 2 == 0 else order[::-1]):  # ABBA: neither side always goes first
            times[name].append(timed_block(draw.choice(groups[name]), tensor, args.iters))
    if rank == 0:
        report(args, times)
    dist.destroy_process_group()


def report(args, times):
    ratios = [c / u for c, u in zip(times["checked"], times["unchecked"])]
    rng = random.Random(0)
    boot = sorted(statistics.median(rng.choices(ratios, k=len(ratios))) for _ in range(2000))
    low, high = boot[50], boot[1949]
    result = {
        "feature": args.feature, "world_size": args.world_size, "bytes": args.bytes, "blocks": args.blocks, "iters_per_block": args.iters,
        "groups_per_side": args.groups,
        "checked_median_us": statistics.median(times["checked"]) * 1e6,
        "unchecked_median_us": statistics.median(times["unchecked"]) * 1e6,
        "ratio_median": statistics.median(ratios), "ratio_ci95": [low, high],
        "null": bool(args.null),
        "command": " ".join([os.path.basename(sys.executable)] + sys.argv),
        "date": time.strftime("%Y-%m-%d"), "torch": torch.__version__, "cpus": os.cpu_count(),
    }
    print(f"all_reduce of {args.bytes} B, {args.world_size} ranks, {args.blocks} x 2 blocks of {args.iters} calls")
    knob, _, off = FEATURES[args.feature]
    print(f"  with the {args.feature} (default):  median {result['checked_median_us']:.1f} us per call")
    print(f"  {knob}={off}:  median {result['unchecked_median_us']:.1f} us per call")
    print(f"  cost (paired blocks): x{result['ratio_median']:.4f}, 95% interval x{low:.4f} .. x{high:.4f}")
    if args.json:
        with open(args.json, "w") as out:
            json.dump(result, out, indent=1)
        print(f"  wrote {args.json}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--feature", choices=sorted(FEATURES), default="fingerprint")
    parser.add_argument("--world-size", type=int, default=2)
    parser.add_argument("--bytes", type=int, default=8)
    parser.add_argument("--blocks", type=int, default=300)
    parser.add_argument("--iters", type=int, default=200)
    parser.add_argument("--groups", type=int, default=4, help="groups per side (see above)")
    parser.add_argument("--json")
    parser.add_argument("--null", type=int, default=0, help="1: both groups checked (the method's null result)")
    args = parser.parse_args()
    if args.world_size < 2 or args.blocks < 2 or args.iters < 1:
        parser.error("--world-size >= 2, --blocks >= 2 and --iters >= 1")
    with tempfile.TemporaryDirectory(prefix="ddplite-fpcost-") as folder:
        mp.spawn(rank_main, args=(args, os.path.join(folder, "store")), nprocs=args.world_size)


if __name__ == "__main__":
    main()
