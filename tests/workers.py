"""Functions that run on each rank (imported by the forkserver; see harness.py).

Inputs are integer-valued and small, so every reduction is exact in every dtype and the
closed-form expectation can be compared with torch.equal; AVG is compared with the dtype's
tolerance. Each sweep runs the same op on a gloo group built over the same ranks and asserts
ddplite == gloo on identical inputs (gloo has no AVG; where gloo refuses a dtype the oracle is
skipped for that case and the closed form still applies).
"""

import os
import time
from datetime import timedelta

import torch
import torch.distributed as dist

ReduceOp = dist.ReduceOp

DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int8, torch.uint8,
          torch.int32, torch.int64, torch.bool]
REDUCE_OPS = [ReduceOp.SUM, ReduceOp.AVG, ReduceOp.PRODUCT, ReduceOp.MIN, ReduceOp.MAX]


def op_name(op):
    return str(op).split(".")[-1]


def supported(dtype, op):
    return not (dtype == torch.bool and op == ReduceOp.AVG)


def make_input(rank, count, dtype, op=ReduceOp.SUM):
    """Rank `rank`'s input: small integers, exactly representable in every dtype."""
    i = torch.arange(count, dtype=torch.int64)
    if dtype == torch.bool:
        return ((i + rank) % 3 == 0)
    if op == ReduceOp.PRODUCT:
        values = 1 + (i + rank) % 2
    elif op in (ReduceOp.MIN, ReduceOp.MAX):
        values = (i * 7 + rank * 5) % 11
        if dtype not in (torch.uint8,):
            values = values - 5
    else:
        values = i % 5 + rank + 1
    return values.to(dtype)


def closed_form(count, dtype, op, world_size):
    stacked = torch.stack([make_input(r, count, dtype, op).to(torch.float64) for r in range(world_size)])
    if dtype == torch.bool:
        any_true, all_true = stacked.amax(0) > 0, stacked.amin(0) > 0
        return any_true if op in (ReduceOp.SUM, ReduceOp.MAX) else all_true
    if op == ReduceOp.SUM:
        result = stacked.sum(0)
    elif op == ReduceOp.AVG:
        total = stacked.sum(0)
        result = torch.trunc(total / world_size) if not dtype.is_floating_point else total / world_size
    elif op == ReduceOp.PRODUCT:
        result = stacked.prod(0)
    elif op == ReduceOp.MIN:
        result = stacked.amin(0)
    else:
        result = stacked.amax(0)
    return result.to(dtype)


def same(actual, expected, op):
    if op == ReduceOp.AVG and actual.dtype.is_floating_point:
        try:
            torch.testing.assert_close(actual, expected)
            return True
        except AssertionError:
            return False
    return actual.dtype == expected.dtype and actual.shape == expected.shape and torch.equal(actual, expected)


class Sweep:
    """Collects mismatches instead of stopping at the first, so one run reports all of them."""

    def __init__(self, rank):
        self.rank = rank
        self.failures = []
        self.gloo = dist.new_group(backend="gloo")
        self.checked = 0
        self.gloo_refused = 0

    def check(self, label, actual, expected, op=ReduceOp.SUM):
        self.checked += 1
        if not same(actual, expected, op):
            self.failures.append(f"rank {self.rank} {label}: got {actual.flatten()[:8].tolist()} "
                                 f"expected {expected.flatten()[:8].tolist()}")

    def reference(self, run_gloo):
        """gloo's result for the same op on the same inputs, or None where gloo refuses the case
        (a dtype or op it lacks); any other error propagates."""
        try:
            return run_gloo()
        except (RuntimeError, ValueError) as error:
            text = str(error).lower()
            if "gloo" in text or "not supported" in text or "cannot" in text or "unsupported" in text:
                self.gloo_refused += 1
                return None
            raise

    def result(self):
        return {"failures": self.failures, "checked": self.checked, "gloo_refused": self.gloo_refused}


