"""How long `python -m torch_ddp_lite.status` takes against a running job of N ranks on this
host (tests/status_job.py: all_reduce every 10 ms), with one rank stopped (SIGSTOP) or not:

    python scripts/status_at_scale.py --ranks 64 [--stop-rank 5] [--slow-rank 2] [--asks 5]

Prints, per ask, the query's own time (`took_s`: every rank asked at once) and the tool's wall
time from its start (Python's start included; the tool does not import torch), then the last
report's text.
"""

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ranks", type=int, default=64)
    parser.add_argument("--stop-rank", type=int, default=-1)
    parser.add_argument("--asks", type=int, default=5)
    parser.add_argument("--slow-rank", type=int, default=-1, help="this rank sleeps 13 ms per step, the others 10")
    args = parser.parse_args()
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    folder = tempfile.mkdtemp(prefix="ddplite-status-scale-")
    stop_file = os.path.join(folder, "stop")
    env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "WORLD_SIZE": str(args.ranks),
           "PYTHONPATH": os.pathsep.join(filter(None, [REPO, os.environ.get("PYTHONPATH")]))}
    ranks = [subprocess.Popen([sys.executable, os.path.join(REPO, "tests", "status_job.py"), stop_file,
                               str(args.slow_rank)],
                              env={**env, "RANK": str(r), "LOCAL_RANK": str(r)}, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True) for r in range(args.ranks)]
    try:
        started = time.monotonic()
        pids = []
        for process in ranks:
            line = ""
            while not line.startswith("READY "):
                line = process.stdout.readline()
                if not line:
                    raise SystemExit("a rank ended before it was ready")
            pids.append(int(line.split()[2]))
        print(f"{args.ranks} ranks ready in {time.monotonic() - started:.1f} s", flush=True)
        if args.stop_rank >= 0:
            os.kill(pids[args.stop_rank], signal.SIGSTOP)
            time.sleep(1.5)  # the others wait in the next all_reduce for over a second: a stall
        elif args.slow_rank >= 0:
            time.sleep(3)  # about 200 steps for the straggler table
        text = ""
        for ask in range(args.asks):
            begun = time.monotonic()
            done = subprocess.run([sys.executable, "-m", "torch_ddp_lite.status", f"127.0.0.1:{port}", "--json"],
                                  capture_output=True, text=True, cwd=REPO)
            wall = time.monotonic() - begun
            report = json.loads(done.stdout)
            outcomes = {}
            for entry in report["ranks"]:
                outcomes[entry["outcome"]] = outcomes.get(entry["outcome"], 0) + 1
            stalled = report["stalled"]
            print(f"ask {ask + 1}: query {report['took_s']:.3f} s, tool wall {wall:.2f} s, {outcomes}, stalled: "
                  f"{None if not stalled else (stalled['op'], stalled['seq'], stalled['not_arrived'])}", flush=True)
        text = subprocess.run([sys.executable, "-m", "torch_ddp_lite.status", f"127.0.0.1:{port}"],
                              capture_output=True, text=True, cwd=REPO).stdout
        print(text)
    finally:
        if args.stop_rank >= 0:
            os.kill(pids[args.stop_rank], signal.SIGCONT)
        open(stop_file, "w").close()
        for process in ranks:
            try:
                process.communicate(timeout=120)
            except subprocess.TimeoutExpired:
                process.kill()


if __name__ == "__main__":
    main()
