"""Functions that run on each rank for tests/test_cuda.py (GPU only; see harness.py).

Each rank takes GPU ``rank % device_count``, so 2 ranks on a 1-GPU machine share it (ddplite then
stages through host memory). Every check appends to a list of failures instead of stopping, so
one run reports all of them.
"""

import torch
import torch.distributed as dist

ReduceOp = dist.ReduceOp

DTYPES = [torch.float16, torch.bfloat16, torch.float32, torch.float64, torch.int8, torch.uint8, torch.int32,
          torch.int64]
FP8_DTYPES = [torch.float8_e4m3fn, torch.float8_e5m2]
OPS = [ReduceOp.SUM, ReduceOp.AVG, ReduceOp.PRODUCT, ReduceOp.MIN, ReduceOp.MAX]
COUNT = 1000


def take_gpu(rank):
    device = torch.device("cuda", rank % torch.cuda.device_count())
    torch.cuda.set_device(device)
    return device


def inputs(rank, dtype, device, count=COUNT, op=ReduceOp.SUM):
    """Small integers (exact in every dtype); 1 and 2 for PRODUCT so nothing overflows."""
    i = torch.arange(count, dtype=torch.int64)
    values = 1 + (i + rank) % 2 if op == ReduceOp.PRODUCT else (i * 7 + rank * 5) % 11
    return values.to(dtype).to(device)


class Checks:
    def __init__(self, rank):
        self.rank = rank
        self.failures = []
        self.checked = 0

    def same(self, label, actual, expected, exact=True):
        self.checked += 1
        actual, expected = actual.cpu(), expected.cpu()
        if actual.dtype in FP8_DTYPES:
            actual, expected = actual.float(), expected.float()
        ok = torch.equal(actual, expected) if exact else torch.allclose(actual.double(), expected.double(),
                                                                        rtol=1e-2, atol=1e-2)
        if not ok:
            self.failures.append(f"rank {self.rank} {label}: got {actual.flatten()[:6].tolist()} "
                                 f"expected {expected.flatten()[:6].tolist()}")

    def result(self):
        return {"failures": self.failures, "checked": self.checked}


PREMUL_FACTOR = 3.0


def premul_ops(dtype):
    return [dist._make_nccl_premul_sum(PREMUL_FACTOR)] if dtype.is_floating_point else []


def nccl_misreads_premul_factor(other_backend, dtype, op):
    """torch's NCCL backend passes a bfloat16 premul_sum's scalar factor to NCCL as a float
    (unpackPreMulSum<float, ncclBfloat16> in ProcessGroupNCCL.cpp, torch 2.11), and NCCL reads its
    first two bytes as the bfloat16: 3.0 becomes 0.0 and the result zeros (seen on the H200,
    2026-11-30). Such a result is checked against the closed form instead."""
    return other_backend == "nccl" and dtype == torch.bfloat16 and not isinstance(op, ReduceOp.RedOpType)


