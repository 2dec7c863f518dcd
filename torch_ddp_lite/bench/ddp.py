"""The DDP benchmark, run on every rank: training step time and images/s per backend.

Two models, the same weights and the same data under every backend:

* ``mlp``: a communication-heavy MLP (3x32x32 -> 4096 -> 2048 -> 2048 -> 10, about 25.2M
  parameters, so about 100 MB of float32 gradients per step) with little compute per step;
* ``resnet18``: torchvision's ResNet-18 with 10 classes on CIFAR-sized 32x32 images (11.2M
  parameters).

Each backend trains its own replica (DistributedDataParallel on that backend's group, SGD with
momentum) on a fixed synthetic batch per rank; the backends' steps are interleaved in rounds
after the warm-up steps. A step is forward, backward (with DDP's bucketed gradient allreduce
overlapping it) and the optimizer step. Reported: the median step time of the slowest rank, and
images/s = batch per rank x world size / step time, and the first backend's step time over each
other's (below 1: the first is faster).

The yardstick: a row ``no-comm``, the same DDP step on the first backend's group under
``no_sync()`` (forward, backward and optimizer step, no gradient allreduce), interleaved with the
others. Each backend's ``step/no-comm`` is its step time over that compute-only time: how much
communication adds that backward does not hide (1.00: none).

A second yardstick, the row ``ddp-alone``: the same DDP step on a group of this rank alone (made
with the first backend), so DDP does all its own work (gradient hooks, copying gradients into its
buckets and back) but exchanges nothing. ``ddp-alone/no-comm`` is what DDP costs before any
byte moves: the floor under every backend's ``step/no-comm``.

A third, the row ``allreduce-only``: just the communication, all_reduce of a gradient's worth of
float32 zeros in DDP's 25 MB buckets on the first backend's group, no compute. Where every core
already runs a rank's compute (1 thread per rank and as many ranks as cores), communication
cannot hide behind backward, and a step costs about ``ddp-alone`` + ``allreduce-only``.
``--json FILE`` writes rows with the keys of :data:`ROW_KEYS`.
"""

import contextlib
import copy

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel

from torch_ddp_lite.bench import report
from torch_ddp_lite.bench.control import Plan, interleaved_medians, run_everywhere
from torch_ddp_lite.bench.launch import is_reporting_rank, measured_groups, rank_device, synchronizer

MODELS = ("mlp", "resnet18")
NO_COMM = "no-comm"  # the compute-only yardstick's row
DDP_ALONE = "ddp-alone"  # DDP's own work, no exchange: a group of one rank
ALLREDUCE_ONLY = "allreduce-only"  # the gradient's all_reduce alone, in DDP's bucket sizes
BUCKET_BYTES = 25 * 1024 * 1024  # DDP's default bucket_cap_mb
ROW_KEYS = ("model", "backend", "world_size", "device", "params", "batch_per_rank", "step_ms", "images_per_s")
MLP_WIDTHS = (3 * 32 * 32, 4096, 2048, 2048)


def communication_heavy_mlp():
    layers = [nn.Flatten()]
    for width_in, width_out in zip(MLP_WIDTHS, MLP_WIDTHS[1:]):
        layers += [nn.Linear(width_in, width_out), nn.ReLU()]
    layers.append(nn.Linear(MLP_WIDTHS[-1], 10))
    return nn.Sequential(*layers)


def build_model(name):
    if name == "mlp":
        return communication_heavy_mlp()
    from torchvision.models import resnet18

    return resnet18(num_classes=10)


def run(options):
    """Entry point of every rank (see launch.run_ranks)."""
    device = rank_device(options.device)
    groups = measured_groups(options.backends)
    plan = Plan(options.steps, options.steps, float("inf"), options.warmup_steps, float("inf"), options.rounds)
    reporting = is_reporting_rank()
    if reporting:
        print(f"# torch_ddp_lite.bench ddp  world_size {dist.get_world_size()}  device {options.device}  "
              f"batch {options.batch_size}/rank  {options.steps} steps after {options.warmup_steps} warm-up, "
              f"{options.rounds} interleaved rounds  threads/rank {torch.get_num_threads()}  torch {torch.__version__}",
              flush=True)
        print(f"#{'model':>9}{'params':>10}{'backend':>15}{'step (ms)':>11}{'images/s':>10}"
              f"{options.backends[0] + '/this':>14}{'step/' + NO_COMM:>16}", flush=True)
    rows = []
    for name in options.models:
        rows += bench_model(name, groups, device, plan, options.batch_size, reporting)
    if reporting and options.json:
        report.write_json(options.json, rows)
        print(f"# wrote {len(rows)} rows to {options.json}", flush=True)


