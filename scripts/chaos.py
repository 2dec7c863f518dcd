"""Chaos runs, the full suite (tests/test_chaos.py runs a slice in CI): 2-4-rank DDP
training on CPU, one random rank killed (SIGKILL) or stopped (SIGSTOP) at a random moment. Every
survivor must raise a DistBackendError naming that rank within the group's timeout + 5 s, exit by
its own error path, and leave no /dev/shm segment (tests/chaos_runner.py).

    python scripts/chaos.py [--kills 20] [--stops 4] [--seed 0]
"""

import argparse
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests"))

import chaos_runner  # noqa: E402


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--kills", type=int, default=20)
    parser.add_argument("--stops", type=int, default=4)
    parser.add_argument("--seed", type=int, default=0)
    options = parser.parse_args()
    outcomes = chaos_runner.run_chaos(options.kills, options.stops, options.seed)
    for kind, timeout in (("kill", chaos_runner.KILL_TIMEOUT_S), ("stop", chaos_runner.STOP_TIMEOUT_S)):
        runs = [outcome for outcome in outcomes if outcome.kind == kind]
        if not runs:
            continue
        clean = sum(1 for outcome in runs if not outcome.problems)
        times = sorted(t for outcome in runs for t in outcome.detection_s)
        detection = f"worst {times[-1]:.2f} s, median {times[len(times) // 2]:.2f} s" if times else "none measured"
        survivors = sum(o.world_size - 1 for o in runs)
        dumps = sum(o.dumps for o in runs)
        print(f"SIG{kind.upper()}: {clean}/{len(runs)} runs clean (world sizes "
              f"{sorted({o.world_size for o in runs})}, group timeout {timeout:.0f} s); survivors' detection "
              f"after the signal: {detection}; flight-recorder dumps: {dumps}/{survivors} survivors", flush=True)
        for outcome in runs:
            for problem in outcome.problems:
                print(f"  {kind} ws={outcome.world_size} victim={outcome.victim}: {problem}")
    return 0 if all(not outcome.problems for outcome in outcomes) else 1


if __name__ == "__main__":
    sys.exit(main())