def layouts_and_async(rank, world_size):
    """Non-contiguous tensors, multi-dimensional shapes, async_op + futures, barrier."""
    sweep = Sweep(rank)
    # non-contiguous: a transposed view; the result must land in the caller's view
    base = torch.arange(12, dtype=torch.float32).reshape(3, 4) * (rank + 1)
    view = base.t()
    dist.all_reduce(view)
    factor = world_size * (world_size + 1) / 2
    sweep.check("allreduce non-contiguous", base, torch.arange(12, dtype=torch.float32).reshape(3, 4) * factor)
    strided = torch.zeros(10, dtype=torch.int64)[::2]
    if rank == 0:
        strided.copy_(torch.arange(5))
    dist.broadcast(strided, src=0)
    sweep.check("broadcast strided", strided, torch.arange(5))
    # async: several in flight, completed in order, futures carry the output list
    tensors = [torch.full((1000,), float(rank + k)) for k in range(4)]
    works = [dist.all_reduce(t, async_op=True) for t in tensors]
    futures = [w.get_future() for w in works]
    for k, (work, future) in enumerate(zip(works, futures)):
        work.wait()
        value = future.value()
        expected = torch.full((1000,), float(sum(r + k for r in range(world_size))))
        sweep.check(f"async allreduce #{k} tensor", tensors[k], expected)
        sweep.check(f"async allreduce #{k} future value", value[0], expected)
        if not (work.is_completed() and work.is_success()):
            sweep.failures.append(f"work {k} not completed/successful after wait")
    chained = dist.all_reduce(torch.ones(3), async_op=True).get_future().then(lambda f: f.value()[0] * 2)
    sweep.check("future.then", chained.wait(), torch.full((3,), 2.0 * world_size))
    dist.barrier()
    # object collectives ride on broadcast/allgather of byte tensors
    objects = [None] * world_size
    dist.all_gather_object(objects, {"rank": rank, "text": "x" * rank})
    if objects != [{"rank": r, "text": "x" * r} for r in range(world_size)]:
        sweep.failures.append(f"all_gather_object gave {objects}")
    payload = [{"from": 0, "n": 42}, "two"] if rank == 0 else [None, None]
    dist.broadcast_object_list(payload, src=0)
    if payload != [{"from": 0, "n": 42}, "two"]:
        sweep.failures.append(f"broadcast_object_list gave {payload}")
    # random floats: ddplite must equal gloo bit for bit on identical inputs
    generator = torch.Generator().manual_seed(rank)
    noisy = torch.randn(4099, generator=generator)
    reference = noisy.clone()
    dist.all_reduce(noisy)
    dist.all_reduce(reference, group=sweep.gloo)
    torch.testing.assert_close(noisy, reference, rtol=1e-6, atol=1e-6)
    sweep.checked += 1
    return sweep.result()


def sequence_numbers(rank, world_size):
    group = dist.group.WORLD
    backend = group._get_backend(torch.device("cpu"))
    before = backend._get_sequence_number_for_group()
    for _ in range(3):
        dist.all_reduce(torch.ones(2))
    after = backend._get_sequence_number_for_group()
    from torch_ddp_lite import _load_extension
    name, timeout = _load_extension().backend_options(backend)
    backend.set_timeout(timedelta(seconds=5))
    _, timeout_after = _load_extension().backend_options(backend)
    return {"before": before, "after": after, "options_name": name, "timeout_s": timeout.total_seconds(),
            "timeout_after_set_s": timeout_after.total_seconds(), "name": dist.get_backend(),
            "backend_name": backend.name()}


# ---- failure paths ---------------------------------------------------------------------------

def rank_exits_midway(rank, world_size, victim, steps_before_exit):
    tensor = torch.ones(1000)
    for step in range(100):
        if rank == victim and step == steps_before_exit:
            os._exit(3)
        try:
            dist.all_reduce(tensor)
        except Exception as error:  # noqa: BLE001
            return {"type": type(error).__name__, "message": str(error), "step": step,
                    "is_dist_error": isinstance(error, dist.DistBackendError)}
        time.sleep(0.01)
    return {"type": None, "message": "no error after 100 steps", "step": 100}


def wait_with_timeout(rank, world_size):
    tensor = torch.full((10,), float(rank + 1))
    if rank == 1:
        time.sleep(3.0)
        dist.all_reduce(tensor)
        return {"value": tensor[0].item()}
    work = dist.all_reduce(tensor, async_op=True)
    start = time.monotonic()
    try:
        work.wait(timeout=timedelta(seconds=0.5))
        outcome = {"raised": None}
    except Exception as error:  # noqa: BLE001
        outcome = {"raised": type(error).__name__, "message": str(error),
                   "is_dist_error": isinstance(error, dist.DistBackendError)}
    outcome["elapsed"] = time.monotonic() - start
    work.wait()  # the op itself still completes once rank 1 arrives
    outcome["value"] = tensor[0].item()
    return outcome


def peer_never_arrives(rank, world_size):
    if rank == 1:
        time.sleep(5.0)
        return {"skipped": True}
    start = time.monotonic()
    try:
        dist.all_reduce(torch.ones(100))
        return {"raised": None}
    except Exception as error:  # noqa: BLE001
        message = str(error)
    # the group is now unusable: the next op fails fast with the recorded cause
    try:
        dist.all_reduce(torch.ones(1))
        second = None
    except Exception as error:  # noqa: BLE001
        second = str(error)
    return {"raised": True, "message": message, "elapsed": time.monotonic() - start, "second": second}


