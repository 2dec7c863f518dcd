"""A job for tests/test_status.py, one process per rank (env:// rendezvous: MASTER_ADDR, MASTER_PORT,
RANK, WORLD_SIZE; with JOB_HALVES=1 the default group is gloo's and the loop runs on a ddplite group
of each half of the ranks): a few collectives, then "READY <rank> <pid>", then all_reduce in a loop until
the file argv[1] exists (every rank leaves at the same iteration: the flag is all-reduced). A rank
whose collective raises reports it, then waits for the file too, so that it can still be asked."""

import os
import sys
import time
from datetime import timedelta

import torch
import torch.distributed as dist

torch.set_num_threads(1)
stop_file = sys.argv[1]
slow_rank = int(sys.argv[2]) if len(sys.argv) > 2 else -1
rank = int(os.environ["RANK"])
timeout = timedelta(seconds=float(os.environ.get("JOB_TIMEOUT_S", "60")))
group = None
if os.environ.get("JOB_HALVES") == "1":  # a gloo default group; the loop on a ddplite group of each half
    dist.init_process_group("gloo", timeout=timeout)
    size, half = dist.get_world_size(), dist.get_world_size() // 2
    halves = [dist.new_group(list(range(half)), backend="ddplite"),
              dist.new_group(list(range(half, size)), backend="ddplite")]
    group = halves[rank >= half]
else:
    dist.init_process_group("ddplite", timeout=timeout)
flag = torch.zeros(1)
for _ in range(3):
    dist.all_reduce(flag, group=group)
dist.barrier(group=group)
print(f"READY {rank} {os.getpid()}", flush=True)
outcome = "ok"
try:
    while True:
        time.sleep(0.013 if rank == slow_rank else 0.01)
        flag.fill_(1.0 if os.path.exists(stop_file) else 0.0)
        dist.all_reduce(flag, group=group)
        if flag.item() > 0:
            break
except Exception as error:  # noqa: BLE001 - reported to the test
    outcome = f"{type(error).__name__}"
    print(f"RAISED {str(error)[:300]}", flush=True)
    while not os.path.exists(stop_file):
        time.sleep(0.05)
print(f"DONE {outcome}", flush=True)
if outcome == "ok":
    dist.destroy_process_group()
    sys.exit(0)
sys.stdout.flush()
os._exit(0)  # a broken group: nothing to tear down cleanly
