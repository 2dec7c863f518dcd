"""One rank of a chaos run (scripts/chaos.py, tests/test_chaos.py): DDP training of a small MLP on
synthetic data through ddplite, launched with env:// variables, until the chaos script kills or
stops one rank. Prints "STEP <n>" now and then, and on the error every survivor must raise:
"ERROR <type> <time.monotonic()> <message on one line>". CHAOS_TIMEOUT_S: the group's timeout.
"""

import os
import sys
import time
from datetime import timedelta

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

import torch_ddp_lite  # noqa: F401  (registers the backend)


def main():
    torch.set_num_threads(1)
    dist.init_process_group("ddplite", timeout=timedelta(seconds=float(os.environ["CHAOS_TIMEOUT_S"])))
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = DistributedDataParallel(torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(),
                                                        torch.nn.Linear(256, 10)))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    generator = torch.Generator().manual_seed(rank)
    images, labels = torch.randn(32, 64, generator=generator), torch.randint(0, 10, (32,), generator=generator)
    try:
        for step in range(1_000_000):
            optimizer.zero_grad()
            torch.nn.functional.cross_entropy(model(images), labels).backward()
            optimizer.step()
            if step % 50 == 0:
                print(f"STEP {step}", flush=True)
    except Exception as error:  # noqa: BLE001
        now = time.monotonic()
        message = " ".join(str(error).split())
        print(f"ERROR {type(error).__name__} {now:.6f} {message}", flush=True)
        os._exit(3)  # the group is broken: no destroy, as a crashed job would not either
    return 0


if __name__ == "__main__":
    sys.exit(main())
