"""Hugging Face Accelerate on ddplite, on CPU.

    torchrun --nproc-per-node 2 examples/accelerate_train.py
    torchrun --nproc-per-node 2 examples/accelerate_train.py --backend gloo   # the same on gloo

Accelerate picks the backend itself and, on CPU, refuses any but gloo or mpi
(``InitProcessGroupKwargs(backend="ddplite")``: "Your assigned backend ddplite is not available,
please use gloo"). It does adopt a process group that already exists, so the recipe is one line:
``dist.init_process_group("ddplite")`` before ``Accelerator(cpu=True)``. Everything after is
Accelerate's own: prepare, backward, wait_for_everyone, gather_for_metrics, reduce. (Accelerate
then reports ``state.backend == "gloo"``: its name for any CPU group, not what runs.)
"""

import argparse
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from accelerate import Accelerator
from torch.utils.data import DataLoader, TensorDataset


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--backend", default="ddplite", help="ddplite (default) or gloo")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=32, help="per process")
    parser.add_argument("--samples", type=int, default=1024)
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--save-params", metavar="PATH", help="the main process writes the final parameters here")
    return parser.parse_args()


def dataset(samples, seed, split):
    """A learnable classification problem: 10 classes, each a point in 32 dimensions (the same for
    every split), plus noise; `split` draws other samples of it."""
    centres = torch.randn(10, 32, generator=torch.Generator().manual_seed(seed))
    generator = torch.Generator().manual_seed(seed * 1000 + split)
    labels = torch.randint(0, 10, (samples,), generator=generator)
    return TensorDataset(centres[labels] + 1.5 * torch.randn(samples, 32, generator=generator), labels)


def main():
    args = parse_args()
    dist.init_process_group(args.backend)  # before Accelerator: it adopts this group
    accelerator = Accelerator(cpu=True)
    torch.manual_seed(args.seed)
    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 10))
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    train = DataLoader(dataset(args.samples, args.seed, 0), batch_size=args.batch_size, shuffle=True,
                       generator=torch.Generator().manual_seed(args.seed))
    test = DataLoader(dataset(args.samples // 4, args.seed, 1), batch_size=args.batch_size)
    model, optimizer, train, test = accelerator.prepare(model, optimizer, train, test)
    started = time.perf_counter()
    for epoch in range(args.epochs):
        model.train()
        for inputs, labels in train:
            optimizer.zero_grad()
            loss = nn.functional.cross_entropy(model(inputs), labels)
            accelerator.backward(loss)
            optimizer.step()
        model.eval()
        correct = []
        with torch.no_grad():
            for inputs, labels in test:
                predictions = model(inputs).argmax(dim=1)
                correct.append(accelerator.gather_for_metrics(predictions == labels))
        mean_loss = accelerator.reduce(loss.detach().reshape(1), reduction="mean")
        accelerator.print(f"epoch {epoch}: loss {mean_loss.item():.4f} test accuracy {torch.cat(correct).float().mean():.3f}")
    accelerator.wait_for_everyone()
    if args.save_params and accelerator.is_main_process:
        torch.save({name: p.detach() for name, p in accelerator.unwrap_model(model).named_parameters()},
                   args.save_params)
    accelerator.print(f"done: backend={dist.get_backend()} processes={accelerator.num_processes} "
                      f"accelerate_backend={accelerator.state.backend} wall={time.perf_counter() - started:.1f}s")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