def same_as_other_backend(rank, world_size, other_backend):
    """Every collective, dtype and reduce op on ddplite (the default group) and on `other_backend`
    over the same ranks and inputs; nccl results must match bit for bit, gloo (CPU copies) too
    except for AVG."""
    device = take_gpu(rank)
    other = dist.new_group(backend=other_backend)
    other_device = device if other_backend == "nccl" else torch.device("cpu")
    checks = Checks(rank)

    def both(label, run, make, exact=True, root_only=False):
        mine = make(device)
        theirs = make(other_device)
        run(mine, None)
        try:
            run(theirs, other)
        except (RuntimeError, ValueError) as error:
            if other_backend == "gloo":  # a dtype or op gloo lacks: nothing to compare with
                return
            raise
        if root_only and rank != 0:
            return
        for index, (a, b) in enumerate(zip(mine, theirs)):
            checks.same(f"{label}[{index}]", a, b, exact)

    for dtype in DTYPES:
        name = str(dtype).split(".")[-1]
        for op in OPS + premul_ops(dtype):
            if other_backend == "gloo" and (op == ReduceOp.AVG or not isinstance(op, ReduceOp.RedOpType)):
                continue
            if nccl_misreads_premul_factor(other_backend, dtype, op):
                mine = inputs(rank, dtype, device, op=op)
                dist.all_reduce(mine, op=op)
                closed_form = PREMUL_FACTOR * sum(inputs(r, torch.float64, "cpu", op=op) for r in range(world_size))
                checks.same(f"all_reduce {name} premul_sum (closed form)", mine, closed_form.to(dtype))
                continue
            both(f"all_reduce {name} {op}", lambda t, g, op=op: dist.all_reduce(t[0], op=op, group=g),
                 lambda d, op=op: [inputs(rank, dtype, d, op=op)], exact=op != ReduceOp.AVG)
        both(f"broadcast {name}", lambda t, g: dist.broadcast(t[0], src=0, group=g),
             lambda d: [inputs(rank, dtype, d)])
        both(f"reduce {name}", lambda t, g: dist.reduce(t[0], dst=0, group=g), lambda d: [inputs(rank, dtype, d)],
             root_only=True)
        both(f"all_gather {name}",
             lambda t, g: dist.all_gather(t[1:], t[0], group=g),
             lambda d: [inputs(rank, dtype, d)] + [torch.zeros(COUNT, dtype=dtype, device=d) for _ in range(world_size)])
        both(f"all_gather_into_tensor {name}",
             lambda t, g: dist.all_gather_into_tensor(t[1], t[0], group=g),
             lambda d: [inputs(rank, dtype, d), torch.zeros(COUNT * world_size, dtype=dtype, device=d)])
        both(f"reduce_scatter_tensor {name}",
             lambda t, g: dist.reduce_scatter_tensor(t[1], t[0], group=g),
             lambda d: [inputs(rank, dtype, d, COUNT * world_size), torch.zeros(COUNT, dtype=dtype, device=d)])
        if other_backend == "nccl":  # gloo has no list reduce_scatter
            both(f"reduce_scatter {name}",
                 lambda t, g: dist.reduce_scatter(t[0], list(t[1:]), group=g),
                 lambda d: [torch.zeros(COUNT, dtype=dtype, device=d)]
                 + [inputs(rank + r, dtype, d) for r in range(world_size)])
        both(f"all_to_all_single {name}",
             lambda t, g: dist.all_to_all_single(t[1], t[0], group=g),
             lambda d: [inputs(rank, dtype, d, COUNT * world_size), torch.zeros(COUNT * world_size, dtype=dtype, device=d)])
        both(f"gather {name}",
             lambda t, g: dist.gather(t[0], list(t[1:]) if rank == 0 else None, dst=0, group=g),
             lambda d: [inputs(rank, dtype, d)] + ([torch.zeros(COUNT, dtype=dtype, device=d) for _ in range(world_size)]
                                                  if rank == 0 else []))
        both(f"scatter {name}",
             lambda t, g: dist.scatter(t[0], list(t[1:]) if rank == 0 else None, src=0, group=g),
             lambda d: [torch.zeros(COUNT, dtype=dtype, device=d)]
             + ([inputs(r, dtype, d) for r in range(world_size)] if rank == 0 else []))
    dist.barrier(device_ids=[device.index])
    checks.checked += 1
    return checks.result()


