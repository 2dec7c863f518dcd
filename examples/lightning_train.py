"""PyTorch Lightning on ddplite, on CPU: ``DDPStrategy(process_group_backend="ddplite")``.

    python examples/lightning_train.py --devices 2                     # Lightning starts the 2 processes
    torchrun --nproc-per-node 2 examples/lightning_train.py --devices 2 # or torchrun does
    python examples/lightning_train.py --devices 2 --backend gloo      # the same on gloo

Lightning passes the name to ``torch.distributed.init_process_group``; under Slurm its
SLURMEnvironment sets RANK and the rest itself (``srun python examples/lightning_train.py
--devices 2 --num-nodes 2``).
"""

import argparse

import lightning as L
import torch
import torch.distributed as dist
import torch.nn as nn
from lightning.pytorch.strategies import DDPStrategy
from torch.utils.data import DataLoader, TensorDataset


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--backend", default="ddplite", help="ddplite (default) or gloo")
    parser.add_argument("--devices", type=int, default=2, help="processes per node")
    parser.add_argument("--num-nodes", type=int, default=1)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--save-params", metavar="PATH", help="rank 0 writes the final parameters here")
    return parser.parse_args()


class Regression(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(16, 32), nn.Tanh(), nn.Linear(32, 1))

    def training_step(self, batch, _):
        inputs, targets = batch
        loss = nn.functional.mse_loss(self.net(inputs), targets)
        self.log("loss", loss, sync_dist=True)
        return loss

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.05)


def data():
    generator = torch.Generator().manual_seed(0)
    inputs = torch.randn(512, 16, generator=generator)
    return DataLoader(TensorDataset(inputs, inputs.sum(dim=1, keepdim=True)), batch_size=32)


def main():
    args = parse_args()
    L.seed_everything(0, verbose=False)
    model = Regression()
    trainer = L.Trainer(accelerator="cpu", devices=args.devices, num_nodes=args.num_nodes, max_epochs=args.epochs,
                        strategy=DDPStrategy(process_group_backend=args.backend), logger=False,
                        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                        deterministic=True)
    trainer.fit(model, data())
    if trainer.is_global_zero:
        if args.save_params:
            torch.save({name: p.detach().clone() for name, p in model.named_parameters()}, args.save_params)
        print(f"done: backend={dist.get_backend()} world_size={trainer.world_size} "
              f"loss={trainer.callback_metrics['loss'].item():.6f}", flush=True)


if __name__ == "__main__":
    main()
