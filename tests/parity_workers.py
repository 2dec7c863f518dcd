"""Per-rank bodies for tests/test_parity.py: the torch.distributed calls gloo serves, run the same
way on gloo and on ddplite."""

import time
from datetime import timedelta

import torch
import torch.distributed as dist

import torch_ddp_lite


def paths():
    """[CPU collective transport, what carries send/recv] of the default group (ddplite)."""
    extension = torch_ddp_lite._load_extension()
    backend = dist.group.WORLD._get_backend(torch.device("cpu"))
    return [extension.group_transport(backend)[0], extension.group_p2p_path(backend)]


def _outcome(call):
    """("ok", seconds) or (error type, is a RuntimeError, message, seconds)."""
    start = time.monotonic()
    try:
        call()
        return ("ok", time.monotonic() - start)
    except Exception as error:  # noqa: BLE001 - the type is what the test compares
        return (type(error).__name__, isinstance(error, RuntimeError), str(error), time.monotonic() - start)


def monitored_barrier(rank, world_size, backend, missing, wait_all, timeout_s, idle_s):
    """Two barriers every rank passes (plain, then wait_all_ranks), then one the ranks in
    `missing` skip (they idle for `idle_s`, so that nobody sees them exit), then an all_reduce on
    the default (ddplite) group to show it is still usable. `backend`: "gloo" runs torch's own
    monitored_barrier on a gloo subgroup, "ddplite" torch_ddp_lite.monitored_barrier on the
    default group."""
    if backend == "gloo":
        group = dist.new_group(backend="gloo", timeout=timedelta(seconds=timeout_s + 3))
        barrier = dist.monitored_barrier
    else:
        group = None
        barrier = torch_ddp_lite.monitored_barrier
    timeout = timedelta(seconds=timeout_s)
    generous = timedelta(seconds=60)  # the passing rounds must not depend on how fast ranks start
    passed = [_outcome(lambda: barrier(group, timeout=generous)),
              _outcome(lambda: barrier(group, timeout=generous, wait_all_ranks=True))]
    dist.barrier()  # every rank starts the failing round together
    if rank in missing:
        time.sleep(idle_s)
        failed = None
    else:
        failed = _outcome(lambda: barrier(group, timeout=timeout, wait_all_ranks=wait_all))
    total = torch.full((2,), float(rank + 1))
    dist.all_reduce(total)
    return {"passed": passed, "failed": failed, "sum": total.tolist()}


def monitored_barrier_rank0_alone(rank, world_size, backend):
    """Only rank 0 calls, with a zero timeout: it has no time to wait for anyone."""
    group = dist.new_group(backend="gloo") if backend == "gloo" else None
    barrier = dist.monitored_barrier if backend == "gloo" else torch_ddp_lite.monitored_barrier
    outcome = _outcome(lambda: barrier(group, timeout=timedelta(seconds=0))) if rank == 0 else None
    dist.barrier()
    return outcome


ALLGATHER_COALESCED_SHAPES = [[(3,)], [(2, 4), (0,), (1,), (5, 1, 3)], [(1000,), (7,)]]
ALLGATHER_COALESCED_DTYPES = [torch.float32, torch.int64, torch.bfloat16, torch.bool, torch.uint8]


def _coalesced_inputs(rank, shapes, dtype):
    import workers

    return [workers.make_input(rank * 31 + i, int(torch.Size(shape).numel()), dtype).view(shape)
            for i, shape in enumerate(shapes)]


def all_gather_coalesced(rank, world_size):
    """dist.all_gather_coalesced on ddplite and on gloo, same inputs; the closed form too. Returns
    failures (empty when all agree) and how many cases were compared."""
    import warnings

    warnings.filterwarnings("ignore", category=FutureWarning)  # torch deprecates the call
    gloo = dist.new_group(backend="gloo")
    failures, checked = [], 0
    for dtype in ALLGATHER_COALESCED_DTYPES:
        for shapes in ALLGATHER_COALESCED_SHAPES:
            inputs = _coalesced_inputs(rank, shapes, dtype)
            expected = [_coalesced_inputs(r, shapes, dtype) for r in range(world_size)]
            results = {}
            for name, group in (("ddplite", None), ("gloo", gloo)):
                outputs = [[torch.zeros(shape, dtype=dtype) for shape in shapes] for _ in range(world_size)]
                future = dist.all_gather_coalesced(outputs, inputs, group=group, async_op=True)
                future.wait()
                results[name] = outputs
            for r in range(world_size):
                for i in range(len(shapes)):
                    for name in ("ddplite", "gloo"):
                        if not torch.equal(results[name][r][i], expected[r][i]):
                            failures.append(f"{name} {dtype} shapes={shapes} [{r}][{i}]")
                    checked += 1
            sync = [[torch.zeros(shape, dtype=dtype) for shape in shapes] for _ in range(world_size)]
            if dist.all_gather_coalesced(sync, inputs) is not None or any(
                    not torch.equal(sync[r][i], expected[r][i]) for r in range(world_size) for i in range(len(shapes))):
                failures.append(f"sync {dtype} shapes={shapes}")
    return {"failures": failures, "checked": checked}


