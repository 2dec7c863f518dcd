"""ResNet on CIFAR-10 with stock DistributedDataParallel, through ddplite.

    torchrun --standalone --nproc-per-node 2 examples/train_cifar10.py --arch resnet9 --width 16 --epochs 3
    python examples/train_cifar10.py --spawn 2 --arch resnet9 --width 16 --epochs 3   # mp.spawn, no launcher
    python examples/train_cifar10.py --dist-url tcp://10.0.0.1:23456 --world-size 2 --rank 0 ...  # each rank by hand
    python examples/train_cifar10.py --device cuda --backend nccl                    # one process, one GPU

The training side is stock PyTorch and torchvision: torchvision's ResNet-18 adapted to 32x32 images
(3x3 stem, no max-pool) or a ResNet-9 (``--arch resnet9``, ``--width`` scales it), wrapped in
DistributedDataParallel; DistributedSampler with set_epoch; SGD with Nesterov momentum and weight
decay; per-step linear warm-up then cosine decay; the learning rate scaled by the world size; mixed
precision (float16 with a GradScaler) and channels_last on CUDA, where each local rank takes GPU
``local_rank % device_count`` (more ranks than GPUs share them). The one ddplite-specific thing is
``backend="ddplite"``; ``--backend gloo`` or ``nccl`` runs the same script for comparison.

Launchers: torchrun (``env://``, single- or multi-node); ``--spawn N`` (torch.multiprocessing.spawn and a
``file://`` store, for one machine); ``--dist-url tcp://IP:PORT --world-size N --rank R``, the flags
of PyTorch's ImageNet example: each rank started by hand, on any machine, joined through rank 0's
``IP:PORT``; ``--spawn N --dist-url tcp://IP:PORT`` with ``--world-size M --rank R`` spawns N ranks on
each of M machines (this is machine R; global ranks R*N .. R*N+N-1); mpirun, detected from
Open MPI's and MPICH's variables, joins through ddplite's ``mpi://`` rendezvous (MPI gives rank
and size, MPI_Bcast the store's address); srun, detected from a Slurm job step's variables, joins
through ``tcp://`` on the step's first node (a port from the job id). A batch script's own process
in a job of several tasks (no srun) stops at once, saying so. Without any, one process trains.

Data: torchvision's CIFAR10 loader (``download=False``) on ``<data-dir>/cifar-10-batches-py``. When
that holds no CIFAR-10, a generated stand-in in the same file format is made once under
``--synthetic-dir`` and read by the same loader (examples/cifar10_data.py); the log says which
data was used. Nothing is downloaded.

Each epoch trains (a tqdm bar on rank 0), evaluates on the test split (sharded over the ranks, the
counts summed), and then rank 0 writes ``<checkpoint-dir>/checkpoint.pt`` atomically (model,
optimizer, scheduler, grad scaler, epoch, metrics, and every rank's RNG states) and refreshes
``<out-dir>/metrics.csv`` and ``metrics.png``. ``--resume`` continues from that checkpoint; on CPU
a run resumed with the same arguments and world size ends bitwise identical to an uninterrupted one.
"""

import argparse
import csv
import itertools
import math
import os
import random
import tempfile
import time
from dataclasses import dataclass

import numpy as np
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
import torch.nn.functional as F
import torchvision
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler, Subset
from torchvision.models.resnet import BasicBlock
from tqdm import tqdm

from cifar10_data import ensure_generated, generated_root, has_cifar10, is_generated, load_datasets

