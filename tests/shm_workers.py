"""Rank functions for tests/test_shm.py (the shared-memory path, DDPLITE_CPU_TRANSPORT=shm)."""

import os
import time

import torch
import torch.distributed as dist


def segments():
    """ddplite's segments in /dev/shm now (names start with ddplite-)."""
    return sorted(name for name in os.listdir("/dev/shm") if name.startswith("ddplite-"))


def transport_name(rank, world_size):
    backend = dist.group.WORLD._get_backend(torch.device("cpu"))
    from torch_ddp_lite import _load_extension

    return {"transport": _load_extension().group_transport(backend)[0], "segments": segments()}


def mismatched_sizes(rank, world_size, kind):
    """Rank 0 runs a different collective (or size) than the others: every rank must raise, none
    may return numbers made of another collective's bytes."""
    outcome = {}
    try:
        if kind == "sizes":
            tensor = torch.ones(8 if rank == 0 else 16)
            dist.all_reduce(tensor)
        elif kind == "ops":
            tensor = torch.ones(8)
            if rank == 0:
                dist.broadcast(tensor, src=0)
            else:
                dist.all_reduce(tensor)
        elif kind == "roots":  # every rank believes it is the root
            tensor = torch.full((8,), float(rank))
            dist.broadcast(tensor, src=rank)
        else:  # dtypes
            tensor = torch.ones(8, dtype=torch.float32 if rank == 0 else torch.int32)
            dist.all_reduce(tensor)
        outcome["value"] = tensor.tolist()
    except Exception as error:  # noqa: BLE001
        outcome["raised"] = type(error).__name__
        outcome["message"] = str(error)
    try:  # whatever happened, the group is broken now: the next collective fails on every rank
        dist.all_reduce(torch.ones(4))
        outcome["next"] = "returned"
    except Exception as error:  # noqa: BLE001
        outcome["next"] = str(error)
    return outcome


def killed_mid_allreduce(rank, world_size, victim, elements):
    """Large allreduces in a loop; the victim kill -9s itself while the others are mid-op."""
    tensor = torch.ones(elements)
    for step in range(50):
        if rank == victim and step == 3:
            time.sleep(0.2)  # the others are now waiting inside step 3's allreduce
            os.kill(os.getpid(), 9)
        start = time.monotonic()
        try:
            dist.all_reduce(tensor)
        except Exception as error:  # noqa: BLE001
            return {"type": type(error).__name__, "message": str(error), "seconds": time.monotonic() - start,
                    "segments": segments()}
    return {"type": None}


def init_with_small_file_limit(rank, world_size, store_path):
    """Rank 0 may not grow files beyond 64 KiB (RLIMIT_FSIZE; SIGXFSZ ignored), which makes its
    posix_fallocate of the segment fail as a full /dev/shm would. Returns init's error, if any."""
    import resource
    import signal
    from datetime import timedelta

    if rank == 0:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (64 << 10, 64 << 10))
    try:
        dist.init_process_group("ddplite", init_method=f"file://{store_path}", rank=rank, world_size=world_size,
                                timeout=timedelta(seconds=30))
    except Exception as error:  # noqa: BLE001
        return {"raised": type(error).__name__, "message": str(error), "segments": segments()}
    import torch_ddp_lite

    tensor = torch.full((1000,), float(rank + 1))
    dist.all_reduce(tensor)
    return {"raised": None, "path": torch_ddp_lite.cpu_path(), "sum": tensor.unique().tolist()}


def init_with_own_settings(rank, world_size, store_path, settings):
    """Each rank sets its own DDPLITE_* variables (settings[rank]) before init_process_group."""
    from datetime import timedelta

    os.environ.update(settings.get(rank, {}))
    try:
        dist.init_process_group("ddplite", init_method=f"file://{store_path}", rank=rank, world_size=world_size,
                                timeout=timedelta(seconds=30))
    except Exception as error:  # noqa: BLE001
        return {"raised": type(error).__name__, "message": str(error)}
    import torch_ddp_lite

    return {"raised": None, "path": torch_ddp_lite.cpu_path()}


