"""Per-rank programs for test_flight_recorder.py: each runs ops, then returns what the flight
recorder holds (or where it dumped)."""

import os
import time

import torch
import torch.distributed as dist

import torch_ddp_lite


def _outcome(call):
    try:
        call()
        return "ok"
    except Exception as error:  # noqa: BLE001 - the test inspects it
        return f"{type(error).__name__}: {error}"


def every_op(rank, world_size):
    """One of each kind of op, then this rank's trace."""
    dist.all_reduce(torch.arange(5, dtype=torch.float32))
    dist.broadcast(torch.zeros(3, dtype=torch.int64), src=0)
    dist.all_gather([torch.zeros(2) for _ in range(world_size)], torch.ones(2))
    dist.all_gather_into_tensor(torch.zeros(2 * world_size, dtype=torch.float64), torch.ones(2, dtype=torch.float64))
    dist.reduce_scatter(torch.zeros(2), [torch.ones(2) for _ in range(world_size)])
    dist.barrier()
    if world_size > 1:
        if rank == 0:
            dist.send(torch.ones(4, dtype=torch.int32), dst=world_size - 1)
        elif rank == world_size - 1:
            dist.recv(torch.zeros(4, dtype=torch.int32), src=0)
    # A subgroup of the first and last rank: its own name, global ranks and sequence numbers.
    pair = dist.new_group(sorted({0, world_size - 1}))
    if rank in (0, world_size - 1):
        dist.all_reduce(torch.ones(6, dtype=torch.bfloat16), group=pair)
    dist.barrier()
    return torch_ddp_lite.flight_recorder_trace()


def recorded_once(rank, world_size, detach_torch_hook_skip):
    """Three all_reduces on the default group and one on a new group, then: the entries ddplite's
    recorder holds, the entries torch's own recorder holds for backend "ddplite" (torch 2.15
    attaches its FlightRecorderHook to groups whose backends do not record themselves), and how
    many such hooks are attached. `detach_torch_hook_skip` takes ddplite out of torch's set of
    self-recording backends before the groups are made (what this package did not do before)."""
    from torch.distributed import distributed_c10d as c10d

    if detach_torch_hook_skip:
        getattr(c10d, "_FR_SELF_RECORDING_BACKENDS", set()).discard("ddplite")
    group = dist.new_group(list(range(world_size)))
    for _ in range(3):
        dist.all_reduce(torch.ones(2))
    dist.all_reduce(torch.ones(2), group=group)
    ours = [e for e in torch_ddp_lite.flight_recorder_trace()["entries"] if e["profiling_name"] == "nccl:all_reduce"]
    torch_entries = None
    if hasattr(torch._C._distributed_c10d, "_dump_fr_trace"):
        import pickle

        dumped = pickle.loads(torch._C._distributed_c10d._dump_fr_trace(backend="ddplite"))
        torch_entries = len(dumped.get("entries", []))
    hooks = len(c10d._world.pg_flight_recorder_hooks) if hasattr(c10d._world, "pg_flight_recorder_hooks") else None
    return {"ours": len(ours), "torch": torch_entries, "hooks": hooks}


def many_allreduces(rank, world_size, count):
    for _ in range(count):
        dist.all_reduce(torch.ones(1))
    return torch_ddp_lite.flight_recorder_trace(), torch_ddp_lite.dump_flight_recorder()


def with_stacks(rank, world_size):
    dist.all_reduce(torch.ones(1))
    return torch_ddp_lite.flight_recorder_trace()


def explicit_dump(rank, world_size, folder):
    dist.all_reduce(torch.ones(3))
    path = torch_ddp_lite.dump_flight_recorder()
    assert path == os.path.join(folder, f"ddplite_trace_rank_{rank}"), path
    return path


def _wait_for_file(path, limit_s):
    deadline = time.monotonic() + limit_s
    while not os.path.exists(path) and time.monotonic() < deadline:
        time.sleep(0.05)


def rank_stops_arriving(rank, world_size, folder, missing):
    """Two all_reduces everywhere; then every rank but `missing` enters a third, which times out
    and dumps. `missing` (stuck in user code, as in a real hang) dumps on request once rank 0 has."""
    for _ in range(2):
        dist.all_reduce(torch.ones(8))
    if rank == missing:
        _wait_for_file(os.path.join(folder, "ddplite_trace_rank_0"), 60)
        return torch_ddp_lite.dump_flight_recorder()
    return _outcome(lambda: dist.all_reduce(torch.ones(8)))


def ranks_disagree(rank, world_size, kind):
    """Two matching all_reduces; then rank 0 and the others disagree in the third collective, by
    `kind`: "op" (all_reduce against broadcast), "size" (1000 against 7 elements), "dtype"
    (float32 against float64). The wire fingerprint fails the third collective on the rank that
    sees the stray message (a broadcast root may finish its part first); every rank fails by the
    fourth, and dumps at its first failure."""
    for _ in range(2):
        dist.all_reduce(torch.ones(8))
    if kind == "op":
        call = (lambda: dist.all_reduce(torch.ones(1000))) if rank == 0 else (lambda: dist.broadcast(torch.ones(1000), src=1))
    elif kind == "size":
        call = lambda: dist.all_reduce(torch.ones(1000 if rank == 0 else 7))  # noqa: E731
    else:
        call = lambda: dist.all_reduce(torch.ones(16, dtype=torch.float32 if rank == 0 else torch.float64))  # noqa: E731
    third = _outcome(call)
    return third if third != "ok" else _outcome(lambda: dist.all_reduce(torch.ones(8)))


def dump_on_signal(rank, world_size, folder):
    """DDPLITE_TRACE_SIGNAL=1: SIGUSR1 makes ddplite's own thread write the dump."""
    import pickle
    import signal

    dist.all_reduce(torch.ones(2))
    path = os.path.join(folder, f"ddplite_trace_rank_{rank}")
    os.kill(os.getpid(), signal.SIGUSR1)
    _wait_for_file(path, 30)
    with open(path, "rb") as dump:
        return [entry["profiling_name"] for entry in pickle.load(dump)["entries"]]