GENERATED_DATA = "generated CIFAR-format data (not the real CIFAR-10)"
CHECKPOINT_NAME = "checkpoint.pt"
# Arguments that shape the run: a resumed run that changes one of them cannot match an uninterrupted one.
RUN_SHAPING_ARGUMENTS = ("arch", "width", "epochs", "batch_size", "lr", "momentum", "weight_decay",
                         "warmup_epochs", "seed", "limit_train_batches")


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--backend", default="ddplite", help="process group backend: ddplite (default), gloo, nccl")
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument("--arch", choices=["resnet18", "resnet9"], default="resnet18")
    parser.add_argument("--width", type=int, default=64,
                        help="resnet9 only: channels of its first layer (64: the standard ResNet-9)")
    parser.add_argument("--epochs", type=int, default=30)
    parser.add_argument("--batch-size", type=int, default=128, help="per rank")
    parser.add_argument("--lr", type=float, default=0.05, help="per rank: SGD runs at lr x world size")
    parser.add_argument("--momentum", type=float, default=0.9)
    parser.add_argument("--weight-decay", type=float, default=5e-4)
    parser.add_argument("--warmup-epochs", type=float, default=1.0, help="linear warm-up, then cosine decay to 0")
    parser.add_argument("--data-dir", default="~/.cache/torch_ddp_lite/cifar10",
                        help="folder holding cifar-10-batches-py (the real CIFAR-10, unpacked)")
    parser.add_argument("--synthetic-dir", default="~/.cache/torch_ddp_lite/generated-cifar10",
                        help="where generated data is cached when --data-dir holds no CIFAR-10")
    parser.add_argument("--synthetic-train-size", type=int, default=50000)
    parser.add_argument("--synthetic-test-size", type=int, default=10000)
    parser.add_argument("--synthetic-seed", type=int, default=0)
    parser.add_argument("--workers", type=int, default=0, help="data loader processes per rank")
    parser.add_argument("--checkpoint-dir", default="runs/cifar10")
    parser.add_argument("--resume", action="store_true", help=f"continue from <checkpoint-dir>/{CHECKPOINT_NAME}")
    parser.add_argument("--out-dir", default="runs/cifar10", help="metrics.csv and metrics.png")
    parser.add_argument("--limit-train-batches", type=int, default=0, metavar="N", help="per epoch; 0: all")
    parser.add_argument("--limit-eval-batches", type=int, default=0, metavar="N", help="per rank; 0: all")
    parser.add_argument("--spawn", type=int, default=0, metavar="N", help="start N ranks with mp.spawn")
    parser.add_argument("--dist-url", default=None, metavar="URL",
                        help="init_method, e.g. tcp://IP:PORT (rank 0's machine and a free port); with --spawn "
                             "the default is a file:// store in a temporary folder")
    parser.add_argument("--world-size", type=int, default=None, metavar="N",
                        help="with --dist-url: the number of ranks; with --spawn: the number of machines (default 1)")
    parser.add_argument("--rank", type=int, default=None, metavar="R",
                        help="with --dist-url: this process's rank; with --spawn: this machine's index (default 0)")
    parser.add_argument("--local-rank", type=int, default=None, metavar="N",
                        help="with --dist-url: this rank's index on its machine (GPU choice; default 0)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if args.arch == "resnet18" and args.width != 64:
        parser.error("--width applies to resnet9 only (torchvision's ResNet-18 has fixed widths)")
    if not args.spawn and (args.dist_url, args.world_size, args.rank).count(None) not in (0, 3):
        parser.error("a rank started by hand needs all of --dist-url, --world-size and --rank")
    if args.rank is not None and args.world_size is None:
        parser.error("--rank needs --world-size")
    if args.world_size is not None and not 0 <= (args.rank or 0) < args.world_size:
        parser.error(f"--rank {args.rank} is outside 0 .. --world-size - 1 = {args.world_size - 1}")
    if args.spawn and args.world_size not in (None, 1) and args.dist_url is None:
        parser.error("--spawn on several machines (--world-size > 1) needs --dist-url tcp://IP:PORT")
    return args


# ----------------------------------------------------------------------------------------- launch

@dataclass
class Launch:
    launcher: str
    init_method: str
    rank: int
    world_size: int
    local_rank: int


def launch_from_environment():
    """The launch torchrun, an MPI launcher or a Slurm job step (srun) describes in the environment,
    or None. The MPI and Slurm variables are read as ddplite's env:// reads them
    (torch_ddp_lite/rendezvous.py), so any backend can run under them."""
    env = os.environ
    if "RANK" in env and "WORLD_SIZE" in env:
        return Launch("torchrun", "env://", int(env["RANK"]), int(env["WORLD_SIZE"]), int(env.get("LOCAL_RANK", 0)))
    from torch_ddp_lite import rendezvous

    batch_script = rendezvous.slurm_batch_without_srun()
    if batch_script is not None:
        raise SystemExit(f"train_cifar10.py: {batch_script}")
    launch = rendezvous.launcher_rank()
    if launch is None:
        return None
    if launch.launcher.uses_mpi:
        return Launch("mpirun", "mpi://", launch.rank, launch.world_size, launch.local_rank)
    store = rendezvous.slurm_store_address()
    if store is None:
        raise SystemExit("train_cifar10.py: started by Slurm, but neither SLURM_STEP_NODELIST and SLURM_JOB_ID nor "
                         "MASTER_ADDR and MASTER_PORT say where task 0 is; run it with srun")
    host, port, _ = store
    return Launch("srun", f"tcp://{f'[{host}]' if ':' in host else host}:{port}", launch.rank, launch.world_size,
                  launch.local_rank)


def launch_from_flags(args):
    """One rank started by hand: --dist-url, --world-size and --rank (PyTorch's ImageNet example)."""
    local_rank = args.local_rank if args.local_rank is not None else int(os.environ.get("LOCAL_RANK", 0))
    return Launch("dist-url", args.dist_url, args.rank, args.world_size, local_rank)


def spawn(args, processes):
    """Runs ``processes`` ranks on this machine (machine ``--rank`` of ``--world-size``), joined through
    ``--dist-url`` or, by default, a file:// store in a temporary folder."""
    machines, machine = args.world_size or 1, args.rank or 0
    with tempfile.TemporaryDirectory(prefix="ddplite-cifar10-") as folder:
        init_method = args.dist_url or "file://" + os.path.join(folder, "store")
        if processes == 1 and machines == 1:
            train(args, Launch("single process", init_method, 0, 1, 0))
        else:
            mp.spawn(spawned_rank, args=(args, processes, machines, machine, init_method), nprocs=processes)


def spawned_rank(local_rank, args, processes, machines, machine, init_method):
    # Keep the ranks from oversubscribing the cores (torchrun sets OMP_NUM_THREADS=1 for the same reason);
    # an OMP_NUM_THREADS of the user's wins.
    if "OMP_NUM_THREADS" not in os.environ:
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // processes))
    train(args, Launch("mp.spawn", init_method, machine * processes + local_rank, machines * processes, local_rank))


def init_process_group(backend, launch):
    if launch.init_method == "mpi://":
        import torch_ddp_lite  # noqa: F401 - registers mpi:// when torch's autoload is off; any backend can use it
    dist.init_process_group(backend, init_method=launch.init_method, rank=launch.rank, world_size=launch.world_size)


def select_device(kind, local_rank):
    if kind == "cpu":
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise SystemExit("--device cuda: no CUDA device is visible")
    device = torch.device("cuda", local_rank % torch.cuda.device_count())
    torch.cuda.set_device(device)
    torch.backends.cudnn.benchmark = True
    return device


def seed_everything(seed):
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


# ------------------------------------------------------------------------------------------ model

def build_model(arch, width):
    return cifar_resnet18() if arch == "resnet18" else resnet9(width)


def cifar_resnet18():
    """torchvision's ResNet-18 for 32x32 inputs: a 3x3 stride-1 stem and no max-pool."""
    model = torchvision.models.resnet18(num_classes=10)
    model.conv1 = nn.Conv2d(3, 64, kernel_size=3, stride=1, padding=1, bias=False)
    nn.init.kaiming_normal_(model.conv1.weight, mode="fan_out", nonlinearity="relu")
    model.maxpool = nn.Identity()
    return model


def conv_bn_relu(in_channels, out_channels):
    return [nn.Conv2d(in_channels, out_channels, 3, padding=1, bias=False),
            nn.BatchNorm2d(out_channels), nn.ReLU(inplace=True)]


def resnet9(width):
    """The DAWNBench ResNet-9 layout: a stem, three conv + max-pool stages with a residual block
    (torchvision's BasicBlock) after the first and the last, then a linear classifier. ``width`` 64
    gives the original channel counts. The global pooling is an average (the original takes the
    maximum and scales the logits by 1/8), which trains stably at the default learning rates."""
    return nn.Sequential(
        *conv_bn_relu(3, width),
        *conv_bn_relu(width, 2 * width), nn.MaxPool2d(2), BasicBlock(2 * width, 2 * width),
        *conv_bn_relu(2 * width, 4 * width), nn.MaxPool2d(2),
        *conv_bn_relu(4 * width, 8 * width), nn.MaxPool2d(2), BasicBlock(8 * width, 8 * width),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8 * width, 10),
    )


