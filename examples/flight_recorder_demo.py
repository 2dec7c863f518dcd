"""A real hang, diagnosed with torch's own flight-recorder analyzer (docs/reliability.md).

Three ranks train-step through all_reduce; rank 2 then stops calling collectives (stuck in its own
code, as in a real hang). Ranks 0 and 1 time out in all_reduce #3 and dump their flight recorders
on their own before raising; rank 2 dumps when asked (torch_ddp_lite.dump_flight_recorder(), or
SIGUSR1 with DDPLITE_TRACE_SIGNAL=1). Then torch's analyzer reads the three dumps:

    python examples/flight_recorder_demo.py [--dir DIR] [--timeout 5]
"""

import argparse
import os
import subprocess
import sys
import tempfile
import time
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import torch_ddp_lite  # noqa: E402

WORLD_SIZE = 3
STUCK_RANK = 2


def rank_main(rank, store, trace_dir, timeout_s):
    os.environ["DDPLITE_TRACE_DIR"] = trace_dir
    dist.init_process_group("ddplite", init_method=f"file://{store}", rank=rank, world_size=WORLD_SIZE,
                            timeout=timedelta(seconds=timeout_s))
    grads = torch.ones(1024)
    for _ in range(2):
        dist.all_reduce(grads)
    if rank == STUCK_RANK:
        while not os.path.exists(os.path.join(trace_dir, "ddplite_trace_rank_0")):
            time.sleep(0.1)  # "stuck": never reaches all_reduce #3
        print(f"rank {rank}: dumped to {torch_ddp_lite.dump_flight_recorder()}", flush=True)
    else:
        try:
            dist.all_reduce(grads)
        except dist.DistBackendError as error:
            print(f"rank {rank}: {error}".split("\nHint")[0], flush=True)
    dist.destroy_process_group()


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dir", help="where the dumps go (default: a new temporary folder)")
    parser.add_argument("--timeout", type=float, default=5.0, help="the group's timeout, seconds")
    args = parser.parse_args()
    trace_dir = args.dir or tempfile.mkdtemp(prefix="ddplite-fr-demo-")
    os.makedirs(trace_dir, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="ddplite-fr-store-") as folder:
        mp.spawn(rank_main, args=(os.path.join(folder, "store"), trace_dir, args.timeout), nprocs=WORLD_SIZE)
    print(f"\n$ python -m torch.distributed.flight_recorder.fr_trace {trace_dir}", flush=True)
    analyzer = [sys.executable, "-m", "torch.distributed.flight_recorder.fr_trace", trace_dir]
    subprocess.run(analyzer, check=True)


if __name__ == "__main__":
    main()
