"""Functions that run on each rank (imported by the forkserver; see harness.py).

Inputs are integer-valued pseudo-random streams (make_input): distinct for every rank, element
and op, bounded per dtype so that every reduction stays exact, so a step that moves the wrong
segment or skips a rank cannot match the closed form by accident (a periodic input could).
Closed forms are compared with torch.equal; AVG on floats with the dtype's tolerance. Each sweep
also runs the same op on a gloo group over the same ranks and asserts ddplite == gloo on identical
inputs, except for the cases gloo is listed as refusing (gloo_refuses); gloo raising anywhere
else fails the test.
"""

import functools
import math
import operator
import os
import time
from datetime import timedelta

import torch
import torch.distributed as dist

import torch_ddp_lite

ReduceOp = dist.ReduceOp

DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int8, torch.uint8,
          torch.int32, torch.int64, torch.bool]
# Reduced and moved by ddplite, refused by gloo ("Invalid scalar type"): swept against the closed
# form only (tests/test_dtypes.py).
WIDER_INTEGER_DTYPES = [torch.int16, torch.uint16, torch.uint32, torch.uint64]
# Moved (broadcast, gathers, scatter, all-to-all, send/recv), never reduced, on CPU; gloo refuses them.
FLOAT8_DTYPES = [torch.float8_e4m3fn, torch.float8_e5m2]
GLOO_REFUSED_DTYPES = set(WIDER_INTEGER_DTYPES + FLOAT8_DTYPES)
UNSIGNED_DTYPES = {torch.uint8, torch.uint16, torch.uint32, torch.uint64}
BITWISE_OPS = [ReduceOp.BAND, ReduceOp.BOR, ReduceOp.BXOR]
REDUCE_OPS = [ReduceOp.SUM, ReduceOp.AVG, ReduceOp.PRODUCT, ReduceOp.MIN, ReduceOp.MAX] + BITWISE_OPS

# The largest |value| of a SUM/AVG/MIN/MAX input, so that a sum over up to 5 ranks is exact:
# 8- and 16-bit integers stay in range, float16 below 2048 and bfloat16 below 256 (their exact
# integers); float8 (moved only) takes small integers, exact in e4m3fn and e5m2 alike.
_BOUND = {torch.int8: 25, torch.uint8: 51, torch.int16: 6500, torch.uint16: 13000, torch.float16: 400,
          torch.bfloat16: 50, torch.float8_e4m3fn: 8, torch.float8_e5m2: 8}
_DEFAULT_BOUND = 2 ** 20
_BITS = {torch.int8: 8, torch.uint8: 8, torch.int16: 16, torch.uint16: 16, torch.int32: 32, torch.uint32: 32,
         torch.int64: 62, torch.uint64: 62}


def op_name(op):
    return str(op).split(".")[-1]


def supported(dtype, op):
    """Whether ddplite (and torch) define `op` on `dtype`: no AVG on bool, bitwise on integers and
    bool, no reduction of float8 on CPU."""
    if dtype in FLOAT8_DTYPES:
        return False
    if op in BITWISE_OPS:
        return not dtype.is_floating_point
    return not (dtype == torch.bool and op == ReduceOp.AVG)


def gloo_refuses(dtype, op):
    """The reduction cases gloo itself raises on (probed on torch 2.11: "Cannot use
    ReduceOp.PREMUL_SUM with Gloo"; AVG on integers and bool: "result type Float can't be cast");
    everywhere else gloo must answer. `op` may be the string "PREMUL_SUM"."""
    if op == "PREMUL_SUM" or dtype in GLOO_REFUSED_DTYPES:
        return True
    return op == ReduceOp.AVG and not dtype.is_floating_point


def _stream(seed, count):
    """A deterministic pseudo-random int64 stream in [0, 2**31), one value per element, different
    for every seed (a multiplicative hash of (seed, index), not a periodic pattern)."""
    i = torch.arange(count, dtype=torch.int64)
    x = (i * 2654435761 + (seed + 1) * 2246822519 + 374761393) & 0xFFFFFFFF
    x = ((x ^ (x >> 15)) * 2246822519) & 0xFFFFFFFF
    x = ((x ^ (x >> 13)) * 3266489917) & 0xFFFFFFFF
    return (x ^ (x >> 16)) >> 1


