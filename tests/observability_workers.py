"""Rank functions for tests/test_observability.py: what a user sees of ddplite's ops from the
outside (torch.profiler spans, Work._get_duration, flight-recorder times, thread names) and how
pg_options reach it."""

import json
import os
import tempfile
import time
from datetime import timedelta

import torch
import torch.distributed as dist


def _outcome(call):
    try:
        return ("ok", call())
    except Exception as error:  # noqa: BLE001 - the type and text are the result
        return (type(error).__name__, str(error))


def _issue_every_op(rank, world_size):
    """One of each op, values checked against closed forms; returns the wrong ones."""
    wrong = []
    total = torch.full((6,), float(rank + 1))
    dist.all_reduce(total)
    if total.tolist() != [world_size * (world_size + 1) / 2] * 6:
        wrong.append(("all_reduce", total.tolist()))
    root = torch.arange(4.0) if rank == 0 else torch.zeros(4)
    dist.broadcast(root, src=0)
    if root.tolist() != [0.0, 1.0, 2.0, 3.0]:
        wrong.append(("broadcast", root.tolist()))
    gathered = torch.empty(3 * world_size)
    dist.all_gather_into_tensor(gathered, torch.full((3,), float(rank)))
    if gathered.tolist() != [float(r) for r in range(world_size) for _ in range(3)]:
        wrong.append(("all_gather_into_tensor", gathered.tolist()))
    piece = torch.empty(2)
    dist.reduce_scatter_tensor(piece, torch.ones(2 * world_size))
    if piece.tolist() != [float(world_size)] * 2:
        wrong.append(("reduce_scatter_tensor", piece.tolist()))
    dist.barrier()
    if world_size > 1:
        right, left = (rank + 1) % world_size, (rank - 1) % world_size
        inbox = torch.zeros(5)
        ops = [dist.P2POp(dist.isend, torch.full((5,), float(rank)), right),
               dist.P2POp(dist.irecv, inbox, left)]
        for work in dist.batch_isend_irecv(ops):
            work.wait()
        if inbox.tolist() != [float(left)] * 5:
            wrong.append(("send/recv", inbox.tolist()))
    return wrong


def profiled_ops(rank, world_size):
    """Every op under torch.profiler (record_shapes), then one async all_reduce that rank 1 joins
    0.3 s late, so its span can only be that long if it covers the op's asynchronous part. Returns
    the spans' names and counts, all_reduce's recorded input shapes, and the Chrome trace's
    durations (us) of the backend's spans."""
    from torch.profiler import ProfilerActivity, profile

    prefix = dist.get_backend() + ":"
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        wrong = _issue_every_op(rank, world_size)
        dist.barrier()
        if rank == 1:
            time.sleep(0.3)
        late = torch.ones(7)
        issued = time.monotonic()
        work = dist.all_reduce(late, async_op=True)
        returned_after = time.monotonic() - issued
        work.wait()
    counts = {}
    shapes = []
    for event in prof.key_averages(group_by_input_shape=True):
        if event.key.startswith(prefix):
            counts[event.key] = counts.get(event.key, 0) + event.count
            if event.key == prefix + "all_reduce":
                shapes.extend([list(map(list, event.input_shapes))] * event.count)
    path = os.path.join(tempfile.mkdtemp(), "trace.json")
    prof.export_chrome_trace(path)
    with open(path) as handle:
        events = json.load(handle)["traceEvents"]
    durations = {}
    for event in events:
        if event.get("name", "").startswith(prefix) and "dur" in event:
            durations.setdefault(event["name"], []).append(float(event["dur"]))
    return {"counts": counts, "shapes": shapes, "durations_us": durations, "wrong": wrong,
            "returned_after_s": returned_after, "late_sum": late.tolist()}


def spans_off_when_not_profiling(rank, world_size):
    """No profiler: the op runs, nothing to record (and no RecordFunction is made; profiling.cpp)."""
    total = torch.ones(3)
    dist.all_reduce(total)
    return total.tolist()