def warmup_cosine(optimizer, warmup_steps, total_steps):
    """Per-step schedule: linear warm-up to the full rate, then cosine decay to zero."""
    def factor(step):
        if step < warmup_steps:
            return (step + 1) / warmup_steps
        progress = (step - warmup_steps) / max(1, total_steps - warmup_steps)
        return 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress)))
    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)


# ------------------------------------------------------------------------------------------- data

def prepare_data(args, launch):
    """Returns (root, generated, description): the CIFAR-10 under --data-dir, else generated data,
    made once per machine by local rank 0 while the other ranks wait at a barrier."""
    data_dir = os.path.expanduser(args.data_dir)
    if has_cifar10(data_dir):
        generated = is_generated(data_dir)
        return data_dir, generated, f"{GENERATED_DATA if generated else 'the real CIFAR-10'} from {data_dir}"
    parameters = (args.synthetic_dir, args.synthetic_seed, args.synthetic_train_size, args.synthetic_test_size)
    if launch.local_rank == 0:
        ensure_generated(*parameters)
    dist.barrier()
    root = generated_root(*parameters)
    return root, True, (f"{GENERATED_DATA}: {args.synthetic_train_size} train / {args.synthetic_test_size} "
                        f"test images, seed {args.synthetic_seed}, in {root} (no cifar-10-batches-py in {data_dir})")