def make_input(rank, count, dtype, op=ReduceOp.SUM):
    """Rank `rank`'s input for `op`: distinct per rank and element, exact in every reduction.

    SUM/AVG/MIN/MAX: integers in [-bound, bound] (unsigned: [0, bound]), negative ones included, so
    AVG on integers checks truncation toward zero. PRODUCT: factors in {-2, -1, 1, 2} ({1, 2} for
    unsigned). Bitwise ops: random bits of the dtype's width. bool: a random third of them True.
    """
    seed = rank * 7919 + (REDUCE_OPS.index(op) if op in REDUCE_OPS else 0) * 104729
    x = _stream(seed, count)
    if dtype == torch.bool:
        return x % 3 == 0
    if op == ReduceOp.PRODUCT:
        factors = torch.tensor([1, 2] if dtype in UNSIGNED_DTYPES else [-2, -1, 1, 2])
        return factors[x % len(factors)].to(dtype)
    if op in BITWISE_OPS:
        bits = _BITS[dtype]
        values = x if bits > 31 else x % (1 << bits)
        if bits == 62:
            values = values | (_stream(seed + 1, count) << 31)  # 62 random bits
        if dtype in (torch.int8, torch.int16):
            values = values - (1 << (bits - 1))
        return values.to(dtype)
    bound = _BOUND.get(dtype, _DEFAULT_BOUND)
    if dtype in UNSIGNED_DTYPES:
        return (x % (bound + 1)).to(dtype)
    return (x % (2 * bound + 1) - bound).to(dtype)


def same(actual, expected, op):
    """Exact equality (dtype, shape, values); AVG on floats within the dtype's tolerance."""
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

    def reference(self, run_gloo, refused=False, gloo_checks=True):
        """gloo's result for the same op on the same inputs. `refused`: a case gloo_refuses lists;
        then gloo must really raise (the list stays honest) and there is no reference (None).
        Any other error of gloo's propagates and fails the test. `gloo_checks=False`: this
        collective of this torch's gloo refuses nothing (gloo_checks_reduce_scatter), so the listed
        cases it answers are not held against the list (nor used: the closed form checks them)."""
        if not refused:
            return run_gloo()
        try:
            run_gloo()
        except (RuntimeError, ValueError):
            self.gloo_refused += 1
            return None
        if gloo_checks:
            self.failures.append(f"rank {self.rank}: gloo answered a case listed as refused")
        return None

    def gloo_checks_reduce_scatter(self):
        """Whether this torch's gloo refuses in reduce_scatter what it cannot do: a PREMUL_SUM must
        raise. torch 2.8's gloo checks neither op nor dtype there (it sums whatever it is given).
        Probed once per sweep."""
        if not hasattr(self, "_gloo_checks_rs"):
            output = torch.zeros(1)
            try:
                dist.reduce_scatter_tensor(output, torch.ones(dist.get_world_size()),
                                           op=dist._make_nccl_premul_sum(0.5), group=self.gloo)
                self._gloo_checks_rs = False
            except (RuntimeError, ValueError):
                self._gloo_checks_rs = True
        return self._gloo_checks_rs

    def gloo_honours_reduce_scatter(self, op):
        """Whether this torch's gloo applies `op` (a ReduceOp) in reduce_scatter. torch 2.8's gloo
        sums whatever op is asked: there gloo is no oracle for the other ops and the closed form
        alone checks them. Probed once per op and sweep: rank r gives r + 2, and gloo must return
        the op's closed form (a refusal is the refusal check's business: True)."""
        cache = self.__dict__.setdefault("_gloo_ops", {})
        if op not in cache:
            world_size = dist.get_world_size()
            values = [r + 2 for r in range(world_size)]
            dtype = torch.int64 if op in BITWISE_OPS else torch.float64
            folds = {ReduceOp.SUM: sum, ReduceOp.AVG: lambda v: sum(v) / len(v), ReduceOp.PRODUCT: math.prod,
                     ReduceOp.MIN: min, ReduceOp.MAX: max,
                     ReduceOp.BAND: lambda v: functools.reduce(operator.and_, v),
                     ReduceOp.BOR: lambda v: functools.reduce(operator.or_, v),
                     ReduceOp.BXOR: lambda v: functools.reduce(operator.xor, v)}
            output = torch.zeros(1, dtype=dtype)
            try:
                dist.reduce_scatter_tensor(output, torch.full((world_size,), values[self.rank], dtype=dtype), op=op,
                                           group=self.gloo)
                cache[op] = output.item() == folds[op](values)
            except (RuntimeError, ValueError):
                cache[op] = True
        return cache[op]

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
    # random floats: ddplite must equal gloo on identical inputs. Not bit for bit: with 3+ ranks
    # the two sum in different orders (ring segments, butterfly pairs), and float addition is
    # not associative; within 1e-6 relative, which a wrong or missing contribution is far outside.
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
    timeout_after = None
    if torch_ddp_lite.torch_has("split"):  # Backend.set_timeout (setTimeout) arrives with split, in torch 2.9
        backend.set_timeout(timedelta(seconds=5))
        timeout_after = _load_extension().backend_options(backend)[1].total_seconds()
    return {"before": before, "after": after, "options_name": name, "timeout_s": timeout.total_seconds(),
            "timeout_after_set_s": timeout_after, "name": dist.get_backend(),
            "backend_name": backend.name()}


