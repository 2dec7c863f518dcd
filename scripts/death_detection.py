"""How long after a rank is SIGKILLed its peers notice, with and without forked DataLoader
workers alive in the killed rank (they hold copies of its descriptors). Backends and settings are
interleaved within each repeat, so a noisy machine affects them alike.

    python scripts/death_detection.py --repeats 3

Each run: 3 ranks on this host (tcp:// store on 127.0.0.1). Rank 2 optionally starts a DataLoader
with 2 persistent forked workers, then all ranks pass a barrier, rank 2 SIGKILLs itself 0.5 s later
while ranks 0 and 1 wait in an all_reduce. Printed: the time from the kill to each survivor's
exception (worst of the two), median over the repeats.
"""

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time

RANK = r'''
import os, signal, sys, time, torch, torch.distributed as dist
from torch.utils.data import DataLoader, TensorDataset
backend, rank, workers, port, kill_file = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], sys.argv[5]
if backend == "ddplite":
    import torch_ddp_lite
dist.init_process_group(backend, rank=rank, world_size=3, init_method="tcp://127.0.0.1:" + port)
tensor = torch.ones(256)
dist.all_reduce(tensor)
if rank == 2 and workers:
    loader = DataLoader(TensorDataset(torch.arange(64.0)), batch_size=8, num_workers=workers,
                        persistent_workers=True, multiprocessing_context="fork")
    next(iter(loader))
dist.barrier()
if rank == 2:
    time.sleep(0.5)
    with open(kill_file, "w") as out:
        out.write(repr(time.time()))
    os.kill(os.getpid(), signal.SIGKILL)
try:
    dist.all_reduce(tensor)
    print("RESULT null", flush=True)
except Exception as error:
    print("RESULT", time.time(), type(error).__name__, flush=True)
os._exit(0)
'''

SETTINGS = [("ddplite", "tcp"), ("ddplite", "auto"), ("gloo", "-")]


def one_run(backend, transport, workers, port, folder):
    kill_file = os.path.join(folder, f"killed-{port}")
    env = dict(os.environ, DDPLITE_CPU_TRANSPORT=transport if transport != "-" else "auto")
    ranks = [subprocess.Popen([sys.executable, "-c", RANK, backend, str(r), str(workers), str(port), kill_file],
                              stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env)
             for r in range(3)]
    detected = []
    for rank in ranks[:2]:
        output, _ = rank.communicate(timeout=180)
        lines = [line.split() for line in output.splitlines() if line.startswith("RESULT")]
        if not lines or lines[0][1] == "null":
            raise RuntimeError(f"{backend}/{transport}: a survivor did not raise:\n{output}")
        detected.append(float(lines[0][1]))
    ranks[2].wait()
    with open(kill_file) as source:
        killed = float(source.read())
    return max(detected) - killed


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", help="also write the raw seconds here")
    args = parser.parse_args()
    port = 29700 + os.getpid() % 200
    seconds = {}
    with tempfile.TemporaryDirectory(prefix="ddplite-detect-") as folder:
        for _ in range(args.repeats):
            for workers in (0, 2):
                for backend, transport in SETTINGS:
                    port += 1
                    seconds.setdefault(f"{backend}/{transport}/workers={workers}", []).append(
                        one_run(backend, transport, workers, port, folder))
    print(f"{'backend':<10} {'transport':<10} {'forked workers':>15} {'median s':>10} {'worst s':>10}")
    for key, values in seconds.items():
        backend, transport, workers = key.split("/")
        print(f"{backend:<10} {transport:<10} {workers.split('=')[1]:>15} {statistics.median(values):>10.2f} "
              f"{max(values):>10.2f}")
    if args.json:
        with open(args.json, "w") as out:
            json.dump(seconds, out, indent=1)


if __name__ == "__main__":
    main()