def timed_ops(rank, world_size):
    """Work._get_duration: refused before _enable_collectives_timing, served after; positive and
    within the wall time around each call; refused before completion; flight-recorder entries
    carry start times and, once timed, duration_ms."""
    import torch_ddp_lite

    out = {}
    untimed = dist.all_reduce(torch.ones(10), async_op=True)
    untimed.wait()
    out["untimed"] = _outcome(untimed._get_duration)
    dist.group.WORLD._enable_collectives_timing()
    out["timed"] = []
    for count in (1, 1000, 1_000_000):
        tensor = torch.full((count,), float(rank))
        start = time.perf_counter()
        work = dist.all_reduce(tensor, async_op=True)
        work.wait()
        wall_ms = (time.perf_counter() - start) * 1000.0
        right = bool((tensor == world_size * (world_size - 1) / 2).all())
        out["timed"].append((count, work._get_duration(), wall_ms, right))
    dist.barrier()
    if rank == 1:
        time.sleep(0.5)
    pending = dist.all_reduce(torch.ones(3), async_op=True)
    out["early"] = _outcome(pending._get_duration) if rank == 0 else None
    pending.wait()
    out["late"] = pending._get_duration()
    if world_size > 1:
        right, left = (rank + 1) % world_size, (rank - 1) % world_size
        start = time.perf_counter()
        works = dist.batch_isend_irecv([dist.P2POp(dist.isend, torch.ones(100), right),
                                        dist.P2POp(dist.irecv, torch.empty(100), left)])
        for work in works:
            work.wait()
        wall_ms = (time.perf_counter() - start) * 1000.0
        out["p2p"] = [(work._get_duration(), wall_ms) for work in works]
    entries = [e for e in torch_ddp_lite.flight_recorder_trace()["entries"] if e["process_group"][0] == "0"]
    out["trace"] = [(e["profiling_name"], e["state"], e["time_created_ns"], e["time_discovered_started_ns"],
                     e["time_discovered_completed_ns"], e.get("duration_ms")) for e in entries]
    return out


def threads_by_id():
    """{thread id: name} of this process's threads."""
    names = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/comm") as handle:
                names[int(tid)] = handle.read().strip()
        except FileNotFoundError:  # ended meanwhile
            pass
    return names


def thread_names(rank, world_size, store_path):
    """The threads init_process_group and a first collective and send/recv start: their names."""
    before = threads_by_id()
    dist.init_process_group("ddplite", init_method=f"file://{store_path}", rank=rank, world_size=world_size,
                            timeout=timedelta(seconds=60))
    wrong = _issue_every_op(rank, world_size)
    after = threads_by_id()
    new = sorted(name for tid, name in after.items() if tid not in before)
    dist.barrier()  # before any rank destroys the group: a peer's close ends our receiver for it
    dist.destroy_process_group()
    return {"new": new, "wrong": wrong}


def init_with_options(rank, world_size, store_path, case):
    """init_process_group with pg_options (case: see the test). Returns what happened."""
    import torch_ddp_lite

    def init(**kwargs):
        dist.init_process_group("ddplite", init_method=f"file://{store_path}", rank=rank, world_size=world_size,
                                **kwargs)

    if case == "gloo_options":
        return _outcome(lambda: init(pg_options=dist.ProcessGroupGloo._Options()))
    if case == "disagreeing_timeouts":
        return _outcome(lambda: init(timeout=timedelta(seconds=40),
                                     pg_options=torch_ddp_lite.Options(timeout=timedelta(seconds=50))))
    # "honoured": the options' 3 s timeout (init's own timeout left at torch's default) governs a
    # collective that rank 1 never joins in time; then new_group's options are honoured too, and
    # gloo's options are refused by new_group.
    init(pg_options=torch_ddp_lite.Options(timeout=timedelta(seconds=3)))
    out = {"options_timeout_s": dist.group.WORLD._get_backend(torch.device("cpu")).options._timeout.total_seconds()}
    pair = dist.new_group([0, 1], pg_options=torch_ddp_lite.Options(timeout=timedelta(seconds=9)))
    out["group_timeout_s"] = pair._get_backend(torch.device("cpu")).options._timeout.total_seconds()
    out["new_group_gloo"] = _outcome(lambda: dist.new_group([0, 1], pg_options=dist.ProcessGroupGloo._Options()))
    total = torch.ones(2)
    dist.all_reduce(total, group=pair)
    out["pair_sum"] = total.tolist()
    if rank == 1:
        time.sleep(8)  # past rank 0's 3 s
        return out
    start = time.monotonic()
    out["stalled"] = _outcome(lambda: dist.all_reduce(torch.ones(2)))
    out["stalled_after_s"] = time.monotonic() - start
    return out