# ---- failure paths ---------------------------------------------------------------------------

def rank_exits_midway(rank, world_size, victim, steps_before_exit):
    tensor = torch.ones(1000)
    for step in range(100):
        if rank == victim and step == steps_before_exit:
            os._exit(3)
        start = time.monotonic()
        try:
            dist.all_reduce(tensor)
        except Exception as error:  # noqa: BLE001
            return {"type": type(error).__name__, "message": str(error), "step": step,
                    "is_dist_error": isinstance(error, dist.DistBackendError),
                    "seconds": time.monotonic() - start}
        time.sleep(0.01)
    return {"type": None, "message": "no error after 100 steps", "step": 100}


def receiver_sees_exit(rank, world_size):
    """Rank 1 exits before sending anything; rank 0 only receives (broadcast from rank 1), so it
    sees the end of the stream, not a failed send."""
    if rank == 1:
        time.sleep(0.5)
        os._exit(3)
    start = time.monotonic()
    try:
        dist.broadcast(torch.zeros(10), src=1)
        return {"type": None}
    except Exception as error:  # noqa: BLE001
        return {"type": type(error).__name__, "message": str(error), "seconds": time.monotonic() - start}


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


def some_ranks_never_arrive(rank, world_size, missing):
    """The ranks in `missing` sleep past the group's timeout; the others all_reduce (ring-sized, so
    over TCP each waits on one neighbour only) and report the error."""
    if rank in missing:
        time.sleep(6.0)
        return {"skipped": True}
    start = time.monotonic()
    try:
        dist.all_reduce(torch.ones(100_000))
        return {"raised": None}
    except Exception as error:  # noqa: BLE001
        return {"raised": type(error).__name__, "message": str(error), "elapsed": time.monotonic() - start}


def work_results(rank, world_size, scenario):
    """get_future_result() of an all_reduce on rank 0: "success" (asked before and after it
    completes), "timeout" (rank 1 never arrives), "dead_peer" (rank 1 exits at once). Returns the
    WorkResult values seen on rank 0."""
    if rank == 1 and scenario == "timeout":
        time.sleep(4.0)
        return {"skipped": True}
    if rank == 1 and scenario == "dead_peer":
        os._exit(0)
    tensor = torch.ones(1000)
    work = dist.all_reduce(tensor, async_op=True)
    early = work.get_future_result()
    try:
        work.wait()
    except Exception:  # noqa: BLE001 - the failure cases raise here; the result says which
        pass
    late = work.get_future_result()
    return {"early": early.wait(), "late": late.wait(), "value": tensor[0].item()}