def make_loaders(train_set, test_set, args, rank, world_size, device):
    """Training: DistributedSampler (shuffled by seed and epoch, equal batch counts on every rank).
    Test: every world_size-th image from ``rank`` on, so each image is counted exactly once."""
    sampler = DistributedSampler(train_set, num_replicas=world_size, rank=rank, shuffle=True,
                                 seed=args.seed, drop_last=True)
    common = dict(batch_size=args.batch_size, num_workers=args.workers, pin_memory=device.type == "cuda")
    train_loader = DataLoader(train_set, sampler=sampler, drop_last=True, **common)
    test_loader = DataLoader(Subset(test_set, range(rank, len(test_set), world_size)), shuffle=False, **common)
    return sampler, train_loader, test_loader


def limited(length, limit):
    return min(length, limit) if limit > 0 else length


def memory_format(device):
    """channels_last on CUDA, where convolutions in mixed precision run faster in it."""
    return torch.channels_last if device.type == "cuda" else torch.contiguous_format


def to_device(images, labels, device):
    return (images.to(device, non_blocking=True, memory_format=memory_format(device)),
            labels.to(device, non_blocking=True))


# --------------------------------------------------------------------------------------- training

def train_one_epoch(model, loader, steps, optimizer, scheduler, scaler, device, description):
    """Returns [loss sum, correct, images] summed over all ranks."""
    model.train()
    world_size = dist.get_world_size()
    totals = torch.zeros(3, dtype=torch.float64, device=device)
    progress = tqdm(total=steps * loader.batch_size * world_size, desc=description, unit="img",
                    unit_scale=True, leave=False, disable=dist.get_rank() != 0, mininterval=1.0)
    for step, (images, labels) in enumerate(itertools.islice(loader, steps)):
        images, labels = to_device(images, labels, device)
        with torch.autocast(device.type, dtype=torch.float16, enabled=device.type == "cuda"):
            logits = model(images)
            loss = F.cross_entropy(logits, labels)
        optimizer.zero_grad(set_to_none=True)
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
        scheduler.step()
        add_batch(totals, loss.detach(), logits.detach(), labels)
        progress.update(len(labels) * world_size)
        if step % 10 == 0:
            progress.set_postfix(loss=f"{loss.item():.3f}")
    progress.close()
    dist.all_reduce(totals)
    return totals.tolist()


