"""The bad-input fuzz, full run (tests/test_fuzz.py runs a slice of it in CI): at each
world size, `--calls` random invalid calls of every collective, the same on every rank (bad
tensors: sparse, quantized, overlapping views up to 2^31 elements, unsupported dtypes; roots out of
range; list lengths, output sizes and all_to_all splits that do not add up; mixed and mismatched
dtypes; reduce ops a dtype does not have). Each must raise a Python exception, ddplite's naming
the rank, and the group must compute a correct all_reduce after every 5 calls.

    python scripts/fuzz_inputs.py [--calls 1000] [--world-sizes 2,3,4] [--seed 0]
"""

import argparse
import os
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "tests"))
sys.path.insert(0, REPO)

import fuzz_workers  # noqa: E402
from harness import run_ranks  # noqa: E402


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=1000)
    parser.add_argument("--world-sizes", default="2,3,4")
    parser.add_argument("--seed", type=int, default=0)
    options = parser.parse_args()
    failed = False
    for world_size in map(int, options.world_sizes.split(",")):
        results = run_ranks(fuzz_workers.fuzz_invalid_calls, world_size, options.calls, options.seed + world_size,
                            timeout_s=1800)
        problems = [f"rank {rank}: {problem}" for rank, result in enumerate(results) for problem in result["problems"]]
        kinds = results[0]["kinds"]
        print(f"world size {world_size}: {options.calls} invalid calls per rank; raised: "
              + ", ".join(f"{name} {count}" for name, count in sorted(kinds.items()))
              + f"; ddplite's own messages (naming op and rank): {results[0]['ddplite_messages']}; crashes 0, hangs 0; "
              f"problems {len(problems)}", flush=True)
        for problem in problems[:20]:
            print("  " + problem)
        failed = failed or bool(problems)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
