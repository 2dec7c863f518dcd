"""Soak, the full run (tests/test_soak.py runs a slice in CI): `--ops` random
collectives on integer data (random ops, sizes 0 to 65537, dtypes, roots, reduce ops, two ddplite
groups used alternately) through ddplite and through gloo on the same inputs, compared bit for
bit; RSS, open descriptors and threads sampled after the warm-up and at the end; then
`--group-rounds` rounds of new_group / all_reduce / destroy (tests/soak_workers.py).

    python scripts/soak.py [--ops 100000] [--group-rounds 200] [--world-size 2] [--seed 0]
"""

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests"))

import soak_workers  # noqa: E402
from harness import run_ranks  # noqa: E402


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ops", type=int, default=100_000)
    parser.add_argument("--group-rounds", type=int, default=200)
    parser.add_argument("--world-size", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    options = parser.parse_args()
    start = time.monotonic()
    results = run_ranks(soak_workers.soak, options.world_size, options.ops, options.seed, options.group_rounds,
                        timeout_s=6 * 3600)
    failed = False
    for rank, result in enumerate(results):
        samples = result["samples"]
        ops_growth = soak_workers.growth(samples, "after_warm_up", "after_ops")
        group_growth = soak_workers.growth(samples, "before_groups", "after_groups")
        print(f"rank {rank}: {options.ops} collectives, {len(result['mismatches'])} differing from gloo; "
              f"RSS/fds/threads {samples['after_warm_up']} -> {samples['after_ops']} "
              f"(growth {', '.join(f'{g:+.1%}' for g in ops_growth)}); {options.group_rounds} new_group/destroy: "
              f"{samples['before_groups']} -> {samples['after_groups']} "
              f"(growth {', '.join(f'{g:+.1%}' for g in group_growth)})", flush=True)
        for mismatch in result["mismatches"][:10]:
            print("  " + mismatch)
        failed = failed or bool(result["mismatches"]) or max(ops_growth) >= 0.05 or max(group_growth) >= 0.05
    print(f"# {time.monotonic() - start:.0f} s", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
