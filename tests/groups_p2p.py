"""Per-rank functions for point-to-point messages and subgroups (see harness.run_ranks)."""

import time

import torch
import torch.distributed as dist


def payload(sender, receiver, tag, count=5):
    return torch.arange(count, dtype=torch.float32) + 1000 * sender + 100 * receiver + tag


# ---- send / recv ---------------------------------------------------------------------------------

def tags_any_source_and_batches(rank, world_size):
    """Tags matched out of order, FIFO within a tag, any-source, strided receives and a
    batch_isend_irecv ring with large messages in both directions. Returns a list of failures."""
    failures = []

    def expect(label, actual, expected):
        if not torch.equal(actual, expected):
            failures.append(f"rank {rank} {label}: got {actual[:4].tolist()} expected {expected[:4].tolist()}")

    # 1. Rank 0 sends tags 1..4 in order; rank 1 receives them in reverse order.
    if rank == 0:
        for tag in range(1, 5):
            dist.send(payload(0, 1, tag), dst=1, tag=tag)
    elif rank == 1:
        for tag in reversed(range(1, 5)):
            received = torch.zeros(5)
            dist.recv(received, src=0, tag=tag)
            expect(f"tag {tag} out of order", received, payload(0, 1, tag))
    # 2. Same tag: messages arrive in the order they were sent.
    if rank == 0:
        works = [dist.isend(payload(0, 1, k), dst=1, tag=9) for k in range(3)]
        for work in works:
            work.wait()
    elif rank == 1:
        for k in range(3):
            received = torch.zeros(5)
            dist.recv(received, src=0, tag=9)
            expect(f"fifo #{k}", received, payload(0, 1, k))
    # 3. Any source: every rank sends to rank 0, which learns who sent each message.
    if rank == 0:
        sources = []
        for _ in range(world_size - 1):
            received = torch.zeros(5)
            source = dist.recv(received, tag=11)
            sources.append(source)
            expect(f"any-source from {source}", received, payload(source, 0, 11))
        if sorted(sources) != list(range(1, world_size)):
            failures.append(f"any-source sources {sources}")
    else:
        dist.send(payload(rank, 0, 11), dst=0, tag=11)
    # 4. A strided destination gets the message in place.
    if rank == 1:
        dist.send(payload(1, 0, 3, count=4), dst=0, tag=3)
    elif rank == 0:
        base = torch.zeros(8)
        dist.recv(base[::2], src=1, tag=3)
        expect("strided recv", base[::2], payload(1, 0, 3, count=4))
        expect("strided recv leaves gaps", base[1::2], torch.zeros(4))
    # 5. A ring in both directions with 4 MB messages, all posted before any wait.
    count = 2 ** 20
    nxt, prv = (rank + 1) % world_size, (rank - 1) % world_size
    from_prev, from_next = torch.zeros(count), torch.zeros(count)
    ops = [dist.P2POp(dist.isend, payload(rank, nxt, 1, count), nxt, tag=1),
           dist.P2POp(dist.isend, payload(rank, prv, 2, count), prv, tag=2),
           dist.P2POp(dist.irecv, from_prev, prv, tag=1),
           dist.P2POp(dist.irecv, from_next, nxt, tag=2)]
    for work in dist.batch_isend_irecv(ops):
        work.wait()
    expect("ring from prev", from_prev, payload(prv, rank, 1, count))
    expect("ring from next", from_next, payload(nxt, rank, 2, count))
    # 6. Point-to-point traffic does not wait behind, or disturb, collectives.
    if rank == 0:
        pending = dist.isend(payload(0, 1, 5), dst=1, tag=5)
    summed = torch.ones(3)
    dist.all_reduce(summed)
    expect("allreduce between p2p", summed, torch.full((3,), float(world_size)))
    if rank == 0:
        pending.wait()
    elif rank == 1:
        received = torch.zeros(5)
        dist.recv(received, src=0, tag=5)
        expect("p2p after allreduce", received, payload(0, 1, 5))
    return failures


def p2p_errors(rank, world_size):
    """Bad peers raise ValueError at once; a size mismatch and a missing sender raise
    DistBackendError naming the peer and tag; the group still works afterwards."""
    outcomes = {}

    def outcome(name, call):
        start = time.monotonic()
        try:
            call()
            outcomes[name] = {"raised": None}
        except Exception as error:  # noqa: BLE001
            outcomes[name] = {"raised": type(error).__name__, "message": str(error),
                              "is_dist_error": isinstance(error, dist.DistBackendError),
                              "elapsed": time.monotonic() - start}

    backend = dist.group.WORLD._get_backend(torch.device("cpu"))
    outcome("send to self", lambda: backend.send([torch.ones(2)], rank, 0))
    outcome("recv from out of range", lambda: backend.recv([torch.ones(2)], world_size + 2, 0).wait())
    if rank == 0:
        dist.send(torch.ones(6), dst=1, tag=4)
        time.sleep(5.0)  # while rank 1's recv with no sender runs into the group timeout
    elif rank == 1:
        outcome("size mismatch", lambda: dist.recv(torch.zeros(3), src=0, tag=4))
        outcome("no sender", lambda: dist.recv(torch.zeros(3), src=0, tag=77))
    summed = torch.ones(2)
    dist.all_reduce(summed)
    outcomes["after"] = summed.tolist()
    # In a batch too (on CUDA tensors NCCL serves it inside the batch's group; on the CPU gloo
    # refuses it too). Last: torch leaves a batch whose body raised open, and swallows the group's
    # later collectives into it (its _coalescing_manager has no finally), on any backend.
    outcome("batch with self", lambda: dist.batch_isend_irecv(
        [dist.P2POp(dist.isend, torch.ones(2), rank), dist.P2POp(dist.irecv, torch.zeros(2), rank)]))
    return outcomes