def coalesced_and_fp8(rank, world_size):
    """Coalesced collectives through the ProcessGroup, and float8 against the closed form.

    torch.distributed has no public wrappers for these three; the ProcessGroup methods dispatch on
    the tensors' device to ddplite's backend for CUDA. float8 runs on NCCL and on the staged path
    alike (staging moves its bytes, and reduces through float32: MAX stays exact).
    """
    from torch._C._distributed_c10d import AllgatherOptions, AllreduceCoalescedOptions, ReduceScatterOptions
    device = take_gpu(rank)
    checks = Checks(rank)
    pg = dist.group.WORLD
    tensors = [inputs(rank, torch.float32, device, n) for n in (3, 1000, 70000)]
    expected = [sum(inputs(r, torch.float32, device, t.numel()) for r in range(world_size)) for t in tensors]
    pg.allreduce_coalesced(tensors, AllreduceCoalescedOptions()).wait()
    for index, (t, e) in enumerate(zip(tensors, expected)):
        checks.same(f"allreduce_coalesced[{index}]", t, e)
    ins = [inputs(rank, torch.int32, device, n) for n in (5, 4096)]
    outs = [torch.zeros(n * world_size, dtype=torch.int32, device=device) for n in (5, 4096)]
    pg.allgather_into_tensor_coalesced(outs, ins, AllgatherOptions()).wait()
    for index, (o, n) in enumerate(zip(outs, (5, 4096))):
        checks.same(f"allgather_into_tensor_coalesced[{index}]", o,
                    torch.cat([inputs(r, torch.int32, device, n) for r in range(world_size)]))
    ins = [inputs(rank, torch.float64, device, n * world_size) for n in (5, 4096)]
    outs = [torch.zeros(n, dtype=torch.float64, device=device) for n in (5, 4096)]
    pg.reduce_scatter_tensor_coalesced(outs, ins, ReduceScatterOptions()).wait()
    for index, (o, n) in enumerate(zip(outs, (5, 4096))):
        total = sum(inputs(r, torch.float64, device, n * world_size) for r in range(world_size))
        checks.same(f"reduce_scatter_tensor_coalesced[{index}]", o, total[rank * n:(rank + 1) * n])
    import torch_ddp_lite
    if torch_ddp_lite.build_info()["nccl"].get("fp8"):
        for dtype in FP8_DTYPES:
            t = inputs(rank, dtype, device)
            dist.all_reduce(t, op=ReduceOp.MAX)
            checks.same(f"all_reduce MAX {dtype}", t,
                        torch.stack([inputs(r, torch.float32, device) for r in range(world_size)]).amax(0).to(dtype))
            out = torch.zeros(COUNT * world_size, dtype=dtype, device=device)
            dist.all_gather_into_tensor(out, inputs(rank, dtype, device))
            checks.same(f"all_gather_into_tensor {dtype}", out,
                        torch.cat([inputs(r, dtype, device) for r in range(world_size)]))
            b = inputs(rank, dtype, device)
            dist.broadcast(b, src=0)
            checks.same(f"broadcast {dtype}", b, inputs(0, dtype, device))
    return checks.result()


def point_to_point(rank, world_size):
    device = take_gpu(rank)
    checks = Checks(rank)
    dist.all_reduce(torch.ones(1, device=device))  # every rank creates the communicator first
    peer = (rank + 1) % world_size
    source = (rank - 1) % world_size
    outgoing = torch.full((4096,), float(rank), device=device)
    incoming = torch.zeros(4096, device=device)
    if rank % 2 == 0:
        dist.send(outgoing, peer)
        dist.recv(incoming, source)
    else:
        dist.recv(incoming, source)
        dist.send(outgoing, peer)
    checks.same("send/recv ring", incoming, torch.full((4096,), float(source), device=device))
    return checks.result()


def stream_semantics(rank, world_size):
    """No explicit synchronisation anywhere: the collective must wait for the kernel that made
    its input, the next kernel on the current stream must see its output, and inputs freed right
    after an async op must not be overwritten while NCCL reads them."""
    device = take_gpu(rank)
    checks = Checks(rank)
    side = torch.cuda.Stream(device)
    n = 2048
    with torch.cuda.stream(side):
        a = torch.ones(n, n, device=device)
        produced = (a @ a)[0] / n  # all ones, produced by a slow kernel on `side`
        dist.all_reduce(produced, op=dist._make_nccl_premul_sum(3.0))
        consumed = produced + 1  # on `side`, right after wait() made `side` wait on NCCL
    side.synchronize()
    checks.same("premul allreduce consumed on the current stream", consumed,
                torch.full((n,), 3.0 * world_size + 1, device=device))
    out = torch.zeros(COUNT * world_size, device=device)
    source = torch.full((COUNT,), float(rank + 7), device=device)
    torch.cuda._sleep(50_000_000)  # keeps the NCCL stream waiting while the input is freed and reused
    work = dist.all_gather_into_tensor(out, source, async_op=True)
    del source
    junk = [torch.full((COUNT,), -1.0, device=device) for _ in range(16)]
    work.wait()
    torch.cuda.synchronize()
    checks.same("input freed right after an async op", out,
                torch.cat([torch.full((COUNT,), float(r + 7)) for r in range(world_size)]).to(device))
    del junk
    fut = dist.all_reduce(torch.ones(8, device=device), async_op=True).get_future()
    checks.same("CUDA future then()", fut.then(lambda f: f.value()[0] * 2).wait(),
                torch.full((8,), 2.0 * world_size, device=device))
    return checks.result()


def shared_gpu_mode(rank, world_size):
    """Runs once on a group whose ranks share a GPU; returns what ddplite decided (a warning is logged)."""
    device = take_gpu(rank)
    t = torch.full((10,), float(rank), device=device)
    dist.all_reduce(t)
    return {"value": t.cpu(), "device": str(device)}


