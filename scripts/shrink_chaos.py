"""Random kills recovered by shrink, checked bitwise: each trial runs examples/train_fault_tolerant.py
with a random rank count (2-6), victim, kill step and CPU path (shared memory, TCP, or a group
across 2-3 hosts); the survivors shrink and finish, and their final parameters must equal, bit for
bit, those of a fresh (N-1)-rank run resumed from the state they carried on from
(--checkpoint-at-shrink, --resume), on the same hosts as the survivors.

Hosts are Linux network namespaces (tests/test_multihost.py's, which needs root and iproute2): the
ranks of a trial are spread over them at random, each host holding one or more, so that the group
is hierarchical (shared memory inside a host, TCP between one leader per host); a process apart on
host 0 holds the store, as torchrun's agent would. Without namespaces the trials use the other two
paths only, and say so.

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
sys.path.insert(0, os.path.join(REPO, "tests"))


def run(arguments, transport, layout=None):
    """The example on one host (its own launcher), or with layout (host of each rank) across hosts."""
    common = ["--samples", str(SAMPLES), "--batch-size", str(BATCH), "--epochs", str(EPOCHS), *arguments]
    if layout is not None:
        return run_across_hosts(common, layout)
    env = dict(os.environ, DDPLITE_CPU_TRANSPORT=transport)
    done = subprocess.run([sys.executable, EXAMPLE, *common], capture_output=True, text=True, timeout=600,
                          cwd=REPO, env=env)
    return done.returncode, done.stdout + done.stderr[-3000:]


def run_across_hosts(arguments, layout):
    """What the example's launcher does, across namespaces: a store host on host 0, then one
    `--worker` process per rank on its host. Exit 0 when every rank but --kill-rank finished."""
    import test_multihost

    network = test_multihost.Hosts(max(layout) + 1)
    address, port = network.addresses[0], test_multihost.STORE_PORT
    try:
        store = subprocess.Popen(network.run(0, [sys.executable, "-c", test_multihost.STORE_HOST, address, str(port)]),
                                 stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        while store.stdout.readline().strip() not in ("STORE READY", ""):
            pass
        env = dict(os.environ, MASTER_ADDR=address, MASTER_PORT=str(port), WORLD_SIZE=str(len(layout)),
                   DDPLITE_SOCKET_IFNAME="eth0")
        ranks = [subprocess.Popen(network.run(host, [sys.executable, EXAMPLE, "--worker", *arguments]),
                                  env=dict(env, RANK=str(rank)), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                  text=True, cwd=REPO)
                 for rank, host in enumerate(layout)]
        outputs = [rank.communicate(timeout=600)[0] for rank in ranks]
        codes = [rank.returncode for rank in ranks]
    finally:
        network.destroy()
    victim = int(arguments[arguments.index("--kill-rank") + 1]) if "--kill-rank" in arguments else -1
    lost = [rank for rank, code in enumerate(codes) if code != 0]
    output = "".join(outputs)
    return (0 if lost == ([victim] if victim >= 0 else []) else 1), output[-6000:] + f"\nexit codes {codes}"


def trial(rng, folder, index, paths, hosts_available):
    import torch

    nproc = rng.randint(2, 6)
    victim = rng.randrange(nproc)
    steps = EPOCHS * (SAMPLES // (BATCH * nproc))
    kill_at = rng.randrange(steps)
    transport = rng.choice([path for path in paths if path != "hosts" or hosts_available])
    layout = survivors_layout = None
    if transport == "hosts":
        host_count = rng.randint(2, min(3, nproc))
        layout = list(range(host_count)) + [rng.randrange(host_count) for _ in range(nproc - host_count)]
        rng.shuffle(layout)
        survivors_layout = [host for rank, host in enumerate(layout) if rank != victim]
        survivors_layout = [sorted(set(survivors_layout)).index(host) for host in survivors_layout]
    checkpoint, shrunk, fresh = (os.path.join(folder, f"{index}-{name}.pt") for name in ("at", "shrunk", "fresh"))
    started = time.monotonic()
    code, output = run(["--nproc", str(nproc), "--kill-rank", str(victim), "--kill-at-step", str(kill_at),
                        "--checkpoint-at-shrink", checkpoint, "--save-params", shrunk], transport, layout)
    outcome = {"nproc": nproc, "victim": victim, "kill_at_step": kill_at, "transport": transport}
    if layout is not None:
        outcome["host_of_each_rank"] = layout
    noticed = [float(s) for s in re.findall(r"DistBackendError after ([\d.]+) s", output)]
    outcome["survivors_reported"] = len(noticed)
    outcome["worst_noticed_s"] = max(noticed) if noticed else None
    if code != 0 or len(noticed) != nproc - 1:
        return dict(outcome, ok=False, why=f"shrink run: exit {code}", output=output[-3000:])
    code, resumed = run(["--nproc", str(nproc - 1), "--resume", checkpoint, "--save-params", fresh], transport,
                        survivors_layout)
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
    parser.add_argument("--paths", default="auto,tcp,hosts",
                        help="CPU paths to draw from: auto (shared memory), tcp, hosts (default: all three)")
    args = parser.parse_args()
    rng = random.Random(args.seed)
    import test_multihost

    hosts_available = test_multihost._UNAVAILABLE is None
    if not hosts_available:
        print(f"no groups across hosts in these trials: {test_multihost._UNAVAILABLE}", flush=True)
    results = []
    with tempfile.TemporaryDirectory(prefix="ddplite-shrink-chaos-") as folder:
        for index in range(args.trials):
            result = trial(rng, folder, index, args.paths.split(","), hosts_available)
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