@torch.no_grad()
def evaluate(network, loader, steps, device):
    """Returns [loss sum, correct, images] over the test split, summed over all ranks. Runs the bare
    network, not the DDP wrapper, so ranks with one batch more or less need no collective."""
    network.eval()
    totals = torch.zeros(3, dtype=torch.float64, device=device)
    for images, labels in itertools.islice(loader, steps):
        images, labels = to_device(images, labels, device)
        with torch.autocast(device.type, dtype=torch.float16, enabled=device.type == "cuda"):
            logits = network(images)
            loss = F.cross_entropy(logits, labels)
        add_batch(totals, loss, logits, labels)
    dist.all_reduce(totals)
    return totals.tolist()


def add_batch(totals, loss, logits, labels):
    totals[0] += loss.double() * len(labels)
    totals[1] += (logits.argmax(dim=1) == labels).sum()
    totals[2] += len(labels)


# ------------------------------------------------------------------------------------- checkpoint

def rng_state(device):
    return {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state(),
            "cuda": torch.cuda.get_rng_state(device) if device.type == "cuda" else None}


def restore_rng_state(state, device):
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if device.type == "cuda" and state["cuda"] is not None:
        torch.cuda.set_rng_state(state["cuda"], device)


def save_checkpoint(path, state):
    """Writes to a temporary file, flushes it to disk and renames it over ``path``: a reader (or a
    resumed run after a kill) sees the previous checkpoint or the new one, never half of one."""
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    temporary = path + ".tmp"
    with open(temporary, "wb") as out:
        torch.save(state, out)
        out.flush()
        os.fsync(out.fileno())
    os.replace(temporary, path)


def load_checkpoint(path):
    # Our own file, and it holds numpy and Python RNG states, which weights_only=True refuses.
    return torch.load(path, map_location="cpu", weights_only=False)


def run_config(args, world_size):
    return {**{name: getattr(args, name) for name in RUN_SHAPING_ARGUMENTS}, "world_size": world_size}


def config_differences(saved, current):
    return [f"{name} {saved.get(name)} -> {value}" for name, value in current.items() if saved.get(name) != value]


# ---------------------------------------------------------------------------------------- outputs

METRIC_FIELDS = ["epoch", "lr_at_end", "train_loss", "train_accuracy", "test_loss", "test_accuracy",
                 "train_images", "train_seconds", "train_images_per_s", "epoch_seconds"]


def write_metrics_csv(history, path):
    temporary = path + ".tmp"
    with open(temporary, "w", newline="") as out:
        writer = csv.DictWriter(out, fieldnames=METRIC_FIELDS)
        writer.writeheader()
        writer.writerows(history)
    os.replace(temporary, path)


def plot_metrics(history, path, title):
    """Loss and accuracy per epoch, train and test, side by side."""
    epochs = [row["epoch"] for row in history]
    figure = Figure(figsize=(10, 4), layout="constrained")
    loss_axes, accuracy_axes = figure.subplots(1, 2)
    for axes, metric in ((loss_axes, "loss"), (accuracy_axes, "accuracy")):
        for split in ("train", "test"):
            axes.plot(epochs, [row[f"{split}_{metric}"] for row in history], marker="o", label=split)
        axes.set_xlabel("epoch")
        axes.xaxis.set_major_locator(MaxNLocator(integer=True))
        axes.set_ylabel(metric)
        axes.grid(alpha=0.3)
        axes.legend()
    accuracy_axes.set_ylim(0, 1)
    figure.suptitle(title)
    temporary = path + ".tmp.png"
    figure.savefig(temporary, dpi=100)
    os.replace(temporary, path)


