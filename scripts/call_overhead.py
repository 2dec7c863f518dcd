"""Per-call time of dist.barrier() and dist.all_reduce() of 2 floats in a tight loop, at world
size 1 (no peer: what torch's Python call and the dispatcher cost before and after ddplite
runs) and 2 (the shared-memory path). The yardstick behind docs/benchmarks.md's barrier figure.

    python scripts/call_overhead.py [--world-sizes 1,2] [--iterations 20000]
"""

import argparse
import os
import sys
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import torch_ddp_lite  # noqa: E402,F401  (registers the backend)


def rank_main(rank, world_size, port, iterations, backend):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group(backend, rank=rank, world_size=world_size)
    tensor = torch.ones(2)
    calls = {"barrier": dist.barrier, "all_reduce": lambda: dist.all_reduce(tensor)}
    for name, call in calls.items():
        for _ in range(200):
            call()
        dist.barrier()
        start = time.perf_counter()
        for _ in range(iterations):
            call()
        elapsed_us = (time.perf_counter() - start) / iterations * 1e6
        if rank == 0:
            print(f"{backend:>8} world_size {world_size}  {name:<10} {elapsed_us:7.1f} us/call", flush=True)
    dist.destroy_process_group()


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--world-sizes", default="1,2")
    parser.add_argument("--iterations", type=int, default=20000)
    parser.add_argument("--backend", default="ddplite")
    args = parser.parse_args()
    for offset, world_size in enumerate(int(w) for w in args.world_sizes.split(",")):
        mp.spawn(rank_main, args=(world_size, 29700 + offset, args.iterations, args.backend), nprocs=world_size)


if __name__ == "__main__":
    main()