def all_gather_coalesced_refusals(rank, world_size):
    """Bad argument lists, refused on ddplite (ValueError) where gloo refuses them (RuntimeError);
    the group stays usable."""
    import warnings

    warnings.filterwarnings("ignore", category=FutureWarning)
    gloo = dist.new_group(backend="gloo")
    cases = {
        "one list short": lambda: ([[torch.zeros(2)] for _ in range(world_size - 1)], [torch.ones(2)]),
        "list one tensor long": lambda: ([[torch.zeros(2), torch.zeros(2)] for _ in range(world_size)], [torch.ones(2)]),
        "output shape": lambda: ([[torch.zeros(2, 1)] for _ in range(world_size)], [torch.ones(2)]),
        "output dtype": lambda: ([[torch.zeros(2, dtype=torch.int32)] for _ in range(world_size)], [torch.ones(2)]),
    }
    outcomes = {}
    for name, make in cases.items():
        outcomes[name] = {}
        for backend, group in (("ddplite", None), ("gloo", gloo)):
            outputs, inputs = make()
            outcomes[name][backend] = _outcome(lambda: dist.all_gather_coalesced(outputs, inputs, group=group))[:3]
    total = torch.full((2,), float(rank + 1))
    dist.all_reduce(total)
    return {"outcomes": outcomes, "sum": total.tolist()}


def _ring_exchange(rank, world_size, group, count):
    """torch's batch_isend_irecv docstring pattern: send to rank + 1, receive from rank - 1."""
    send = torch.arange(count, dtype=torch.float32) + 1000 * rank
    recv = torch.zeros(count)
    ops = [dist.P2POp(dist.isend, send, (rank + 1) % world_size, group),
           dist.P2POp(dist.irecv, recv, (rank - 1) % world_size, group)]
    works = dist.batch_isend_irecv(ops)
    for work in works:
        work.wait()
    return works, recv