def summary_line(backend, world_size, device, args, generated, history, wall_seconds):
    images = sum(row["train_images"] for row in history)
    seconds = sum(row["train_seconds"] for row in history)
    last = history[-1] if history else {}
    return (f"done: backend={backend} world_size={world_size} device={device.type} arch={args.arch} "
            f"data={'generated' if generated else 'cifar10'} epochs={len(history)} "
            f"images/s={images / max(seconds, 1e-9):.0f} "
            f"test_accuracy={last.get('test_accuracy', float('nan')):.3f} wall={wall_seconds:.1f}s")


# ------------------------------------------------------------------------------------------- main

def train(args, launch):
    start = time.perf_counter()
    device = select_device(args.device, launch.local_rank)
    init_process_group(args.backend, launch)
    rank, world_size = dist.get_rank(), dist.get_world_size()
    log = print if rank == 0 else (lambda *_, **__: None)
    seed_everything(args.seed + rank)  # DDP copies rank 0's initial weights to the others

    root, generated_data, data_description = prepare_data(args, launch)
    train_set, test_set = load_datasets(root)
    sampler, train_loader, test_loader = make_loaders(train_set, test_set, args, rank, world_size, device)
    train_steps = limited(len(train_loader), args.limit_train_batches)
    eval_steps = limited(len(test_loader), args.limit_eval_batches)
    if train_steps == 0:
        raise SystemExit(f"{len(train_set)} training images give no full batch of {args.batch_size} "
                         f"on each of {world_size} ranks")

    network, optimizer, scheduler, scaler = build_training(args, world_size, train_steps, device)
    checkpoint_path = os.path.join(args.checkpoint_dir, CHECKPOINT_NAME)
    checkpoint = load_checkpoint(checkpoint_path) if args.resume and os.path.exists(checkpoint_path) else None
    if checkpoint:
        restore_training_state(checkpoint, network, optimizer, scheduler, scaler)
    model = DistributedDataParallel(network, device_ids=[device.index] if device.type == "cuda" else None)
    backend = dist.get_backend()

    log(f"data: {data_description}")
    log(f"run: backend={backend} launcher={launch.launcher} world_size={world_size} device={device} "
        f"arch={args.arch}{f' (width {args.width})' if args.arch == 'resnet9' else ''} "
        f"params={sum(p.numel() for p in network.parameters()) / 1e6:.2f}M batch={args.batch_size}/rank "
        f"lr={args.lr * world_size:g} ({args.lr:g} x {world_size}) epochs={args.epochs} "
        f"steps/epoch={train_steps} torch={torch.__version__}", flush=True)
    if args.resume:
        log(describe_resume(checkpoint, checkpoint_path, run_config(args, world_size)), flush=True)
    if checkpoint and checkpoint["config"]["world_size"] == world_size:
        restore_rng_state(checkpoint["rng"][rank], device)  # last: nothing above may draw from the RNGs

    history = checkpoint["metrics"] if checkpoint else []
    plot_title = (f"{args.arch} on {'generated CIFAR-format data' if generated_data else 'CIFAR-10'}, "
                  f"{backend} x {world_size}")
    os.makedirs(args.out_dir, exist_ok=True)
    for epoch in range(checkpoint["epoch"] if checkpoint else 0, args.epochs):
        epoch_start = time.perf_counter()
        sampler.set_epoch(epoch)
        loss_sum, correct, images = train_one_epoch(model, train_loader, train_steps, optimizer, scheduler,
                                                    scaler, device, f"epoch {epoch + 1}/{args.epochs}")
        train_seconds = time.perf_counter() - epoch_start
        test_loss_sum, test_correct, test_images = evaluate(network, test_loader, eval_steps, device)
        history.append({
            "epoch": epoch + 1, "lr_at_end": optimizer.param_groups[0]["lr"],
            "train_loss": loss_sum / images, "train_accuracy": correct / images,
            "test_loss": test_loss_sum / test_images, "test_accuracy": test_correct / test_images,
            "train_images": int(images), "train_seconds": train_seconds, "train_images_per_s": images / train_seconds,
            "epoch_seconds": time.perf_counter() - epoch_start,
        })
        save_epoch(checkpoint_path, args, world_size, device, history, plot_title,
                   network, optimizer, scheduler, scaler)
        log(epoch_line(history[-1], args.epochs), flush=True)

    log(f"outputs: {checkpoint_path}, {os.path.join(args.out_dir, 'metrics.csv')}, "
        f"{os.path.join(args.out_dir, 'metrics.png')}")
    log(summary_line(backend, world_size, device, args, generated_data, history, time.perf_counter() - start),
        flush=True)
    dist.barrier()  # no rank tears the group down while another may still be using it
    dist.destroy_process_group()