def invalid_inputs(rank, world_size):
    """Each bad call must raise at once, on the caller, with context; the group stays usable."""
    cases = {
        "bad root": lambda: dist.broadcast(torch.ones(3), src=world_size + 3),
        "bad reduce root": lambda: dist.reduce(torch.ones(3), dst=world_size + 1),
        "list length": lambda: dist.all_gather([torch.zeros(3)] * (world_size + 1), torch.ones(3)),
        "output size": lambda: dist.all_gather_into_tensor(torch.zeros(3 * world_size + 1), torch.ones(3)),
        "sparse MAX": lambda: dist.all_reduce(torch.eye(3).to_sparse(), op=ReduceOp.MAX),
        "avg on bool": lambda: dist.all_reduce(torch.ones(3, dtype=torch.bool), op=ReduceOp.AVG),
        "band on float": lambda: dist.all_reduce(torch.ones(3), op=ReduceOp.BAND),
        "unsupported dtype": lambda: dist.all_reduce(torch.ones(3, dtype=torch.float8_e4m3fnuz)),
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


def fail_then_recover(rank, world_size, second_store, failure):
    """The group fails (`failure`: "mismatch", the last rank all_reduces another size; "timeout",
    the last rank arrives after the group's timeout); every rank then destroys it, joins a fresh
    group through a new store in the same process, and trains DDP there. Returns the first
    error's type and the trained parameters."""
    last = rank == world_size - 1
    outcome = {}
    try:
        if failure == "timeout" and last:
            time.sleep(3.0)
        tensor = torch.ones(9 if (failure == "mismatch" and last) else 8)
        dist.all_reduce(tensor)
        outcome["first"] = "returned"
        outcome["value"] = tensor.tolist()
    except Exception as error:  # noqa: BLE001
        outcome["first"] = type(error).__name__
    dist.destroy_process_group()
    dist.init_process_group("ddplite", init_method=f"file://{second_store}", rank=rank, world_size=world_size,
                            timeout=timedelta(seconds=60))
    outcome["params"] = ddp_train(rank, world_size, steps=6)
    return outcome


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


def _strided(values, sentinel):
    """A non-contiguous view holding `values` (every other element of a larger buffer whose gaps
    hold `sentinel`), and the buffer itself, so a test can see writes that leak into the gaps."""
    buffer = torch.full((values.numel(), 2), sentinel, dtype=values.dtype)
    view = buffer[:, 0]
    view.copy_(values.flatten())
    return view, buffer


def noncontiguous_every_op(rank, world_size, count):
    """Every collective and point-to-point op with strided (non-contiguous) inputs and outputs:
    the result must equal gloo's on contiguous copies of the same inputs, land in the caller's
    view, and leave the gaps between the view's elements untouched."""
    sweep = Sweep(rank)
    gloo = sweep.gloo
    sentinel = -7.0
    P = world_size

    def data(tag, n=count):
        return make_input(rank * 31 + tag, n, torch.float32)

    def check(label, views_and_buffers, expected):
        for k, ((view, buffer), want) in enumerate(zip(views_and_buffers, expected)):
            sweep.check(f"{label}[{k}] values", view.clone(), want)
            sweep.check(f"{label}[{k}] gaps", buffer[:, 1].clone(), torch.full_like(buffer[:, 1], sentinel))

    def fresh(values):
        return _strided(values, sentinel)

    # all_reduce, broadcast, reduce
    x = data(1)
    pair = fresh(x)
    dist.all_reduce(pair[0])
    want = x.clone()
    dist.all_reduce(want, group=gloo)
    check("all_reduce", [pair], [want])
    for src in range(P):
        pair, want = fresh(data(2)), data(2)
        dist.broadcast(pair[0], src=src)
        dist.broadcast(want, src=src, group=gloo)
        check(f"broadcast src={src}", [pair], [want])
        pair, want = fresh(data(3)), data(3)
        dist.reduce(pair[0], dst=src)
        dist.reduce(want, dst=src, group=gloo)
        if rank == src:
            check(f"reduce dst={src}", [pair], [want])
    # all_gather (list) and all_gather_into_tensor
    x = data(4)
    outputs = [fresh(torch.zeros(count)) for _ in range(P)]
    source = fresh(x)
    dist.all_gather([view for view, _ in outputs], source[0])
    wants = [torch.zeros(count) for _ in range(P)]
    dist.all_gather(wants, x, group=gloo)
    check("all_gather", outputs, wants)
    check("all_gather input", [source], [x])
    flat = fresh(torch.zeros(count * P))
    dist.all_gather_into_tensor(flat[0], fresh(x)[0])
    check("all_gather_into_tensor", [flat], [torch.cat(wants)])
    # gather, scatter
    for root in range(P):
        x = data(5)
        outputs = [fresh(torch.zeros(count)) for _ in range(P)] if rank == root else None
        dist.gather(fresh(x)[0], [view for view, _ in outputs] if outputs else None, dst=root)
        wants = [torch.zeros(count) for _ in range(P)] if rank == root else None
        dist.gather(x, wants, dst=root, group=gloo)
        if rank == root:
            check(f"gather dst={root}", outputs, wants)
        pieces = [data(6 + k) for k in range(P)]
        target = fresh(torch.zeros(count))
        dist.scatter(target[0], [fresh(p)[0] for p in pieces] if rank == root else None, src=root)
        want = torch.zeros(count)
        dist.scatter(want, pieces if rank == root else None, src=root, group=gloo)
        check(f"scatter src={root}", [target], [want])
    # reduce_scatter (list) and reduce_scatter_tensor
    pieces = [data(20 + k) for k in range(P)]
    target = fresh(torch.zeros(count))
    dist.reduce_scatter(target[0], [fresh(p)[0] for p in pieces])
    want = torch.zeros(count)
    dist.reduce_scatter(want, [p.clone() for p in pieces], group=gloo)
    check("reduce_scatter", [target], [want])
    target = fresh(torch.zeros(count))
    dist.reduce_scatter_tensor(target[0], fresh(torch.cat(pieces))[0])
    check("reduce_scatter_tensor", [target], [want])
    # all_to_all_single (even split) and all_to_all (list)
    x = data(40, count * P)
    out = fresh(torch.zeros(count * P))
    dist.all_to_all_single(out[0], fresh(x)[0])
    want = torch.zeros(count * P)
    dist.all_to_all_single(want, x.clone(), group=gloo)
    check("all_to_all_single", [out], [want])
    pieces = [data(50 + k) for k in range(P)]
    outputs = [fresh(torch.zeros(count)) for _ in range(P)]
    dist.all_to_all([view for view, _ in outputs], [fresh(p)[0] for p in pieces])
    # gloo has no all_to_all (list); its closed form: piece k of rank j lands in slot j of rank k
    wants = [make_input(j * 31 + 50 + rank, count, torch.float32) for j in range(P)]
    check("all_to_all", outputs, wants)
    # send/recv around a ring
    if P > 1:
        right, left = (rank + 1) % P, (rank - 1) % P
        target = fresh(torch.zeros(count))
        send = dist.isend(fresh(data(60))[0], right)
        dist.recv(target[0], left)
        send.wait()
        check("send/recv", [target], [make_input(left * 31 + 60, count, torch.float32)])
    return sweep.result()


def barrier_synchronises(rank, world_size, folder, late_rank, delay_s):
    """Each rank writes its marker file, then enters the barrier; rank `late_rank` first sleeps
    `delay_s`. After the barrier every marker must exist, and every rank must have waited for the
    late one (no rank leaves the barrier before the last one entered)."""
    entered = time.monotonic()
    if rank == late_rank:
        time.sleep(delay_s)
    with open(os.path.join(folder, f"marker-{rank}"), "w") as marker:
        marker.write("here")
    dist.barrier()
    left = time.monotonic()
    missing = [r for r in range(world_size) if not os.path.exists(os.path.join(folder, f"marker-{r}"))]
    return {"missing": missing, "waited_s": left - entered}


def half_precision_sums(rank, world_size, count, algorithm):
    """fp16/bf16 inputs whose sums are not exact in the dtype (random mantissas). The reference is
    the sum of the same half-precision inputs in float32, rounded once to the dtype. 2 ranks: one
    addition, so the result must equal the reference bit for bit (a kernel that accumulates or
    rounds wrongly cannot). More ranks add in a tree or ring order, rounding after each of the
    P-1 additions: each rounding is at most half an ulp of a partial sum, and every partial sum is
    bounded by the sum of |inputs|, so |result - reference| <= (P-1)/2 ulp(sum |x|) + 1/2 ulp(ref)."""
    from torch_ddp_lite import set_algorithms

    set_algorithms(f"allreduce:{algorithm},reduce_scatter:{'ring' if algorithm == 'ring' else 'halving'}")
    failures = []
    checked = 0
    for dtype in (torch.float16, torch.bfloat16):
        everyone = [torch.randn(count, generator=torch.Generator().manual_seed(900 + r)).mul(3).to(dtype)
                    for r in range(world_size)]
        stacked = torch.stack([t.float() for t in everyone])
        reference = stacked.sum(0).to(dtype)
        magnitude = stacked.abs().sum(0).to(dtype).float()
        eps = torch.finfo(dtype).eps

        def ulp(value):
            # spacing of the dtype at |value| (its smallest normal spacing near zero)
            exponent = torch.floor(torch.log2(value.abs().clamp_min(torch.finfo(dtype).tiny)))
            return torch.pow(2.0, exponent) * eps

        bound = (world_size - 1) / 2 * ulp(magnitude) + ulp(reference.float()) / 2
        results = {}
        reduced = everyone[rank].clone()
        dist.all_reduce(reduced)
        results["all_reduce"] = (reduced, reference)
        shard = torch.zeros(count // world_size, dtype=dtype)
        cut = shard.numel() * world_size
        dist.reduce_scatter_tensor(shard, everyone[rank][:cut].clone())
        piece = slice(rank * shard.numel(), (rank + 1) * shard.numel())
        results["reduce_scatter_tensor"] = (shard, reference[piece])
        for name, (actual, expected) in results.items():
            sl = slice(None) if name == "all_reduce" else piece
            checked += 1
            if actual.dtype != dtype:
                failures.append(f"{name} {dtype}: dtype {actual.dtype}")
            elif world_size <= 2:
                if not torch.equal(actual, expected):
                    wrong = (actual != expected).nonzero().flatten()[:4].tolist()
                    failures.append(f"{name} {dtype} {algorithm}: not the once-rounded float32 sum at {wrong}: "
                                    f"{actual[wrong].tolist()} vs {expected[wrong].tolist()}")
            else:
                error = (actual.float() - expected.float()).abs()
                over = (error > bound[sl]).nonzero().flatten()[:4].tolist()
                if over:
                    failures.append(f"{name} {dtype} {algorithm}: beyond the rounding bound at {over}: "
                                    f"{actual[over].tolist()} vs {expected[over].tolist()}")
    return {"failures": failures, "checked": checked}


def kernel_set_and_half_sum(rank, world_size):
    """(the reduction kernel set the group uses, an fp16 all_reduce of rank + 1)."""
    tensor = torch.full((5,), float(rank + 1), dtype=torch.float16)
    dist.all_reduce(tensor)
    import torch_ddp_lite

    backend = dist.group.WORLD._get_backend(torch.device("cpu"))
    return torch_ddp_lite._load_extension().group_kernel_set(backend), tensor.tolist()


def uint64_top_bit(rank, world_size):
    """uint64 values at and above 2**63, where a signed compare or a float detour goes wrong:
    MIN/MAX must compare unsigned, SUM must wrap modulo 2**64, AVG must divide the unsigned sum."""
    top = 1 << 63
    base = torch.tensor([top + rank, top - 1 - rank, (1 << 64) - 1 - rank], dtype=torch.uint64)
    results = {}
    for op in (ReduceOp.MIN, ReduceOp.MAX, ReduceOp.SUM, ReduceOp.AVG, ReduceOp.BXOR):
        tensor = base.clone()
        dist.all_reduce(tensor, op=op)
        results[op_name(op)] = [int(v) for v in tensor.tolist()]
    return results


def float8_reductions_refused(rank, world_size):
    """Every reduction of a float8 tensor on CPU is refused on the caller's thread; the group then
    still moves float8 and reduces float32 correctly."""
    outcomes = {}
    x = torch.ones(4, dtype=torch.float8_e4m3fn)
    calls = {
        "all_reduce": lambda: dist.all_reduce(x.clone()),
        "reduce": lambda: dist.reduce(x.clone(), dst=0),
        "reduce_scatter_tensor": lambda: dist.reduce_scatter_tensor(
            torch.empty(4, dtype=x.dtype), torch.ones(4 * world_size, dtype=x.dtype)),
        "all_reduce_coalesced": lambda: dist.all_reduce_coalesced([x.clone(), x.clone()]),
    }
    for name, call in calls.items():
        try:
            call()
            outcomes[name] = None
        except Exception as error:  # noqa: BLE001 - the type is what the test checks
            outcomes[name] = (type(error).__name__, str(error))
    moved = torch.full((3,), float(rank + 1)).to(torch.float8_e5m2)
    dist.broadcast(moved, src=world_size - 1)
    total = torch.full((2,), float(rank + 1))
    dist.all_reduce(total)
    return {"refused": outcomes, "broadcast": moved.float().tolist(), "sum": total.tolist()}


def refused_dtype(rank, world_size, dtype):
    """(error type, message) of an all_reduce on a dtype ddplite does not serve."""
    try:
        dist.broadcast(torch.zeros(3, dtype=dtype), src=0)
    except Exception as error:  # noqa: BLE001 - the type is what the test checks
        return type(error).__name__, str(error)
    return None


def _thread_sleeps_and_cpu(thread_id):
    """(times thread `thread_id` of this process slept, seconds it has run): its voluntary context
    switches (a futex or poll() that blocked; a sched_yield is not one) and schedstat's run time."""
    with open(f"/proc/self/task/{thread_id}/status") as status:
        sleeps = [int(line.split()[1]) for line in status if line.startswith("voluntary_ctxt_switches:")]
    with open(f"/proc/self/task/{thread_id}/schedstat") as schedstat:
        ran_ns = int(schedstat.read().split()[0])
    assert len(sleeps) == 1, f"no voluntary_ctxt_switches in /proc/self/task/{thread_id}/status"
    return sleeps[0], ran_ns / 1e9


def sleeps_while_a_peer_is_late(rank, world_size, late_rank, late_s=0.005, ops=20, untimed_sync_ops=0):
    """`ops` all_reduces of 8 bytes for which `late_rank` arrives late_s late each time, issued
    sync (run on this thread: DDPLITE_SYNC_ON_CALLER) then async (run on the group's worker, waited
    for with wait()), the sync ones after `untimed_sync_ops` more of them, late the same way and
    not counted. Returns per issue, for the thread that ran the ops, how often it slept and how
    many seconds it ran, per op; and whether every sum was right (closed form)."""
    import threading

    import observability_workers

    workers_before = [tid for tid, name in observability_workers.threads_by_id().items() if name == "ddplite-worker"]
    assert len(workers_before) == 1, workers_before  # the WORLD group's, so its counts are the ops'
    seen = {"right": True}
    for name, async_op in (("sync", False), ("async", True)):
        counted = workers_before[0] if async_op else threading.get_native_id()
        dist.barrier()
        untimed = 0 if async_op else untimed_sync_ops
        for op in range(-untimed, ops):
            if op == 0:
                sleeps_before, ran_before = _thread_sleeps_and_cpu(counted)
            tensor = torch.full((2,), float(rank + op), dtype=torch.float32)
            if rank == late_rank:
                time.sleep(late_s)
            work = dist.all_reduce(tensor, async_op=async_op)
            if async_op:
                work.wait()
            expected = float(world_size * op + world_size * (world_size - 1) // 2)
            seen["right"] = seen["right"] and tensor.tolist() == [expected, expected]
        sleeps, ran = _thread_sleeps_and_cpu(counted)
        seen[name] = {"sleeps": (sleeps - sleeps_before) / ops, "cpu_s": (ran - ran_before) / ops}
    return seen