def ddp_resnet18(rank, world_size, steps=20, batch_per_rank=8):
    """torchvision ResNet-18 (10 classes), DDP on CUDA, deterministic data; returns the parameters."""
    import torchvision
    from torch.nn.parallel import DistributedDataParallel
    device = take_gpu(rank)
    torch.backends.cudnn.deterministic = True
    torch.backends.cudnn.benchmark = False
    torch.manual_seed(0)
    model = torchvision.models.resnet18(num_classes=10).to(device)
    model = DistributedDataParallel(model, device_ids=[device.index])
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    generator = torch.Generator().manual_seed(1)
    images = torch.randn(steps, world_size * batch_per_rank, 3, 32, 32, generator=generator)
    labels = torch.randint(0, 10, (steps, world_size * batch_per_rank), generator=generator)
    mine = slice(rank * batch_per_rank, (rank + 1) * batch_per_rank)
    for step in range(steps):
        optimizer.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(images[step, mine].to(device)), labels[step, mine].to(device))
        loss.backward()
        optimizer.step()
    return {name: p.detach().cpu() for name, p in model.module.named_parameters()}


def watchdog_timeout(rank, world_size):
    """Rank 1 skips a collective: rank 0's watchdog must abort and fail it with a DistBackendError."""
    device = take_gpu(rank)
    dist.all_reduce(torch.ones(1, device=device))
    if rank != 0:
        return {"skipped": True}
    try:
        work = dist.all_reduce(torch.ones(1, device=device), async_op=True)
        work.wait(timeout=__import__("datetime").timedelta(seconds=60))
        torch.cuda.synchronize()
        return {"raised": None}
    except Exception as error:  # noqa: BLE001
        return {"raised": type(error).__name__, "message": str(error)}


def _staged(world_size):
    """Whether ddplite serves this run's GPUs by host staging (ranks share a GPU, or forced)."""
    import os
    return world_size > torch.cuda.device_count() or os.environ.get("DDPLITE_CUDA_STAGING") == "always"


