"""What a lost rank costs the same job two ways: the survivors shrink in place, or torchrun
(--max-restarts 1) ends every rank and starts them again from a checkpoint written every step.
Both with and without forked DataLoader workers; the four settings are interleaved in each repeat.

    python scripts/recovery_cost.py --repeats 3 --json docs/data/fault/recovery_cost.json

The job is examples/train_fault_tolerant.py: 4 ranks of DDP on ddplite, rank 2 SIGKILLs itself at
global step 6 (--report-times prints the kill's wall-clock time, and each rank's first completed step
after it). Printed per setting, median over the repeats: seconds from the kill to the first and to
the last rank's first step after it (the job trains again), and the job's wall time.
"""

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXAMPLE = os.path.join(REPO, "examples", "train_fault_tolerant.py")
JOB = ["--kill-rank", "2", "--kill-at-step", "6", "--epochs", "1", "--report-times"]
SETTINGS = [("shrink", 0), ("shrink", 2), ("torchrun restart", 0), ("torchrun restart", 2)]


def command(how, workers, folder):
    job = JOB + ["--loader-workers", str(workers)]
    if how == "shrink":
        return [sys.executable, EXAMPLE, "--nproc", "4", *job]
    checkpoint = os.path.join(folder, f"checkpoint-{time.monotonic_ns()}.pt")
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "4",
            "--max-restarts", "1", EXAMPLE, "--worker", *job, "--checkpoint", checkpoint]


def one_run(how, workers, folder):
    started = time.monotonic()
    done = subprocess.run(command(how, workers, folder), capture_output=True, text=True, timeout=600, cwd=REPO)
    wall = time.monotonic() - started
    output = done.stdout + done.stderr
    kill = re.search(r"rank 2: SIGKILL at t=([\d.]+)", output)
    firsts = [float(t) for t in re.findall(r"rank \d+: first step after the failure done at t=([\d.]+)", output)]
    expected_back = 3 if how == "shrink" else 4  # a torchrun run must not have shrunk first
    if done.returncode != 0 or not kill or len(firsts) != expected_back or (how != "shrink" and "lost rank(s)" in output):
        raise RuntimeError(f"{how} with {workers} workers failed (exit {done.returncode}):\n{output[-4000:]}")
    killed = float(kill.group(1))
    return {"first_rank_back_s": min(firsts) - killed, "last_rank_back_s": max(firsts) - killed,
            "ranks_back": len(firsts), "wall_s": wall}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", help="write the runs and medians here")
    args = parser.parse_args()
    runs = {f"{how}, {workers} workers": [] for how, workers in SETTINGS}
    with tempfile.TemporaryDirectory(prefix="ddplite-recovery-") as folder:
        for repeat in range(args.repeats):
            for how, workers in SETTINGS:
                result = one_run(how, workers, folder)
                runs[f"{how}, {workers} workers"].append(result)
                print(f"repeat {repeat}: {how}, {workers} workers: {result}", flush=True)
    medians = {name: {key: statistics.median(run[key] for run in results) for key in results[0]}
               for name, results in runs.items()}
    print(f"\n{'setting':<32} {'first rank back':>16} {'last rank back':>15} {'job wall':>9}")
    for name, median in medians.items():
        print(f"{name:<32} {median['first_rank_back_s']:>14.2f} s {median['last_rank_back_s']:>13.2f} s "
              f"{median['wall_s']:>7.1f} s")
    if args.json:
        with open(args.json, "w") as out:
            json.dump({"command": "python scripts/recovery_cost.py " + " ".join(sys.argv[1:]),
                       "medians": medians, "runs": runs}, out, indent=1)


if __name__ == "__main__":
    main()