def cpu_paths(rank, world_size):
    """cpu_path() of the default group and of a subgroup of ranks 0 and 1, after one op on each."""
    import torch_ddp_lite

    pair = dist.new_group([0, 1]) if world_size > 1 else None
    tensor = torch.ones(3)
    dist.all_reduce(tensor)
    paths = {"world": torch_ddp_lite.cpu_path(), "sum": tensor.tolist()}
    if pair is not None and rank in (0, 1):
        dist.all_reduce(tensor, group=pair)
        paths["pair"] = torch_ddp_lite.cpu_path(pair)
        paths["pair_sum"] = tensor.tolist()
    gloo = dist.new_group(backend="gloo")
    # gloo's connectFullMesh returns on one rank before its peer's side is done; a rank that then
    # exits at once can close the pair under its peer ("Connection closed by peer"). Meet first.
    dist.barrier(group=gloo)
    try:
        torch_ddp_lite.cpu_path(gloo)
    except ValueError as error:
        paths["gloo"] = str(error)
    return paths


def half_sums_rounded_once(rank, world_size, counts):
    """fp16/bf16 with random mantissas (sums inexact in the dtype) through all_reduce, reduce and
    reduce_scatter_tensor on shared memory: every result must equal, bit for bit, the float32 sum
    over ranks rounded once to the dtype (torch's own stacked sum), at any world size and on both
    allreduce variants (reduce-all, reduce-scatter + allgather) and across chunks."""
    failures = []
    checked = 0
    for dtype in (torch.float16, torch.bfloat16):
        for count in counts:
            count -= count % world_size  # reduce_scatter_tensor needs whole blocks
            everyone = [torch.randn(count, generator=torch.Generator().manual_seed(700 + r)).mul(3).to(dtype)
                        for r in range(world_size)]
            expected = torch.stack(everyone).sum(0)  # accumulates in float32, rounds once
            assert torch.equal(expected, torch.stack([t.float() for t in everyone]).sum(0).to(dtype))
            reduced = everyone[rank].clone()
            dist.all_reduce(reduced)
            rooted = everyone[rank].clone()
            dist.reduce(rooted, dst=world_size - 1)
            shard = torch.empty(count // world_size, dtype=dtype)
            dist.reduce_scatter_tensor(shard, everyone[rank].clone())
            piece = expected[rank * shard.numel():(rank + 1) * shard.numel()]
            results = {"all_reduce": (reduced, expected), "reduce_scatter_tensor": (shard, piece)}
            if rank == world_size - 1:
                results["reduce"] = (rooted, expected)
            for name, (actual, wanted) in results.items():
                checked += 1
                if not torch.equal(actual, wanted):
                    wrong = (actual != wanted).nonzero().flatten()[:4].tolist()
                    failures.append(f"{name} {dtype} n={count}: not the once-rounded sum at {wrong}: "
                                    f"{actual[wrong].tolist()} vs {wanted[wrong].tolist()}")
    return {"failures": failures, "checked": checked}


def p2p_through_channels(rank, world_size, sizes):
    """send/recv between every pair, in both directions at once (isend + irecv), of messages from
    0 bytes to several times a channel's ring, then any-source receives; returns what carried
    them and the mismatches."""
    import torch_ddp_lite

    backend = dist.group.WORLD._get_backend(torch.device("cpu"))
    failures = []

    def message(sender, receiver, count, k):
        return (torch.arange(count, dtype=torch.float32) * (sender + 1) + 1000 * receiver + k)

    for k, count in enumerate(sizes):
        works, received = [], {}
        for peer in range(world_size):
            if peer == rank:
                continue
            received[peer] = torch.empty(count)
            works.append(dist.irecv(received[peer], src=peer, tag=k))
            works.append(dist.isend(message(rank, peer, count, k), dst=peer, tag=k))
        for work in works:
            work.wait()
        for peer, tensor in received.items():
            if not torch.equal(tensor, message(peer, rank, count, k)):
                failures.append(f"{count} floats from rank {peer}: {tensor[:3].tolist()}")
    if rank == 0:
        for _ in range(world_size - 1):
            tensor = torch.empty(5)
            source = dist.recv(tensor, tag=99)
            if not torch.equal(tensor, message(source, 0, 5, 99)):
                failures.append(f"any-source message from rank {source}: {tensor.tolist()}")
    else:
        dist.send(message(rank, 0, 5, 99), dst=0, tag=99)
    return {"path": torch_ddp_lite._load_extension().group_p2p_path(backend), "failures": failures}


def killed_while_peer_sends(rank, world_size):
    """Rank 1 kill -9s itself; rank 0 then sends it 8 MB, 32 of its 256 KiB rings (group timeout
    60 s): the send must fail when the pump sees the process gone, not at the timeout."""
    tensor = torch.ones(10)
    if rank == 1:
        dist.recv(tensor, src=0)
        os.kill(os.getpid(), 9)
    dist.send(tensor, dst=1)
    time.sleep(0.6)  # rank 1 is dead by now; nothing told this rank
    start = time.monotonic()
    try:
        dist.send(torch.ones(2 * 2 ** 20), dst=1)
        return {"type": None}
    except Exception as error:  # noqa: BLE001
        return {"type": type(error).__name__, "message": str(error), "seconds": time.monotonic() - start}


def killed_while_peer_receives(rank, world_size):
    """Rank 1 kill -9s itself while rank 0 waits in a recv from it (group timeout 60 s)."""
    tensor = torch.ones(1000)
    if rank == 1:
        dist.send(tensor, dst=0)  # the first message arrives; then nothing more
        time.sleep(0.3)
        os.kill(os.getpid(), 9)
    dist.recv(tensor, src=1)
    start = time.monotonic()
    try:
        dist.recv(tensor, src=1)
        return {"type": None}
    except Exception as error:  # noqa: BLE001
        return {"type": type(error).__name__, "message": str(error), "seconds": time.monotonic() - start}


def one_rank_differs(rank, world_size, odd_rank, kind):
    """`odd_rank` runs another all_reduce than the others (more elements, or another dtype): every
    rank must raise, naming a peer whose collective differs from its own."""
    outcome = {}
    count, dtype = 8, torch.float32
    if rank == odd_rank:
        count, dtype = (16, dtype) if kind == "sizes" else (count, torch.int32)
    tensor = torch.ones(count, dtype=dtype)
    try:
        dist.all_reduce(tensor)
        outcome["value"] = tensor.tolist()
    except Exception as error:  # noqa: BLE001
        outcome["raised"] = type(error).__name__
        outcome["message"] = str(error)
    return outcome


def sync_description(rank, world_size):
    """cpu_path()'s reason for the default group, after a checked all_reduce."""
    import torch_ddp_lite

    tensor = torch.full((5,), float(rank + 1))
    dist.all_reduce(tensor)
    return {"path": torch_ddp_lite.cpu_path(), "sum": tensor.tolist()}


def tolerated_then_real_mismatch(rank, world_size, odd_rank):
    """First rank 0 runs all_gather into a list, the others all_gather_into_tensor (one collective
    in two spellings: accepted); then `odd_rank` runs an all_reduce of another dtype than the others
    (one_rank_differs). The first must return the right values everywhere, the second raise on every
    rank: a tolerated difference must not leave a record that hides the real one."""
    mine = torch.full((3,), float(rank))
    if rank == 0:
        pieces = [torch.empty(3) for _ in range(world_size)]
        dist.all_gather(pieces, mine)
        gathered = torch.cat(pieces)
    else:
        gathered = torch.empty(3 * world_size)
        dist.all_gather_into_tensor(gathered, mine)
    return {"gathered": gathered.tolist(), **one_rank_differs(rank, world_size, odd_rank, "dtypes")}


def dies_between_flag_and_arrival(rank, world_size, victim):
    """DDPLITE_TEST_HOOKS=shm_exit_unarrived=<victim>:3: the victim SIGKILLs itself in all_reduce #3
    after storing its posted flag, before its arrival at the tree. Every flag is then stored and the
    step can never complete: the others must name it within seconds."""
    start = time.monotonic()
    try:
        for _ in range(5):
            start = time.monotonic()
            dist.all_reduce(torch.ones(4))
        return {"type": None}
    except Exception as error:  # noqa: BLE001
        return {"type": type(error).__name__, "message": str(error), "seconds": time.monotonic() - start}


def combined_bits_equal_flat(rank, world_size, counts):
    """A small all_reduce combined on arrival (the default group, with the arrival tree) against
    the flat reduce of a second group (DDPLITE_SHM_SYNC=flat, read when a group is created) and
    against the rank-order sum computed here: inputs spread over 16 decades, so any other order
    of the additions changes the bits. `counts` are float32 elements; float64 runs half as many
    (the same bytes: all of them small, up to 16 KiB). Returns the mismatches (empty: every value
    bit-identical)."""
    import torch_ddp_lite

    os.environ["DDPLITE_SHM_SYNC"] = "flat"
    flat = dist.new_group(backend="ddplite")
    problems = []
    for path, group in (("tree", None), ("flat", flat)):
        described = torch_ddp_lite.cpu_path(group)[1]
        wanted = "arrival tree" if path == "tree" else "flat waits"
        if wanted not in described:
            problems.append(f"{path} group: {described}")
    for dtype in (torch.float32, torch.float64):
        for count in sorted({max(1, c * 4 // dtype.itemsize) for c in counts}):
            inputs = []
            for owner in range(world_size):
                generator = torch.Generator().manual_seed(1000 * owner + count)
                scale = torch.pow(10.0, torch.randint(-8, 8, (count,), generator=generator).double())
                inputs.append((torch.randn(count, generator=generator, dtype=torch.float64) * scale).to(dtype))
            expected = inputs[0].clone()
            for owner in range(1, world_size):
                expected = expected + inputs[owner]  # one IEEE addition per element, in rank order
            for path, group in (("tree", None), ("flat", flat)):
                tensor = inputs[rank].clone()
                dist.all_reduce(tensor, group=group)
                if not torch.equal(tensor, expected):
                    wrong = (tensor != expected).nonzero().flatten()[:3].tolist()
                    problems.append(f"{path} {dtype} count {count}: elements {wrong} differ from the rank-order sum")
    dist.destroy_process_group(flat)
    return problems


def inline_once_every_peer_started(rank, world_size, late_rank, tries):
    """Rank 0 calls a small async all_reduce after the others. When every peer has started it, rank 0
    runs it on its own thread: the work is complete when all_reduce returns. When `late_rank` has
    not called yet, it must not (the caller would wait for that rank: an async op stays async).
    Each case `tries` times (a peer's op starts on its caller's thread only when its worker is idle
    at the call, else a moment later on the worker: the sleep after the barrier makes that likely,
    not certain). Returns, per case, whether rank 0's work was complete at return, per try, and
    whether every sum was right."""
    store = dist.distributed_c10d._get_default_store()
    total = float(sum(range(1, world_size + 1)))
    outcome = {"all started": [], "one late": [], "sums right": True}
    for attempt in range(tries):
        for case, late in (("all started", None), ("one late", late_rank)):
            key = f"{case}/{attempt}"
            dist.barrier()
            time.sleep(0.2)  # every worker goes idle after the barrier, so ops start on the caller's thread
            tensor = torch.full((3,), float(rank + 1))
            if rank == 0:
                store.wait([f"called/{key}/{peer}" for peer in range(1, world_size) if peer != late])
                work = dist.all_reduce(tensor, async_op=True)
                outcome[case].append(work.is_completed())
                store.set(f"go/{key}", "1")
            else:
                if rank == late:
                    store.wait([f"go/{key}"])
                work = dist.all_reduce(tensor, async_op=True)
                store.set(f"called/{key}/{rank}", "1")
            work.wait()
            outcome["sums right"] &= tensor.tolist() == [total] * 3
    return outcome


def peer_leaves_after_its_arrival(rank, world_size):
    """DDPLITE_TEST_HOOKS=shm_delay_arrival=1:2:1000: in reduce #2 (root 0) rank 1 stores its posted
    flag, then sleeps a second before its arrival at the tree. The last rank, a non-root, finishes
    its part meanwhile and leaves (the harness destroys its group, and its process exits), while
    every flag of the step is stored and the root waits for the tree. That rank arrived: the root
    must get its sum, not raise that it "never reached the group". Returns the root's sum."""
    dist.all_reduce(torch.ones(4))
    tensor = torch.full((5,), float(rank + 1))
    start = time.monotonic()
    dist.reduce(tensor, dst=0)
    return {"sum": tensor.tolist() if rank == 0 else None, "seconds": time.monotonic() - start}


def abort_while_peers_wait_in_the_tree(rank, world_size):
    """Rank 0 aborts half a second after the others entered an all_reduce: how long each waited
    after the abort, and what it raised."""
    backend = dist.group.WORLD._get_backend(torch.device("cpu"))
    dist.all_reduce(torch.ones(4))  # the group works before the abort
    if rank == 0:
        time.sleep(0.5)
        aborted_at = time.time()
        backend.abort()
        time.sleep(3.0)  # alive, sockets open: only the abort can tell the others
        return {"aborted_at": aborted_at}
    try:
        dist.all_reduce(torch.ones(4))
        return {"raised": None}
    except Exception as error:  # noqa: BLE001
        return {"raised": type(error).__name__, "message": str(error), "at": time.time()}
