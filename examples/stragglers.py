"""Straggler scores from the collectives themselves: a DDP job in which one rank is slower.

    torchrun --nproc-per-node 4 examples/stragglers.py --slow-rank 2 --slowdown 1.3 --steps 20

Each step spends --step-ms outside the collectives (a sleep, standing for the data loader and
the forward pass; the slow rank sleeps --slowdown times as long), then runs a small model's
forward and backward under DistributedDataParallel (its all_reduce) and the optimiser. Every
--every steps, every rank calls torch_ddp_lite.stragglers() (a collective) and rank 0 prints the
table: likeliest straggler first. No code is marked: the scores come from when each rank
arrived at each collective and when it ended, on its own clock.
"""

import argparse
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

import torch_ddp_lite


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--slow-rank", type=int, default=2)
    parser.add_argument("--slowdown", type=float, default=1.3)
    parser.add_argument("--step-ms", type=float, default=20.0)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--every", type=int, default=10)
    args = parser.parse_args()
    torch.set_num_threads(1)  # several ranks per core here: one intra-op thread each
    dist.init_process_group("ddplite")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = DistributedDataParallel(torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(),
                                                        torch.nn.Linear(64, 8)))
    optimiser = torch.optim.SGD(model.parameters(), lr=0.01)
    data = torch.randn(16, 32)
    for step in range(1, args.steps + 1):
        time.sleep(args.step_ms / 1000 * (args.slowdown if rank == args.slow_rank else 1.0))
        optimiser.zero_grad()
        model(data).sum().backward()
        optimiser.step()
        if step % args.every == 0:
            table = torch_ddp_lite.stragglers()
            if rank == 0:
                print(f"after {step} steps:\n{table}\n", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
