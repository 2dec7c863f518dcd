"""What ddplite shows of its ops: torch.profiler spans, Work._get_duration(), thread names.

    torchrun --nproc-per-node 2 examples/observe_ops.py [--trace trace.json]

Rank 0 prints the profiler's rows for ddplite's spans, each op's duration and the process's
ddplite threads; --trace writes rank 0's Chrome trace (open it in Perfetto or chrome://tracing).
"""

import argparse
import os

import torch
import torch.distributed as dist
from torch.profiler import ProfilerActivity, profile

import torch_ddp_lite  # noqa: F401 - registers the backend (torch's entry point normally has)


def thread_names():
    names = []
    for tid in sorted(os.listdir("/proc/self/task"), key=int):
        with open(f"/proc/self/task/{tid}/comm") as handle:
            names.append(handle.read().strip())
    return names


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trace", help="write rank 0's Chrome trace here")
    args = parser.parse_args()
    dist.init_process_group("ddplite")
    rank, world = dist.get_rank(), dist.get_world_size()
    dist.group.WORLD._enable_collectives_timing()  # Work._get_duration() from here on

    durations = []
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        for name, call in [
            ("all_reduce 4 MiB", lambda: dist.all_reduce(torch.ones(1 << 20), async_op=True)),
            ("broadcast 64 KiB", lambda: dist.broadcast(torch.ones(1 << 14), src=0, async_op=True)),
            ("all_gather_into_tensor", lambda: dist.all_gather_into_tensor(
                torch.empty(world * 1000), torch.ones(1000), async_op=True)),
            ("barrier", lambda: dist.barrier(async_op=True)),
        ]:
            work = call()
            work.wait()
            durations.append((name, work._get_duration()))

    if rank == 0:
        print(prof.key_averages(group_by_input_shape=True).table(
            sort_by="cpu_time_total", row_limit=8, max_name_column_width=28, max_shapes_column_width=24))
        for name, ms in durations:
            print(f"Work._get_duration()  {name:<24} {ms:8.3f} ms")
        print("threads:", ", ".join(sorted(set(thread_names()))))
        if args.trace:
            prof.export_chrome_trace(args.trace)
            print("Chrome trace:", args.trace)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