def bench_model(name, groups, device, plan, batch_size, reporting):
    """Rows for one model, one per backend that could train it; prints them on rank 0."""
    torch.manual_seed(0)
    reference = build_model(name)
    params = sum(p.numel() for p in reference.parameters())
    alone = alone_group(next(iter(groups))) if groups else None
    generator = torch.Generator().manual_seed(dist.get_rank())
    images = torch.randn(batch_size, 3, 32, 32, generator=generator).to(device)
    labels = torch.randint(0, 10, (batch_size,), generator=generator).to(device)
    sync = synchronizer(device)
    steps, notes = {}, []
    for backend, group in groups.items():
        step, failure = run_everywhere(lambda: make_step(reference, group, device, images, labels, sync))
        if failure is None:
            steps[backend] = step
        else:
            notes.append((backend, failure))
    if steps:
        first_group = groups[next(iter(steps))]
        steps[NO_COMM] = make_step(reference, first_group, device, images, labels, sync, communicate=False)
        if alone is not None:
            steps[DDP_ALONE] = make_step(reference, alone, device, images, labels, sync)
        steps[ALLREDUCE_ONLY] = make_allreduce_only(params, first_group, device, sync)
    medians = interleaved_medians(steps, plan) if steps else {}
    world_size = dist.get_world_size()
    rows = [dict(zip(ROW_KEYS, (name, backend, world_size, device.type, params, batch_size, seconds * 1e3,
                                batch_size * world_size / seconds)))
            for backend, seconds in medians.items()]
    if reporting:
        print_model_rows(rows, notes, next(iter(groups)))
    return rows


def alone_group(backend):
    """A group of this rank alone, on `backend` (its torch name), or None where it cannot be made
    (memcpy, or a backend variant: the plain backend is used for those)."""
    from torch_ddp_lite.bench.launch import BACKEND_VARIANTS, MEMCPY

    if backend == MEMCPY:
        return None
    torch_backend = BACKEND_VARIANTS[backend][0] if backend in BACKEND_VARIANTS else backend
    group, _ = dist.new_subgroups(group_size=1, backend=torch_backend)
    return group


def make_allreduce_only(params, group, device, sync):
    """all_reduce of `params` float32 values in DDP-sized buckets on `group`, nothing else."""
    per_bucket = BUCKET_BYTES // 4
    buckets = [torch.zeros(min(per_bucket, params - start), device=device) for start in range(0, params, per_bucket)]

    def step():
        works = [dist.all_reduce(bucket, group=group, async_op=True) for bucket in buckets]
        for work in works:
            work.wait()
        sync()

    return step


def make_step(reference, group, device, images, labels, sync, communicate=True):
    """A no-argument training step of a fresh replica of `reference`, wrapped in DDP on `group`;
    without `communicate`, under no_sync() (the compute-only yardstick)."""
    model = DistributedDataParallel(copy.deepcopy(reference).to(device), process_group=group)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)

    def step():
        optimizer.zero_grad(set_to_none=False)
        with model.no_sync() if not communicate else contextlib.nullcontext():
            F.cross_entropy(model(images), labels).backward()
        optimizer.step()
        sync()

    return step


def print_model_rows(rows, notes, first_backend):
    """One line per backend, then the yardstick; the ratio columns are the first backend's step
    time over this one's, and this one's over the compute-only step."""
    first = next((row for row in rows if row["backend"] == first_backend), None)
    yardstick = next((row for row in rows if row["backend"] == NO_COMM), None)
    for row in rows:
        measured = row["backend"] not in (NO_COMM, DDP_ALONE, ALLREDUCE_ONLY)
        yardstick_row = row["backend"] in (DDP_ALONE, ALLREDUCE_ONLY)
        ratio = f"{first['step_ms'] / row['step_ms']:.2f}" if first and measured and row is not first else ""
        overhead = (f"{row['step_ms'] / yardstick['step_ms']:.2f}" if yardstick and (measured or yardstick_row)
                    else "")
        print(f" {row['model']:>9}{row['params'] / 1e6:>9.1f}M{row['backend']:>15}{row['step_ms']:>11.1f}"
              f"{row['images_per_s']:>10.0f}{ratio:>14}{overhead:>16}", flush=True)
    for backend, reason in notes:
        print(f"# {backend}: not measured, unsupported here ({reason})", flush=True)