def invalid_inputs(rank, world_size):
    """Each bad call must raise at once, on the caller, with context; the group stays usable."""
    cases = {
        "bad root": lambda: dist.broadcast(torch.ones(3), src=world_size + 3),
        "bad reduce root": lambda: dist.reduce(torch.ones(3), dst=world_size + 1),
        "list length": lambda: dist.all_gather([torch.zeros(3)] * (world_size + 1), torch.ones(3)),
        "output size": lambda: dist.all_gather_into_tensor(torch.zeros(3 * world_size + 1), torch.ones(3)),
        "sparse": lambda: dist.all_reduce(torch.eye(3).to_sparse()),
        "avg on bool": lambda: dist.all_reduce(torch.ones(3, dtype=torch.bool), op=ReduceOp.AVG),
        "band on float": lambda: dist.all_reduce(torch.ones(3), op=ReduceOp.BAND),
        "unsupported dtype": lambda: dist.all_reduce(torch.ones(3, dtype=torch.int16)),
        "size mismatch": lambda: dist.all_gather([torch.zeros(4)] * world_size, torch.ones(3)),
    }
    outcomes = {}
    for name, call in cases.items():
        try:
            call()
            outcomes[name] = {"raised": None}
        except Exception as error:  # noqa: BLE001
            outcomes[name] = {"raised": type(error).__name__, "message": str(error)}
    tensor = torch.ones(5)
    dist.all_reduce(tensor)
    outcomes["after"] = tensor.tolist()
    return outcomes


# ---- DDP ---------------------------------------------------------------------------------------

def make_ddp_problem(seed=0, samples=256):
    generator = torch.Generator().manual_seed(seed)
    images = torch.randn(samples, 3, 16, 16, generator=generator)
    labels = torch.randint(0, 10, (samples,), generator=generator)
    return images, labels


def make_cnn(seed=0):
    torch.manual_seed(seed)
    return torch.nn.Sequential(
        torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
        torch.nn.Conv2d(8, 16, 3, padding=1), torch.nn.ReLU(), torch.nn.AdaptiveAvgPool2d(2),
        torch.nn.Flatten(), torch.nn.Linear(64, 10),
    )


def ddp_batches(rank, world_size, steps, batch_per_rank, samples):
    """Index batches for `rank`, from DistributedSampler with set_epoch (shuffled, seeded)."""
    from torch.utils.data import DistributedSampler
    dataset = range(samples)
    sampler = DistributedSampler(dataset, num_replicas=world_size, rank=rank, shuffle=True, seed=7)
    batches, epoch = [], 0
    while len(batches) < steps:
        sampler.set_epoch(epoch)
        order = list(sampler)
        for start in range(0, len(order) - batch_per_rank + 1, batch_per_rank):
            batches.append(order[start:start + batch_per_rank])
            if len(batches) == steps:
                break
        epoch += 1
    return batches


def train_steps(model, optimizer, images, labels, batches):
    loss_fn = torch.nn.CrossEntropyLoss()
    for batch in batches:
        optimizer.zero_grad()
        loss = loss_fn(model(images[batch]), labels[batch])
        loss.backward()
        optimizer.step()
    return model


def ddp_train(rank, world_size, steps=20, batch_per_rank=16, samples=256):
    from torch.nn.parallel import DistributedDataParallel
    images, labels = make_ddp_problem(samples=samples)
    model = DistributedDataParallel(make_cnn(seed=rank))  # DDP broadcasts rank 0's weights
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    train_steps(model, optimizer, images, labels, ddp_batches(rank, world_size, steps, batch_per_rank, samples))
    return {name: p.detach().clone() for name, p in model.module.named_parameters()}


def single_process_train(world_size, steps=20, batch_per_rank=16, samples=256):
    """The reference: one process, each step on the union of the ranks' batches."""
    images, labels = make_ddp_problem(samples=samples)
    model = make_cnn(seed=0)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    per_rank = [ddp_batches(r, world_size, steps, batch_per_rank, samples) for r in range(world_size)]
    full = [sum((per_rank[r][s] for r in range(world_size)), []) for s in range(steps)]
    train_steps(model, optimizer, images, labels, full)
    return {name: p.detach().clone() for name, p in model.named_parameters()}


def abort_fails_pending_and_later_ops(rank, world_size):
    backend = dist.group.WORLD._get_backend(torch.device("cpu"))
    dist.all_reduce(torch.ones(4))  # the group works before the abort
    if rank == 0:
        backend.abort()
    try:
        dist.all_reduce(torch.ones(4))
        return {"raised": None}
    except Exception as error:  # noqa: BLE001
        return {"raised": type(error).__name__, "message": str(error)}


def init_with_interface(rank, world_size, store_path, ifname):
    os.environ["DDPLITE_SOCKET_IFNAME"] = ifname
    try:
        dist.init_process_group("ddplite", init_method=f"file://{store_path}", rank=rank, world_size=world_size,
                                timeout=timedelta(seconds=20))
    except Exception as error:  # noqa: BLE001
        return {"raised": type(error).__name__, "message": str(error)}
    tensor = torch.ones(3)
    dist.all_reduce(tensor)
    return {"raised": None, "value": tensor.tolist()}
