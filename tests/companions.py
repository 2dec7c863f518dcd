"""Per-rank training with the torch.distributed companions of DDP: each function trains a few real
steps and returns the final parameters, so a test can run it under ddplite and under gloo and
assert they are equal (see test_companions.py)."""

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

import workers


def params_of(module):
    return {name: p.detach().clone() for name, p in module.named_parameters()}


class TwoHeads(torch.nn.Module):
    """A trunk with two heads; only one head runs on each step, so the other's parameters are
    unused on that step (what find_unused_parameters is for)."""

    def __init__(self):
        super().__init__()
        self.trunk = torch.nn.Linear(12, 16)
        self.left = torch.nn.Linear(16, 4)
        self.right = torch.nn.Linear(16, 4)

    def forward(self, x, use_left):
        hidden = torch.relu(self.trunk(x))
        return self.left(hidden) if use_left else self.right(hidden)


def batch(rank, step, size=8, features=12):
    generator = torch.Generator().manual_seed(1000 * rank + step)
    return torch.randn(size, features, generator=generator), torch.randint(0, 4, (size,), generator=generator)


def find_unused_parameters(rank, world_size, steps=6):
    torch.manual_seed(0)
    model = DistributedDataParallel(TwoHeads(), find_unused_parameters=True)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(steps):
        x, y = batch(rank, step)
        loss = torch.nn.functional.cross_entropy(model(x, use_left=step % 3 != 0), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return params_of(model.module)


def comm_hook(rank, world_size, hook_name, steps=6):
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
    torch.manual_seed(0)
    model = DistributedDataParallel(workers.make_cnn(seed=0))
    model.register_comm_hook(dist.group.WORLD, getattr(default_hooks, hook_name))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    images, labels = workers.make_ddp_problem(samples=64)
    for step in range(steps):
        chosen = [(rank * 8 + step * 16 + k) % 64 for k in range(8)]
        loss = torch.nn.functional.cross_entropy(model(images[chosen]), labels[chosen])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return params_of(model.module)


def join_uneven_inputs(rank, world_size):
    """Rank r has 3 + 2r batches; Join shadows the finished ranks' collectives."""
    from torch.distributed.algorithms.join import Join
    torch.manual_seed(0)
    model = DistributedDataParallel(torch.nn.Linear(12, 4))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    with Join([model]):
        for step in range(3 + 2 * rank):
            x, y = batch(rank, step)
            loss = torch.nn.functional.cross_entropy(model(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    return params_of(model.module)


def zero_redundancy(rank, world_size, steps=5):
    from torch.distributed.optim import ZeroRedundancyOptimizer
    torch.manual_seed(0)
    model = DistributedDataParallel(torch.nn.Sequential(torch.nn.Linear(12, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4)))
    optimizer = ZeroRedundancyOptimizer(model.parameters(), optimizer_class=torch.optim.Adam, lr=0.01)
    for step in range(steps):
        x, y = batch(rank, step)
        loss = torch.nn.functional.cross_entropy(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    optimizer.consolidate_state_dict(to=0)
    state = optimizer.state_dict() if rank == 0 else None
    result = params_of(model.module)
    if state is not None:
        result["adam_steps"] = torch.tensor([float(s["step"]) for s in state["state"].values()])
    return result


def fsdp2_fully_shard(rank, world_size, steps=3):
    from torch.distributed.fsdp import fully_shard
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(12, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    for layer in model:
        if isinstance(layer, torch.nn.Linear):
            fully_shard(layer)
    fully_shard(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(steps):
        x, y = batch(rank, step)
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    return {name: value.full_tensor() for name, value in model.state_dict().items()}


def object_collectives(rank, world_size):
    failures = []
    gathered = [None] * world_size if rank == 0 else None
    dist.gather_object({"rank": rank, "squares": [rank * rank] * rank}, gathered, dst=0)
    if rank == 0 and gathered != [{"rank": r, "squares": [r * r] * r} for r in range(world_size)]:
        failures.append(f"gather_object gave {gathered}")
    received = [None]
    inputs = [f"to {r}" * (r + 1) for r in range(world_size)] if rank == world_size - 1 else None
    dist.scatter_object_list(received, inputs, src=world_size - 1)
    if received != [f"to {rank}" * (rank + 1)]:
        failures.append(f"scatter_object_list gave {received}")
    everything = [None] * world_size
    dist.all_gather_object(everything, ("rank", rank))
    if everything != [("rank", r) for r in range(world_size)]:
        failures.append(f"all_gather_object gave {everything}")
    return failures


def what_torch_refuses_on_cpu(rank, world_size):
    """SyncBatchNorm needs an accelerator in torch itself; monitored_barrier is gloo-only in torch's
    Python. Both refusals come from torch, before ddplite is called."""
    outcomes = {}
    model = torch.nn.SyncBatchNorm.convert_sync_batchnorm(torch.nn.Sequential(torch.nn.BatchNorm1d(4)))
    try:
        model(torch.randn(8, 4))
        outcomes["sync_batchnorm"] = None
    except ValueError as error:
        outcomes["sync_batchnorm"] = str(error)
    try:
        dist.monitored_barrier()
        outcomes["monitored_barrier"] = None
    except ValueError as error:
        outcomes["monitored_barrier"] = str(error)
    return outcomes