def review_cases(rank, world_size):
    """The cases a review of the NCCL path found wrong, each against its closed form.

    batch_isend_irecv in torch's docstring ring (send to rank + 1, receive from rank - 1) hangs when
    the sends are issued one by one outside an NCCL group (at world size 1 the rank sends to
    itself, which NCCL can only pair inside one group); 64 MiB messages exceed NCCL's buffers.
    """
    device = take_gpu(rank)
    checks = Checks(rank)
    dist.all_reduce(torch.ones(1, device=device))  # every rank creates the communicator first
    nxt, prev = (rank + 1) % world_size, (rank - 1) % world_size
    for count in (5, 16 * 1024 * 1024):
        send = torch.arange(count, dtype=torch.float32, device=device) + 1000 * rank
        recv = torch.zeros(count, device=device)
        works = dist.batch_isend_irecv([dist.P2POp(dist.isend, send, nxt), dist.P2POp(dist.irecv, recv, prev)])
        for work in works:
            work.wait()
        checks.same(f"batch_isend_irecv ring {count}: one Work", torch.tensor(len(works)), torch.tensor(1))
        checks.same(f"batch_isend_irecv ring {count}", recv, torch.arange(count, dtype=torch.float32) + 1000 * prev)
    # collectives in a coalescing manager: issued as one NCCL group, one Work
    tensors = [torch.full((3,), float(rank + 1), device=device), torch.full((100_000,), float(rank), device=device)]
    with dist._coalescing_manager(device=device, async_ops=True) as manager:
        for tensor in tensors:
            dist.all_reduce(tensor)
    manager.wait()
    n = world_size
    checks.same("coalescing manager all_reduce[0]", tensors[0], torch.full((3,), float(n * (n + 1) // 2)))
    checks.same("coalescing manager all_reduce[1]", tensors[1], torch.full((100_000,), float(n * (n - 1) // 2)))
    # bool: SUM/MAX is "any", MIN/PRODUCT is "all"
    flags = torch.tensor([rank == 0, True, False], device=device)
    for op, expected in ((ReduceOp.SUM, [True, True, False]), (ReduceOp.MIN, [world_size == 1, True, False])):
        t = flags.clone()
        dist.all_reduce(t, op=op)
        checks.same(f"all_reduce bool {op}", t, torch.tensor(expected))
    # PREMUL_SUM with a tensor factor: on the CPU (read on the host) and on the GPU (read by NCCL)
    for where in ("cpu", device):
        t = torch.full((1000,), float(rank + 1), device=device)
        dist.all_reduce(t, op=dist._make_nccl_premul_sum(torch.tensor([0.5], device=where)))
        checks.same(f"PREMUL_SUM factor on {where}", t, torch.full((1000,), 0.5 * n * (n + 1) / 2))
    # list all_to_all with uneven sizes: rank r sends r + d + 1 elements to rank d
    ins = [torch.full((rank + d + 1,), float(rank * 10 + d), device=device) for d in range(world_size)]
    outs = [torch.zeros(s + rank + 1, device=device) for s in range(world_size)]
    dist.all_to_all(outs, ins)
    for s in range(world_size):
        checks.same(f"all_to_all list from {s}", outs[s], torch.full((s + rank + 1,), float(s * 10 + rank)))
    # complex SUM through the real view; uint16 and float8 moved as bytes
    z = torch.full((7,), complex(rank, -rank), dtype=torch.complex64, device=device)
    dist.all_reduce(z)
    checks.same("all_reduce complex64", z, torch.full((7,), complex(n * (n - 1) / 2, -n * (n - 1) / 2), dtype=torch.complex64))
    u = torch.arange(9, dtype=torch.uint16, device=device) + rank
    dist.broadcast(u, src=0)
    checks.same("broadcast uint16", u, torch.arange(9, dtype=torch.uint16))
    for dtype in FP8_DTYPES:
        out = torch.zeros(COUNT * world_size, dtype=dtype, device=device)
        dist.all_gather_into_tensor(out, inputs(rank, dtype, device))
        checks.same(f"all_gather_into_tensor {dtype}", out, torch.cat([inputs(r, dtype, device) for r in range(world_size)]))
        t = inputs(rank, dtype, device)
        refused = not _staged(world_size) and torch.cuda.get_device_capability(device) < (9, 0)
        try:
            dist.all_reduce(t, op=ReduceOp.MAX)
            outcome = "ok"
        except ValueError as error:
            outcome = "ValueError" if "compute capability 9.0" in str(error) else f"ValueError: {error}"
        checks.checked += 1
        if outcome != ("ValueError" if refused else "ok"):
            checks.failures.append(f"rank {rank} fp8 {dtype} MAX on cc {torch.cuda.get_device_capability(device)}: {outcome}")
        elif not refused:
            checks.same(f"all_reduce MAX {dtype}", t,
                        torch.stack([inputs(r, torch.float32, device) for r in range(world_size)]).amax(0).to(dtype))
    # a subgroup of every rank, and one of rank 0 alone: own communicators, right values
    for ranks in (list(range(world_size)), [0]):
        group = dist.new_group(ranks)
        if rank in ranks:
            t = torch.full((4,), float(rank + 1), device=device)
            dist.all_reduce(t, group=group)
            checks.same(f"subgroup {ranks}", t, torch.full((4,), float(sum(r + 1 for r in ranks))))
    torch.cuda.synchronize()
    return checks.result()


def abort_with_pending_work(rank, world_size):
    """Large async all_reduces queued, then abort(): every Work fails with DistBackendError (none
    reports success), nothing crashes, the GPU drains, and a new group works."""
    import datetime

    device = take_gpu(rank)
    dist.all_reduce(torch.ones(1, device=device))
    works = [dist.all_reduce(torch.ones(32 * 1024 * 1024, device=device), async_op=True) for _ in range(4)]
    dist.group.WORLD.abort()
    outcomes = []
    for work in works:
        try:
            work.wait(timeout=datetime.timedelta(seconds=30))
            outcomes.append("ok" if work.is_completed() else "not completed")
        except Exception as error:  # noqa: BLE001
            outcomes.append(type(error).__name__)
    torch.cuda.synchronize()
    return {"outcomes": outcomes}


def unpaired_self_sends(rank, world_size):
    """Sends to itself that NCCL cannot pair in their batch (no receive; a receive of another
    size): each such op's Work fails alone with a ValueError, before NCCL sees it, and the
    communicator is not aborted: the next all_reduce and a paired send to itself are right."""
    device = take_gpu(rank)
    checks = Checks(rank)
    dist.all_reduce(torch.ones(1, device=device))  # the communicator first
    batches = {
        "a send to itself without a receive": [dist.P2POp(dist.isend, torch.ones(4, device=device), rank)],
        "a receive of another size": [dist.P2POp(dist.isend, torch.ones(4, device=device), rank),
                                      dist.P2POp(dist.irecv, torch.zeros(5, device=device), rank)],
    }
    for label, ops in batches.items():
        try:
            for work in dist.batch_isend_irecv(ops):
                work.wait()
            outcome = "no error"
        except ValueError as error:
            outcome = "refused" if "NCCL cannot pair it" in str(error) else f"ValueError: {error}"
        except Exception as error:  # noqa: BLE001 - any other outcome is the failure reported
            outcome = f"{type(error).__name__}: {error}"
        checks.checked += 1
        if outcome != "refused":
            checks.failures.append(f"rank {rank} {label}: {outcome}")
    summed = torch.full((3,), float(rank + 1), device=device)
    dist.all_reduce(summed)
    checks.same("all_reduce after the refusals", summed, torch.full((3,), float(world_size * (world_size + 1) // 2)))
    sent, received = torch.arange(6.0, device=device), torch.zeros(6, device=device)
    for work in dist.batch_isend_irecv([dist.P2POp(dist.isend, sent, rank), dist.P2POp(dist.irecv, received, rank)]):
        work.wait()
    checks.same("a paired send to itself", received, torch.arange(6.0))
    return checks.result()


def eager_connect_and_split(rank, world_size):
    """What init_process_group(device_id=cuda:i) does to the default group (bind it, then
    eager_connect_single_device), then split_group: the new groups' communicators come from
    ncclCommSplit of the default group's. Their collectives must be right."""
    device = take_gpu(rank)
    world = dist.group.WORLD
    world.bound_device_id = device
    world._get_backend(device).eager_connect_single_device(device)
    checks = Checks(rank)
    for splits in ([list(range(world_size))], [[r] for r in range(world_size)]):
        group = dist.split_group(split_ranks=splits)
        mine = next(s for s in splits if rank in s)
        t = torch.full((1000,), float(rank + 1), device=device)
        dist.all_reduce(t, group=group)
        checks.same(f"split {splits}", t, torch.full((1000,), float(sum(r + 1 for r in mine))))
    # Ranks in reverse order: torch 2.14+ numbers them by position (global rank n-1 is group rank
    # 0; earlier torches sort them), and the NCCL rank (ncclCommSplit's key) must be that number.
    group = dist.split_group(split_ranks=[list(range(world_size))[::-1]])
    order = dist.get_process_group_ranks(group)
    value = torch.full((8,), float(rank * 10), device=device)
    dist.broadcast(value, src=order[0], group=group)
    checks.same("reversed split broadcast from group rank 0", value, torch.full((8,), float(order[0] * 10), device=device))
    gathered = [torch.zeros(2, device=device) for _ in range(world_size)]
    dist.all_gather(gathered, torch.full((2,), float(rank), device=device), group=group)
    checks.same("reversed split all_gather order", torch.stack(gathered)[:, 0].cpu(), torch.tensor(order, dtype=torch.float32))
    t = torch.ones(4, device=device)
    dist.all_reduce(t)  # the parent still works
    checks.same("parent after splits", t, torch.full((4,), float(world_size)))
    torch.cuda.synchronize()
    return checks.result()


def shrink_after_exit(rank, world_size):
    """shrink_group on a group whose CUDA communicator exists: the last rank leaves (it exits);
    the others shrink without it (ncclCommShrink of the parent's communicator where NCCL is 2.27
    or later, else a new one), and the shrunk group's CUDA all_reduce gives the survivors' sum."""
    import os

    import torch_ddp_lite  # noqa: F401  (registers ddplite's shrunk groups as custom)

    device = take_gpu(rank)
    checks = Checks(rank)
    t = torch.full((1000,), float(rank + 1), device=device)
    dist.all_reduce(t)  # the parent's communicator on this GPU
    torch.cuda.synchronize()
    checks.same("parent", t, torch.full((1000,), float(world_size * (world_size + 1) // 2)))
    dist.barrier()
    leaving = world_size - 1
    if rank == leaving:
        os._exit(0)
    dist.shrink_group([leaving])
    t = torch.full((1000,), float(rank + 1), device=device)
    dist.all_reduce(t)
    torch.cuda.synchronize()
    checks.same("shrunk", t, torch.full((1000,), float(leaving * (leaving + 1) // 2)))
    checks.same("shrunk size", torch.tensor(dist.get_world_size()), torch.tensor(leaving))
    return checks.result()
