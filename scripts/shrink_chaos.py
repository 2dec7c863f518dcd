"""Random kills recovered by shrink, checked bitwise: each trial runs examples/train_fault_tolerant.py
with a random rank count (2-6), victim, kill step and CPU transport (shared memory or TCP); the
survivors shrink and finish, and their final parameters must equal, bit for bit, those of a fresh
(N-1)-rank run resumed from the state they carried on from (--checkpoint-at-shrink, --resume).

    python scripts/shrink_chaos.py --trials 20 --seed 0 --json docs/data/fault/shrink_chaos.json

tests/test_fault_tolerant_example.py is the quick slice in CI (4 ranks, rank 2, step 6, shared memory).
"""

import argparse
import json
import os
import random
import re
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXAMPLE = os.path.join(REPO, "examples", "train_fault_tolerant.py")
SAMPLES, BATCH, EPOCHS = 2048, 32, 2


def run(arguments, transport):
    env = dict(os.environ, DDPLITE_CPU_TRANSPORT=transport)
    done = subprocess.run([sys.executable, EXAMPLE, "--samples", str(SAMPLES), "--batch-size", str(BATCH),
                           "--epochs", str(EPOCHS), *arguments], capture_output=True, text=True, timeout=600,
                          cwd=REPO, env=env)
    return done.returncode, done.stdout + done.stderr[-3000:]


def trial(rng, folder, index):
    import torch

    nproc = rng.randint(2, 6)
    victim = rng.randrange(nproc)
    steps = EPOCHS * (SAMPLES // (BATCH * nproc))
    kill_at = rng.randrange(steps)
    transport = rng.choice(["auto", "tcp"])
    checkpoint, shrunk, fresh = (os.path.join(folder, f"{index}-{name}.pt") for name in ("at", "shrunk", "fresh"))
    started = time.monotonic()
    code, output = run(["--nproc", str(nproc), "--kill-rank", str(victim), "--kill-at-step", str(kill_at),
                        "--checkpoint-at-shrink", checkpoint, "--save-params", shrunk], transport)
    outcome = {"nproc": nproc, "victim": victim, "kill_at_step": kill_at, "transport": transport}
    noticed = [float(s) for s in re.findall(r"DistBackendError after ([\d.]+) s", output)]
    outcome["survivors_reported"] = len(noticed)
    outcome["worst_noticed_s"] = max(noticed) if noticed else None
    if code != 0 or len(noticed) != nproc - 1:
        return dict(outcome, ok=False, why=f"shrink run: exit {code}", output=output[-3000:])
    code, resumed = run(["--nproc", str(nproc - 1), "--resume", checkpoint, "--save-params", fresh], transport)
    if code != 0:
        return dict(outcome, ok=False, why=f"resumed run: exit {code}", output=resumed[-3000:])
    ours, theirs = torch.load(shrunk, weights_only=True), torch.load(fresh, weights_only=True)
    equal = len(ours) == len(theirs) and all(torch.equal(a, b) for a, b in zip(ours, theirs))
    return dict(outcome, ok=equal, why="" if equal else "parameters differ", wall_s=time.monotonic() - started)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=20)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", help="write every trial here")
    args = parser.parse_args()
    rng = random.Random(args.seed)
    results = []
    with tempfile.TemporaryDirectory(prefix="ddplite-shrink-chaos-") as folder:
        for index in range(args.trials):
            result = trial(rng, folder, index)
            results.append(result)
            shown = {k: v for k, v in result.items() if k != "output"}
            print(f"trial {index}: {shown}", flush=True)
            if not result["ok"]:
                print(result.get("output", ""), flush=True)
    passed = sum(r["ok"] for r in results)
    print(f"\n{passed} of {len(results)} random kills recovered by shrink with bitwise the parameters of a fresh "
          f"(N-1)-rank run from the same state")
    if args.json:
        with open(args.json, "w") as out:
            json.dump({"command": "python scripts/shrink_chaos.py " + " ".join(sys.argv[1:]), "passed": passed,
                       "trials": [{k: v for k, v in r.items() if k != "output"} for r in results]}, out, indent=1)
    return 0 if passed == len(results) else 1


if __name__ == "__main__":
    sys.exit(main())