def build_training(args, world_size, train_steps, device):
    """The network on its device, SGD at lr x world size, the per-step schedule and the grad scaler
    (a no-op off CUDA)."""
    network = build_model(args.arch, args.width).to(device, memory_format=memory_format(device))
    optimizer = torch.optim.SGD(network.parameters(), lr=args.lr * world_size, momentum=args.momentum,
                                weight_decay=args.weight_decay, nesterov=True)
    scheduler = warmup_cosine(optimizer, round(args.warmup_epochs * train_steps), args.epochs * train_steps)
    scaler = torch.amp.GradScaler(device.type, enabled=device.type == "cuda")
    return network, optimizer, scheduler, scaler


def restore_training_state(checkpoint, network, optimizer, scheduler, scaler):
    """After the network is on its device, so that the optimizer's buffers land there too."""
    network.load_state_dict(checkpoint["model"])
    optimizer.load_state_dict(checkpoint["optimizer"])
    scheduler.load_state_dict(checkpoint["scheduler"])
    scaler.load_state_dict(checkpoint["scaler"])


def save_epoch(checkpoint_path, args, world_size, device, history, plot_title, network, optimizer, scheduler, scaler):
    """Collective (every rank's RNG states travel to rank 0), then rank 0 writes the checkpoint,
    metrics.csv and the plot."""
    rng_states = [None] * world_size
    dist.all_gather_object(rng_states, rng_state(device))
    if dist.get_rank() != 0:
        return
    save_checkpoint(checkpoint_path, {
        "epoch": history[-1]["epoch"], "model": network.state_dict(), "optimizer": optimizer.state_dict(),
        "scheduler": scheduler.state_dict(), "scaler": scaler.state_dict(), "rng": rng_states,
        "metrics": history, "config": run_config(args, world_size),
    })
    write_metrics_csv(history, os.path.join(args.out_dir, "metrics.csv"))
    plot_metrics(history, os.path.join(args.out_dir, "metrics.png"), plot_title)


def describe_resume(checkpoint, path, config):
    if checkpoint is None:
        return f"resume: no checkpoint at {path}; starting from epoch 1"
    done = checkpoint["epoch"]
    message = (f"resume: {path} holds epoch {done}; "
               + (f"continuing from epoch {done + 1}" if done < config["epochs"] else "nothing left to train"))
    differences = config_differences(checkpoint["config"], config)
    if differences:
        message += ("\nwarning: arguments differ from the checkpointed run (" + ", ".join(differences)
                    + "); the result will not match an uninterrupted run")
    return message


def epoch_line(row, epochs):
    return (f"epoch {row['epoch']}/{epochs}: train loss {row['train_loss']:.4f} accuracy {row['train_accuracy']:.3f}"
            f" | test loss {row['test_loss']:.4f} accuracy {row['test_accuracy']:.3f}"
            f" | {row['train_images_per_s']:.0f} images/s | {row['epoch_seconds']:.1f} s")


def main():
    args = parse_args()
    launch = launch_from_environment()
    if launch and (args.spawn or args.dist_url):
        raise SystemExit(f"--spawn and --dist-url start or join ranks themselves; this process was already "
                         f"started by {launch.launcher}")
    if launch:
        train(args, launch)
    elif args.dist_url and not args.spawn:
        train(args, launch_from_flags(args))
    else:
        spawn(args, max(1, args.spawn))


if __name__ == "__main__":
    main()