# ---- subgroups ----------------------------------------------------------------------------------

def overlapping_groups(rank, world_size, rounds=6):
    """Two overlapping ddplite groups ([0..P-2] and [1..P-1]) used alternately, synchronously and
    with async ops in flight on both; plus new_subgroups() pairs. Returns failures."""
    failures = []
    first = dist.new_group(list(range(world_size - 1)))
    second = dist.new_group(list(range(1, world_size)))
    pairs, _ = dist.new_subgroups(group_size=2) if world_size % 2 == 0 else (None, None)
    for group, name in ((first, "first"), (second, "second")):
        if group != dist.GroupMember.NON_GROUP_MEMBER and dist.get_backend(group) != "ddplite":
            failures.append(f"{name} group backend is {dist.get_backend(group)}")
    in_first, in_second = rank <= world_size - 2, rank >= 1
    for step in range(rounds):
        works = []
        a, b = torch.full((257,), float(rank + step)), torch.full((3,), float(rank * step))
        if in_first:
            works.append(("first", a, dist.all_reduce(a, group=first, async_op=True),
                          sum(r + step for r in range(world_size - 1))))
        if in_second:
            works.append(("second", b, dist.all_reduce(b, group=second, async_op=True),
                          sum(r * step for r in range(1, world_size))))
        for name, tensor, work, expected in works:
            work.wait()
            if not torch.equal(tensor, torch.full_like(tensor, float(expected))):
                failures.append(f"rank {rank} step {step} {name}: {tensor[0].item()} != {expected}")
        if in_second:
            value = torch.tensor([float(rank)])
            dist.broadcast(value, src=world_size - 1, group=second)  # global rank, translated by torch
            if value.item() != world_size - 1:
                failures.append(f"rank {rank} broadcast in second group gave {value.item()}")
    if pairs is not None:
        value = torch.tensor([float(rank)])
        dist.all_reduce(value, group=pairs)
        partner = rank ^ 1
        if value.item() != rank + partner:
            failures.append(f"rank {rank} new_subgroups pair sum {value.item()}")
    return failures


# ---- random programs (the property-based test) -------------------------------------------------

def program_input(rank, step, count, dtype, op=None):
    """A distinct pseudo-random input per rank and step, exact under `op` (workers.make_input)."""
    import workers
    return workers.make_input(rank + 16 * step, count, dtype, op if op is not None else dist.ReduceOp.SUM)


def program_op(dtype, op_name):
    """The drawn reduce op, or SUM where ddplite or gloo does not define it for the dtype."""
    import workers
    op = getattr(dist.ReduceOp, op_name)
    return op if workers.supported(dtype, op) and not workers.gloo_refuses(dtype, op) else dist.ReduceOp.SUM


def run_program(rank, world_size, program):
    """Runs `program` (a list of (op, count, dtype name, root, use_subgroup, reduce op name)) on
    ddplite and on gloo groups over the same ranks, and returns the ops whose results differ."""
    sub_ranks = list(range(1, world_size)) if world_size > 2 else list(range(world_size))
    ddplite_groups = {False: dist.group.WORLD, True: dist.new_group(sub_ranks)}
    gloo_groups = {False: dist.new_group(backend="gloo"), True: dist.new_group(sub_ranks, backend="gloo")}
    mismatches = []
    for step, (op, count, dtype_name, root_index, use_subgroup, reduce_name) in enumerate(program):
        ranks = sub_ranks if use_subgroup else list(range(world_size))
        if rank not in ranks:
            continue
        size = len(ranks)
        root = ranks[root_index % size]
        dtype = getattr(torch, dtype_name)
        reduce_op = program_op(dtype, reduce_name)
        results = []
        for group in (ddplite_groups[use_subgroup], gloo_groups[use_subgroup]):
            tensor = program_input(rank, step, count, dtype, reduce_op)
            if op == "all_reduce":
                dist.all_reduce(tensor, op=reduce_op, group=group)
                out = tensor
            elif op == "broadcast":
                dist.broadcast(tensor, src=root, group=group)
                out = tensor
            elif op == "reduce":
                dist.reduce(tensor, dst=root, op=reduce_op, group=group)
                out = tensor if rank == root else torch.zeros(0, dtype=dtype)
            elif op == "all_gather":
                out = torch.zeros(size * count, dtype=dtype)
                dist.all_gather_into_tensor(out, tensor, group=group)
            elif op == "reduce_scatter":
                out = torch.zeros(count, dtype=dtype)
                dist.reduce_scatter_tensor(out, program_input(rank, step, count * size, dtype, reduce_op), op=reduce_op,
                                           group=group)
            elif op == "all_to_all":
                out = torch.zeros(count * size, dtype=dtype)
                dist.all_to_all_single(out, program_input(rank, step, count * size, dtype), group=group)
            else:
                raise ValueError(op)
            results.append(out)
        if not torch.equal(results[0], results[1]):
            mismatches.append(f"rank {rank} step {step} {op} {reduce_name} n={count} {dtype_name} root={root} "
                              f"sub={use_subgroup}: {results[0][:6].tolist()} != {results[1][:6].tolist()}")
    return mismatches
