"""Run by scripts/wheel_check.sh inside a fresh virtual environment that has the built wheel and
torch, and nothing else of this checkout: a 2-rank all_reduce and one DDP step through ddplite, each
checked against its closed form. Prints one JSON line."""
import json
import os
import sys
import tempfile

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.nn.parallel import DistributedDataParallel


def rank_main(rank, world_size, init_file, results):
    dist.init_process_group("ddplite", init_method=f"file://{init_file}", rank=rank, world_size=world_size)
    tensor = torch.arange(5, dtype=torch.float32) * (rank + 1)
    dist.all_reduce(tensor)
    torch.manual_seed(0)
    model = DistributedDataParallel(torch.nn.Linear(3, 1, bias=False))
    inputs = torch.full((2, 3), float(rank + 1))
    model(inputs).sum().backward()
    results[rank] = {"all_reduce": tensor.tolist(), "grad": model.module.weight.grad.flatten().tolist(),
                     "backend": dist.get_backend()}
    dist.destroy_process_group()


def main():
    import torch_ddp_lite

    world_size = 2
    with tempfile.TemporaryDirectory() as folder, mp.Manager() as manager:
        results = manager.dict()
        mp.spawn(rank_main, args=(world_size, os.path.join(folder, "init"), results), nprocs=world_size)
        results = dict(results)
    scale = sum(r + 1 for r in range(world_size))
    # d(sum(x W^T))/dW = column sums of x: 2 rows of (rank + 1); DDP averages over ranks.
    grad = 2.0 * scale / world_size
    ok = all(results[r]["all_reduce"] == [float(i * scale) for i in range(5)] for r in range(world_size)) and all(
        results[r]["grad"] == [grad] * 3 for r in range(world_size))
    print(json.dumps({"ok": ok, "package": torch_ddp_lite.__file__, "version": torch_ddp_lite.__version__,
                      "built_torch": torch_ddp_lite.built_torch_version(), "torch": torch.__version__,
                      "results": results}))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