def coalescing(rank, world_size):
    """What torch's coalescing entry points do on ddplite, next to gloo (which does not coalesce)."""
    import warnings

    warnings.filterwarnings("ignore", category=FutureWarning)
    cpu = torch.device("cpu")
    gloo = dist.new_group(backend="gloo")
    out = {"paths": paths(), "supports": dist.group.WORLD._get_backend(cpu).supports_coalescing,
           "gloo_supports": gloo._get_backend(cpu).supports_coalescing}
    prev = (rank - 1) % world_size
    if world_size > 1:
        for count in (5, 300_000):  # large: more than a socket buffer in both directions at once
            works, got = _ring_exchange(rank, world_size, None, count)
            gloo_works, gloo_got = _ring_exchange(rank, world_size, gloo, count)
            expected = torch.arange(count, dtype=torch.float32) + 1000 * prev
            out[f"ring {count}"] = (len(works), len(gloo_works), torch.equal(got, expected), torch.equal(gloo_got, expected))
        work = works[0]
        out["ring work"] = (type(work).__name__, work.is_completed(), work.is_success(),
                            int(work.get_future_result().wait()), len(work.get_future().wait()))
    # collectives in the manager: torch's fast path (all_reduce -> one allreduce_coalesced) ...
    tensors = [torch.full((3,), float(rank + 1)), torch.full((1000,), float(rank))]
    with dist._coalescing_manager(device=cpu, async_ops=True) as manager:
        for tensor in tensors:
            dist.all_reduce(tensor)
    manager.wait()
    n = world_size
    out["fast path"] = (len(manager.works), tensors[0].tolist()[:1], tensors[1].tolist()[:1])
    expected_fast = ([float(n * (n + 1) // 2)], [float(n * (n - 1) // 2)])
    out["fast path ok"] = (out["fast path"][1], out["fast path"][2]) == expected_fast
    # ... and ops torch hands to the backend one by one between start and end, a blocking one among them
    root_value = torch.full((4,), float(rank))
    gathered = [torch.zeros(2) for _ in range(world_size)]
    with dist._coalescing_manager(device=cpu, async_ops=True) as manager:
        dist.broadcast(root_value, src=world_size - 1)
        dist.all_gather(gathered, torch.full((2,), float(rank * 10)))
        dist.barrier()
    manager.wait()
    out["one by one"] = (len(manager.works), root_value.tolist() == [float(world_size - 1)] * 4,
                         [g[0].item() for g in gathered] == [float(r * 10) for r in range(world_size)])
    with dist._coalescing_manager(device=cpu, async_ops=False):
        dist.broadcast(root_value.fill_(rank), src=0)
    out["sync"] = root_value.tolist() == [0.0] * 4
    try:
        dist.group.WORLD._end_coalescing(cpu)
        out["end without start"] = None
    except Exception as error:  # noqa: BLE001
        out["end without start"] = (type(error).__name__, str(error).split("\n")[0])
    return out


def coalesced_failure(rank, world_size):
    """Rank 1 receives, in one coalesced group, from a rank that never sends: the group's Work
    fails at the group's timeout with TIMEOUT; the group stays usable for later ops."""
    out = {}
    waiting_room = dist.new_group(backend="gloo", timeout=timedelta(seconds=60))  # outlasts the failure
    if rank == 1:
        got = torch.zeros(3)
        ops = [dist.P2POp(dist.irecv, got, 0)]
        works = dist.batch_isend_irecv(ops)
        outcome = _outcome(works[0].wait)
        out["failed"] = outcome[:3]
        out["result"] = int(works[0].get_future_result().wait())
    dist.barrier(group=waiting_room)
    total = torch.full((2,), float(rank + 1))
    dist.all_reduce(total)
    out["sum"] = total.tolist()
    return out


def _made_split(rank, group):
    """What a rank sees of one new group: None/NON_GROUP_MEMBER as torch returns it to a rank left
    out, else its numbering and three collectives on it."""
    if group is None or group is dist.GroupMember.NON_GROUP_MEMBER:
        return repr(group)
    total = torch.tensor([float(rank + 1)])
    dist.all_reduce(total, group=group)
    value = torch.tensor([rank * 10])
    dist.broadcast(value, src=dist.get_global_rank(group, 0), group=group)
    gathered = [torch.zeros(1, dtype=torch.long) for _ in range(group.size())]
    dist.all_gather(gathered, torch.tensor([rank]), group=group)
    return {"rank": group.rank(), "size": group.size(), "ranks": dist.get_process_group_ranks(group),
            "sum": total.item(), "broadcast": value.item(), "gathered": [t.item() for t in gathered]}


def _one_group_for_cpu_and_cuda(group):
    """torch calls split once per device type with one store; the second call must get the group
    the first made (one connection, one ncclCommSplit), not a second one."""
    return group._get_backend(torch.device("cpu")) is group._get_backend(torch.device("cuda"))


def _split_each(rank, splits_list, groups=None):
    """dist.split_group of each split in turn; stops at the first one torch (or the backend)
    refuses, with the error's type and message. The groups made go to `groups`."""
    made = []
    for splits in splits_list:
        try:
            group = dist.split_group(split_ranks=splits, timeout=timedelta(seconds=60))
        except Exception as error:  # noqa: BLE001 - the type and message are what the test compares
            made.append(("raised", type(error).__name__, str(error)))
            break
        made.append(_made_split(rank, group))
        if groups is not None and isinstance(made[-1], dict):
            groups.append(group)
    return made


def split_group(rank, world_size, backend, splits_list):
    """dist.split_group as the running torch does it, the same program on gloo and on ddplite:
    first with the default group unbound, then bound to cpu:0 (as device_id binds it to a GPU on
    a GPU machine), each split of `splits_list` in turn, its members running collectives on it.
    torch's own behaviour moves between releases (unbound refused up to 2.14; an accelerator
    required on 2.12-2.14; ranks sorted up to 2.13 and kept in the caller's order from 2.14; None
    or NON_GROUP_MEMBER for a rank left out), and ddplite must follow gloo on each."""
    import copy

    world = dist.group.WORLD
    out = {"unbound": _split_each(rank, splits_list[:1])}
    if backend == "ddplite":
        options = world._get_backend(torch.device("cpu")).options
        out["options_copy"] = type(copy.deepcopy(options)).__name__
    world.bound_device_id = torch.device("cpu", 0)
    groups = []
    out["bound"] = _split_each(rank, splits_list, groups)
    if backend == "ddplite":
        out["one_group_for_cpu_and_cuda"] = [_one_group_for_cpu_and_cuda(g) for g in groups]
        if world_size == 2 and not isinstance(out["bound"][0], tuple):
            # Rank 1's list [1, 2] names a rank the group lacks: rank 1 refuses, rank 0 makes [0].
            # The refused split still takes its number on rank 1, so a later split pairs up.
            out["refused"] = _outcome(lambda: dist.split_group(split_ranks=[[0], [1, 2]]))
            out["after_refused"] = _split_each(rank, splits_list[:1])
        # On a GPU machine with a bound default group, new_group calls perform_nocolor_split on the
        # parent's backend on each rank left out (torch refuses a bound cpu device in new_group, so
        # that path cannot run here): it must exist and leave the group usable.
        world._get_backend(torch.device("cpu")).perform_nocolor_split(torch.device("cpu", 0))
    after = torch.tensor([1.0])
    dist.all_reduce(after)  # the default group still works
    out["after"] = after.item()
    return out


SPARSE_CASES = [  # (sizes, sparse dims, dtype)
    ((7,), 1, torch.float32),
    ((5, 6), 2, torch.float64),
    ((4, 3, 2), 1, torch.float32),  # hybrid: one sparse dim, two dense
    ((9, 2), 2, torch.int64),
    ((3,), 1, torch.float32),       # rank-dependent: some ranks have no entries
]


def _sparse_input(rank, sizes, sparse_dims, dtype, case):
    """Entries that overlap across ranks (so sums happen), a count that differs per rank, values
    distinct per rank and exact in every dtype; uncoalesced (a duplicate index)."""
    generator = torch.Generator().manual_seed(1000 * case + rank)
    count = 0 if (case == 4 and rank % 2 == 1) else 2 + (rank * 3 + case) % 5
    index_rows = [torch.randint(0, sizes[d], (count,), generator=generator) for d in range(sparse_dims)]
    indices = torch.stack(index_rows) if count else torch.zeros((sparse_dims, 0), dtype=torch.long)
    if count:
        indices = torch.cat([indices, indices[:, :1]], dim=1)  # a duplicate, summed on coalescing
    values = torch.randint(-8, 9, (indices.shape[1], *sizes[sparse_dims:]), generator=generator).to(dtype)
    return torch.sparse_coo_tensor(indices, values, sizes)


def sparse_all_reduce(rank, world_size, backend):
    """Sparse SUM all_reduce of each case; each result as (indices, values, dense), plus the
    closed form (the dense sum of every rank's input), plus what a refused call raises."""
    group = dist.new_group(backend="gloo") if backend == "gloo" else None
    out = {"results": [], "expected": [], "paths": paths() if backend == "ddplite" else None}
    for case, (sizes, sparse_dims, dtype) in enumerate(SPARSE_CASES):
        tensor = _sparse_input(rank, sizes, sparse_dims, dtype, case)
        dist.all_reduce(tensor, group=group)
        tensor = tensor.coalesce()
        out["results"].append((tensor.indices().tolist(), tensor.values().tolist(), tensor.to_dense().tolist()))
        expected = sum(_sparse_input(r, sizes, sparse_dims, dtype, case).to_dense() for r in range(world_size))
        out["expected"].append(expected.tolist())
    max_op = _sparse_input(rank, (7,), 1, torch.float32, 0)
    out["max"] = _outcome(lambda: dist.all_reduce(max_op, op=dist.ReduceOp.MAX, group=group))
    if world_size > 1:
        differing = _sparse_input(rank, (7 + rank,), 1, torch.float32, 0)
        out["sizes_differ"] = _outcome(lambda: dist.all_reduce(differing, group=group))
    check = torch.ones(2)
    dist.all_reduce(check, group=group)
    out["after"] = check.tolist()
    return out


def barrier_with_device_ids(rank, world_size):
    """dist.barrier(device_ids=...) on a CPU group, as Accelerate's wait_for_everyone() calls it
    (device_ids=[local rank]) and with device 0: the last rank arrives 0.5 s late each time, so
    every other rank's barrier must last about that long. Per call: _outcome."""
    outcomes = []
    for ids in ([rank], [0]):
        if rank == world_size - 1:
            time.sleep(0.5)
        outcomes.append(_outcome(lambda: dist.barrier(device_ids=ids)))
    return outcomes
