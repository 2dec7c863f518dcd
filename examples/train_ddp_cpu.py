"""The minimal example: data-parallel training on CPU with stock DistributedDataParallel, through ddplite.

    torchrun --nproc-per-node 2 examples/train_ddp_cpu.py

The only ddplite-specific thing is the backend name (``--backend gloo`` runs the same script on
gloo for comparison). The data is a synthetic CIFAR-shaped classification problem (class-dependent
patterns plus noise) generated in memory, so nothing is downloaded. The main job,
examples/train_cifar10.py, trains a ResNet on data in the CIFAR-10 file format, with checkpoints.
"""

import argparse
import os
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", default="ddplite", help="ddplite (default) or gloo")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=64, help="per rank")
    parser.add_argument("--samples", type=int, default=4096)
    parser.add_argument("--lr", type=float, default=0.02, help="per rank; scaled by world size")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--init-method", default="env://",
                        help="env:// (torchrun, srun, mpirun), mpi:// (MPI gives rank and size), tcp://IP:PORT, file://")
    parser.add_argument("--save-params", metavar="PREFIX",
                        help="each rank writes its final parameters to PREFIX.rank<R>.pt (to compare runs)")
    return parser.parse_args()


def synthetic_cifar(samples, seed):
    """32x32 RGB images: a smooth colour pattern per class, plus pixel noise. Learnable, like CIFAR."""
    generator = torch.Generator().manual_seed(seed)
    coarse = torch.randn(10, 3, 4, 4, generator=generator)
    patterns = nn.functional.interpolate(coarse, size=(32, 32), mode="bilinear", align_corners=False)
    labels = torch.randint(0, 10, (samples,), generator=generator)
    images = patterns[labels] + torch.randn(samples, 3, 32, 32, generator=generator)
    return TensorDataset(images, labels)


def small_cnn():
    return nn.Sequential(
        nn.Conv2d(3, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(32, 64, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(64, 64, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
        nn.Flatten(), nn.Linear(64, 10),
    )


def params_in_sync(model):
    """True when every rank holds the same parameters (what DDP guarantees)."""
    checksum = torch.stack([p.detach().double().sum() for p in model.parameters()]).sum().reshape(1)
    gathered = [torch.zeros_like(checksum) for _ in range(dist.get_world_size())]
    dist.all_gather(gathered, checksum)
    return all(torch.equal(g, gathered[0]) for g in gathered)


def main():
    args = parse_args()
    dist.init_process_group(backend=args.backend, init_method=args.init_method)
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(args.seed)

    dataset = synthetic_cifar(args.samples, args.seed)
    sampler = DistributedSampler(dataset, shuffle=True, seed=args.seed)
    loader = DataLoader(dataset, batch_size=args.batch_size, sampler=sampler, drop_last=True)
    model = DistributedDataParallel(small_cnn())
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr * world, momentum=0.9)
    loss_fn = nn.CrossEntropyLoss()

    if rank == 0:
        print(f"backend={dist.get_backend()} world_size={world} samples={args.samples} "
              f"batch={args.batch_size}/rank torch={torch.__version__}", flush=True)
    start = time.perf_counter()
    images_seen = 0
    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        stats = torch.zeros(3)  # loss sum, correct, count
        for images, labels in loader:
            optimizer.zero_grad()
            logits = model(images)
            loss = loss_fn(logits, labels)
            loss.backward()
            optimizer.step()
            stats += torch.tensor([loss.item() * len(labels), (logits.argmax(1) == labels).sum().item(), len(labels)])
            images_seen += len(labels) * world
        dist.all_reduce(stats)
        if rank == 0:
            print(f"epoch {epoch}: loss {stats[0] / stats[2]:.4f}  train accuracy {stats[1] / stats[2]:.3f}", flush=True)
    elapsed = time.perf_counter() - start
    in_sync = params_in_sync(model.module)
    if args.save_params:
        torch.save({name: p.detach() for name, p in model.module.named_parameters()},
                   f"{args.save_params}.rank{rank}.pt")
    if rank == 0:
        print(f"done: backend={dist.get_backend()} world_size={world} images/s={images_seen / elapsed:.0f} "
              f"wall={elapsed:.1f}s params_in_sync={in_sync}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
