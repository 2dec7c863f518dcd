"""Chaos runs: 2-4-rank DDP training on CPU through ddplite (tests/chaos_job.py), one
rank killed with SIGKILL, or stopped with SIGSTOP, at a random moment. Every survivor must raise
a DistBackendError naming that rank within the group's timeout + 5 s (a killed rank is noticed
long before: its sockets close) and leave a flight-recorder dump that loads, holding the op that
failed; afterwards no process of the job and no /dev/shm segment of it may be left.

Used by scripts/chaos.py (the full run, figures in docs/reliability.md) and tests/test_chaos.py
(the quick slice in CI).
"""

import os
import pickle
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from datetime import timedelta

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
JOB = os.path.join(REPO, "tests", "chaos_job.py")
KILL_TIMEOUT_S = 30.0  # group timeout when a rank is killed: detection must not wait for it
STOP_TIMEOUT_S = 4.0   # group timeout when a rank is stopped: only the timeout can tell
SLACK_S = 5.0


@dataclass
class Outcome:
    kind: str
    world_size: int
    victim: int
    problems: list = field(default_factory=list)
    detection_s: list = field(default_factory=list)  # per survivor: error time - signal time
    dumps: int = 0  # survivors whose flight-recorder dump was checked


def shm_segments():
    return {name for name in os.listdir("/dev/shm") if name.startswith("ddplite-")}


def start_ranks(world_size, port, timeout_s, trace_dir):
    ranks = []
    for rank in range(world_size):
        env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                   WORLD_SIZE=str(world_size), LOCAL_RANK=str(rank), TORCHELASTIC_USE_AGENT_STORE="True",
                   CHAOS_TIMEOUT_S=str(timeout_s), OMP_NUM_THREADS="1", DDPLITE_TRACE_DIR=trace_dir)
        ranks.append(subprocess.Popen([sys.executable, JOB], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                      text=True, env=env, cwd=REPO))
    return ranks


def wait_until_training(ranks, seconds):
    """Reads each rank's output until it prints its first STEP line; returns the lines read."""
    import selectors

    lines = {index: [] for index in range(len(ranks))}
    training = set()
    selector = selectors.DefaultSelector()
    for index, rank in enumerate(ranks):
        selector.register(rank.stdout, selectors.EVENT_READ, index)
    until = time.monotonic() + seconds
    while len(training) < len(ranks) and time.monotonic() < until:
        for key, _ in selector.select(timeout=0.2):
            line = key.fileobj.readline()
            if line:
                lines[key.data].append(line)
                if line.startswith("STEP"):
                    training.add(key.data)
    selector.close()
    return lines, len(training) == len(ranks)


def one_run(kind, world_size, rng):
    import torch.distributed as dist

    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=60))
    before = shm_segments()
    victim = rng.randrange(world_size)
    outcome = Outcome(kind, world_size, victim)
    timeout_s = KILL_TIMEOUT_S if kind == "kill" else STOP_TIMEOUT_S
    trace_dir = tempfile.mkdtemp(prefix="ddplite-chaos-traces-")
    ranks = start_ranks(world_size, store.port, timeout_s, trace_dir)
    try:
        early, training = wait_until_training(ranks, 60)
        if not training:
            outcome.problems.append(f"the job did not start training: {early}")
            return outcome
        time.sleep(rng.uniform(0.2, 2.0))
        signalled_at = time.monotonic()
        ranks[victim].send_signal(signal.SIGKILL if kind == "kill" else signal.SIGSTOP)
        for index, rank in enumerate(ranks):
            if index == victim:
                continue
            try:
                out, _ = rank.communicate(timeout=timeout_s + SLACK_S + 30)
            except subprocess.TimeoutExpired:
                outcome.problems.append(f"rank {index} still runs {timeout_s + SLACK_S + 30:.0f} s after the signal")
                continue
            if rank.returncode != 3:
                outcome.problems.append(f"rank {index} exited with {rank.returncode}, not by its own error path")
            errors = [line for line in out.splitlines() if line.startswith("ERROR ")]
            if not errors:
                outcome.problems.append(f"rank {index} ended without an error: {out[-800:]}")
                continue
            _, name, at, message = errors[0].split(" ", 3)
            detection = float(at) - signalled_at
            outcome.detection_s.append(detection)
            if name != "DistBackendError":
                outcome.problems.append(f"rank {index} raised {name}: {message[:300]}")
            if f"rank {victim}" not in message:
                outcome.problems.append(f"rank {index}'s error does not name rank {victim}: {message[:400]}")
            if detection > timeout_s + SLACK_S:
                outcome.problems.append(f"rank {index} raised {detection:.1f} s after the signal "
                                        f"(timeout {timeout_s:.0f} s + {SLACK_S:.0f} s)")
            check_dump(outcome, index, trace_dir, message)
    finally:
        for rank in ranks:
            if rank.poll() is None:
                rank.kill()
            rank.wait()
        store = None
        shutil.rmtree(trace_dir, ignore_errors=True)
    left = shm_segments() - before
    if left:
        outcome.problems.append(f"segments left in /dev/shm: {sorted(left)}")
    return outcome


def check_dump(outcome, rank, trace_dir, message):
    """The survivor's flight-recorder dump: written before the error was raised, named in it, in
    torch's format, and holding the op that failed (not completed)."""
    path = os.path.join(trace_dir, f"ddplite_trace_rank_{rank}")
    if not os.path.exists(path):
        outcome.problems.append(f"rank {rank} left no flight-recorder dump")
        return
    if path not in message:
        outcome.problems.append(f"rank {rank}'s error does not name its dump {path}")
    with open(path, "rb") as dump:
        trace = pickle.load(dump)
    if trace.get("version") != "2.10" or not any(e["state"] != "completed" for e in trace["entries"]):
        outcome.problems.append(f"rank {rank}'s dump holds no unfinished op: {trace.get('entries', [])[-2:]}")
    else:
        outcome.dumps += 1


def run_chaos(kills, stops, seed, world_sizes=(2, 3, 4)):
    rng = random.Random(seed)
    plan = ["kill"] * kills + ["stop"] * stops
    return [one_run(kind, rng.choice(world_sizes), rng) for kind in plan]
