"""Ray Train on ddplite, on CPU: ``TorchConfig(backend="ddplite")`` is the whole recipe.

    python examples/ray_train.py --workers 2
    python examples/ray_train.py --workers 2 --backend gloo     # the same on gloo

Ray starts the workers, sets their ranks and the store's address, and passes the backend name to
``torch.distributed.init_process_group`` (ray/train/torch/config.py), which finds ddplite through
torch's backend registry like any script. ``ray.train.torch.prepare_model`` wraps the model in
DistributedDataParallel. With ``--address`` it joins a running Ray cluster instead of starting one
on this machine.
"""

import argparse
import json
import os
import tempfile
import time

import ray
import torch
import torch.distributed as dist
import torch.nn as nn
from ray.train import ScalingConfig
from ray.train.torch import TorchConfig, TorchTrainer, prepare_model


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--backend", default="ddplite", help="ddplite (default) or gloo")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--address", default=None, help="a running Ray cluster (default: start one here)")
    parser.add_argument("--save-params", metavar="PATH", help="worker 0 writes the final parameters here")
    return parser.parse_args()


def train_loop(config):
    """One Ray Train worker: a few DDP steps on data of its own, the same on every backend."""
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    model = prepare_model(nn.Sequential(nn.Linear(16, 32), nn.Tanh(), nn.Linear(32, 1)))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    generator = torch.Generator().manual_seed(100 + rank)
    started = time.perf_counter()
    for _ in range(config["steps"]):
        inputs = torch.randn(32, 16, generator=generator)
        loss = ((model(inputs) - inputs.sum(dim=1, keepdim=True)) ** 2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    summed = loss.detach().reshape(1)
    dist.all_reduce(summed)
    if rank == 0:
        # Ray Train keeps reported metrics only with a checkpoint: the result goes to a file.
        result = {"backend": dist.get_backend(), "world_size": world, "mean_loss": summed.item() / world,
                  "seconds": time.perf_counter() - started}
        with open(config["result_path"], "w") as out:
            json.dump(result, out)
        if config["save_params"]:
            torch.save({name: p.detach().clone() for name, p in model.module.named_parameters()},
                       config["save_params"])


def main():
    args = parse_args()
    ray.init(address=args.address, num_cpus=None if args.address else max(2, args.workers),
             include_dashboard=False, log_to_driver=False)
    with tempfile.TemporaryDirectory(prefix="ddplite-ray-") as folder:
        result_path = os.path.join(folder, "result.json")
        trainer = TorchTrainer(
            train_loop,
            train_loop_config={"steps": args.steps, "result_path": result_path,
                               "save_params": os.path.abspath(args.save_params) if args.save_params else None},
            torch_config=TorchConfig(backend=args.backend),
            scaling_config=ScalingConfig(num_workers=args.workers, use_gpu=False),
            run_config=ray.train.RunConfig(storage_path=folder, name="ddplite"),
        )
        trainer.fit()
        with open(result_path) as result:
            outcome = json.load(result)
    print(f"done: backend={outcome['backend']} world_size={outcome['world_size']} "
          f"mean_loss={outcome['mean_loss']:.6f} wall={outcome['seconds']:.1f}s", flush=True)
    ray.shutdown()


if __name__ == "__main__":
    main()
