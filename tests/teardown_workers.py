"""Teardown soak: a job that does a little of everything, then tears down and exits.

One run starts ``world_size`` ranks, each of which: joins a ddplite group (shared memory or TCP,
by ``DDPLITE_CPU_TRANSPORT``), makes a gloo subgroup and a ddplite subgroup, runs coalesced
send/recv (torch's ring of ``batch_isend_irecv``), plain send/recv, collectives through the
default group (small and large, one of them pinned to a TCP algorithm), the same through the
subgroups, leaves an async all_reduce and a send/recv pair in flight, and tears down:
``destroy_process_group()``, or, in some runs, nothing at all (the process exits with the groups
alive, as a script that forgets to destroy them does). The parent measures, for every rank, the
time from the moment it finished its ops to the moment its process was gone, and looks at how
it ended: exit code 0 and no ``terminate called`` on stderr. Beside each fresh job a bare
interpreter (the same imports, no group) exits too: its time is the baseline a fresh rank's exit
is measured against.

Two ways to start ranks:
* ``forked``: forked from a forkserver that already imported torch (tests/harness.py), fast; a
  rank ends through multiprocessing's exit path (``os._exit`` after its finalizers).
* ``fresh``: a new interpreter per rank (``python -c``), slow to start; a rank ends through the
  interpreter's own shutdown (atexit, module teardown, C++ static destructors), as a user's
  script does.

Used by tests/test_teardown.py (a slice in CI) and scripts/teardown_soak.py (the full run, with
CPU stress and stack capture on a hang).
"""

import json
import os
import subprocess
import sys
import tempfile
import time
from datetime import timedelta

import torch
import torch.distributed as dist

HANG_AFTER_S = 10.0  # a rank still alive this long after it finished its ops counts as hung


def mixed_ops(rank, world_size, teardown):
    """The ops of one rank (see the module docstring). Returns a dict of checks (all True)."""
    import warnings

    import torch_ddp_lite

    warnings.filterwarnings("ignore", category=FutureWarning)
    checks = {}
    nxt, prev = (rank + 1) % world_size, (rank - 1) % world_size
    gloo = dist.new_group(backend="gloo")
    pair = dist.new_group(ranks=[0, world_size - 1]) if world_size > 1 else None
    # coalesced send/recv: torch's ring
    for count in (5, 70_000):
        send = torch.arange(count, dtype=torch.float32) + 1000 * rank
        recv = torch.zeros(count)
        works = dist.batch_isend_irecv([dist.P2POp(dist.isend, send, nxt), dist.P2POp(dist.irecv, recv, prev)])
        for work in works:
            work.wait()
        checks[f"ring {count}"] = torch.equal(recv, torch.arange(count, dtype=torch.float32) + 1000 * prev)
    # collectives, small and large, one through a TCP algorithm pinned on every rank
    small = torch.full((3,), float(rank + 1))
    dist.all_reduce(small)
    checks["all_reduce"] = small.tolist() == [world_size * (world_size + 1) / 2] * 3
    large = torch.full((300_001,), float(rank))
    dist.broadcast(large, src=world_size - 1)
    checks["broadcast"] = bool((large == world_size - 1).all())
    torch_ddp_lite.set_algorithm("allreduce", "ring")
    try:
        ring = torch.full((1001,), float(rank + 1))
        dist.all_reduce(ring)
        checks["pinned ring"] = bool((ring == world_size * (world_size + 1) / 2).all())
    finally:
        torch_ddp_lite.set_algorithm("allreduce", "auto")
    gathered = torch.empty(2 * world_size)
    dist.all_gather_into_tensor(gathered, torch.full((2,), float(rank)))
    checks["all_gather"] = gathered.tolist() == [float(r) for r in range(world_size) for _ in range(2)]
    # the gloo subgroup and the ddplite subgroup
    other = torch.full((4,), float(rank))
    dist.all_reduce(other, group=gloo)
    checks["gloo"] = other.tolist() == [float(world_size * (world_size - 1) // 2)] * 4
    if pair is not None and rank in (0, world_size - 1):
        both = torch.ones(5)
        dist.all_reduce(both, group=pair)
        checks["pair"] = both.tolist() == [2.0 if world_size > 1 else 1.0] * 5
    # left in flight at teardown: an async all_reduce and a send/recv pair nobody waits for
    pending = torch.ones(50_000)
    in_flight = [dist.all_reduce(pending, async_op=True)]
    if world_size > 1:
        in_flight.append(dist.isend(torch.full((1000,), float(rank)), nxt, tag=7))
        in_flight.append(dist.irecv(torch.empty(1000), prev, tag=7))
    checks["in flight"] = len(in_flight) >= 1
    return checks


def rank_main(rank, world_size, init_method, teardown, report):
    """One rank, start to end: init, ops, ``report(checks)``, teardown."""
    dist.init_process_group("ddplite", init_method=init_method, rank=rank, world_size=world_size,
                            timeout=timedelta(seconds=60))
    checks = mixed_ops(rank, world_size, teardown)
    report(checks)
    if teardown == "destroy":
        dist.destroy_process_group()
    # "none": exit with every group alive


_FRESH_RANK = """
import json, sys, time
sys.path.insert(0, sys.argv[1])
import torch_ddp_lite, teardown_workers
rank, world_size, init_method, teardown = int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], sys.argv[5]
def report(checks):
    print("CHECKS " + json.dumps({"checks": checks, "done": time.time()}), flush=True)
teardown_workers.rank_main(rank, world_size, init_method, teardown, report)
"""


# A bare interpreter beside each fresh job: it imports what a rank imports and exits at once, so
# that the rank's exit time can be told apart from the interpreter's own shutdown (about 1 s for
# torch on this 2-core machine, 2 s under CPU stress).
_BARE = """
import time
import torch, torch.distributed, torch_ddp_lite
print("CHECKS " + __import__("json").dumps({"checks": {}, "done": time.time()}), flush=True)
"""


def _forked_entry(rank, world_size, init_method, teardown, env, results):
    os.environ.update(env)
    try:
        rank_main(rank, world_size, init_method, teardown,
                  lambda checks: results.put((rank, "ok", {"checks": checks, "done": time.time()})))
    except BaseException:  # noqa: BLE001 - report everything to the parent
        import traceback

        results.put((rank, "error", traceback.format_exc()))
        raise


def capture_stacks(pid):
    """Native stacks of every thread of `pid` (gdb) and what each of its descriptors is, for a rank
    that hangs."""
    descriptors = []
    try:
        for fd in sorted(os.listdir(f"/proc/{pid}/fd"), key=int):
            try:
                descriptors.append(f"{fd} -> {os.readlink(f'/proc/{pid}/fd/{fd}')}")
            except OSError:
                pass
    except OSError as error:
        descriptors.append(f"(no descriptors: {error})")
    try:
        out = subprocess.run(["gdb", "-p", str(pid), "-batch", "-ex", "thread apply all bt"], capture_output=True,
                             text=True, timeout=60)
        stacks = out.stdout[-30000:]
    except (OSError, subprocess.TimeoutExpired) as error:
        stacks = f"(no stacks: {error})"
    return "descriptors:\n" + "\n".join(descriptors) + "\n\n" + stacks


def store_destructor_incomplete(store_path, world_size):
    """Whether a file:// store's file left behind shows a ~FileStore that never ran or was cut short,
    read from its entries (torch's FileStore appends each set as a key and a value, each a 4-byte
    length then its bytes; its destructor adds 1 to "cleanup/" and -1 to "refcount/"). False for a
    file gone, or for one whose counters all reached their end (every destructor ran to its end):
    that file is left by a race inside torch's ~FileStore, whose two updates are separate locked
    writes, so two ranks destroying at once can each miss the other's last update and neither
    removes the file (about 1 job in 30 to 200 when ranks destroy together, gloo alike;
    docs/reliability.md)."""
    try:
        with open(store_path, "rb") as handle:
            data = handle.read()
    except FileNotFoundError:
        return False
    last, at, items = {}, 0, []
    while at < len(data):
        if at + 4 > len(data):
            return True  # a torn length
        size = int.from_bytes(data[at:at + 4], "little")
        if at + 4 + size > len(data):
            return True  # a torn entry
        items.append(data[at + 4:at + 4 + size])
        at += 4 + size
    for key, value in zip(items[0::2], items[1::2]):
        last[key] = value
    if len(items) % 2:
        return True  # a key without its value
    cleanup, refcount = last.get(b"cleanup/"), last.get(b"refcount/")
    return cleanup is None or int(cleanup) < world_size or refcount is None or int(refcount) != 0


def run_once(world_size, transport, teardown, start="forked", capture=capture_stacks):
    """One job. Returns {"exits": [seconds from done to gone, per rank], "codes": [...],
    "aborts": [rank, ...], "errors": [text, ...], "hung": {rank: stacks}, "checks_failed": [...],
    "baseline": seconds a bare interpreter took to exit beside it (fresh; 0 when forked),
    "store_file_left": whether the file:// store's file is still there once every rank is gone,
    "store_destructor_incomplete": whether that file shows a ~FileStore that never ran to its end}.

    torch's FileStore removes its file when the last of the job's FileStores is destroyed, so
    after destroy_process_group on every rank the file is gone, unless some rank's ~FileStore
    never ran to its end (it ran on a thread that the process's exit cut short: a torn entry then
    makes the other ranks' FileStore reads spin for ever)."""
    env = {"DDPLITE_CPU_TRANSPORT": transport} if transport != "shm" else {}
    with tempfile.TemporaryDirectory(prefix="ddplite-teardown-") as folder:
        store_path = os.path.join(folder, "store")
        init_method = f"file://{store_path}"
        if start == "forked":
            outcome = _run_forked(world_size, init_method, teardown, env, capture)
        else:
            outcome = _run_fresh(world_size, init_method, teardown, env, capture)
        outcome["store_file_left"] = os.path.exists(store_path)
        outcome["store_destructor_incomplete"] = store_destructor_incomplete(store_path, world_size)
        return outcome


def _new_outcome(world_size):
    # baseline: a bare interpreter's exit beside a fresh job (0 for forked ranks, which end in
    # os._exit without an interpreter shutdown)
    return {"exits": [None] * world_size, "codes": [None] * world_size, "aborts": [], "errors": [], "hung": {},
            "checks_failed": [], "baseline": 0.0}


def _record_checks(outcome, rank, checks):
    failed = [name for name, ok in checks.items() if not ok]
    if failed:
        outcome["checks_failed"].append((rank, failed))


def _look_at_exits(processes, exited, kill, done, gone, outcome, capture, deadline):
    """One look at every process: the time each is seen gone; a hang's stacks, then a kill, for one
    still alive HANG_AFTER_S after its ops (or at `deadline`, monotonic, whatever it was doing)."""
    for rank, process in enumerate(processes):
        if rank in gone:
            continue
        if exited(process):
            gone[rank] = time.time()
        elif (rank in done and time.time() - done[rank] > HANG_AFTER_S) or time.monotonic() > deadline:
            outcome["hung"][rank] = capture(process.pid) + ("" if rank in done else "\n(never finished its ops)")
            kill(process)
            gone[rank] = time.time()


def _run_forked(world_size, init_method, teardown, env, capture):
    import queue as queue_module

    from harness import _mp_context

    context = _mp_context()
    results = context.Queue()
    processes = [context.Process(target=_forked_entry, args=(r, world_size, init_method, teardown, env, results),
                                 daemon=True) for r in range(world_size)]
    for process in processes:
        process.start()
    outcome = _new_outcome(world_size)
    done, gone = {}, {}
    deadline = time.monotonic() + 120
    try:
        while len(gone) < world_size:
            try:
                rank, status, value = results.get(timeout=0.005)
                if status == "ok":
                    done[rank] = value["done"]
                    _record_checks(outcome, rank, value["checks"])
                else:
                    outcome["errors"].append(f"rank {rank}: {value}")
                    done[rank] = time.time()
            except queue_module.Empty:
                pass
            _look_at_exits(processes, lambda p: p.exitcode is not None, lambda p: (p.kill(), p.join()), done, gone,
                           outcome, capture, deadline)
    finally:
        for process in processes:
            if process.is_alive():
                process.kill()
            process.join()
    for rank, process in enumerate(processes):
        outcome["codes"][rank] = process.exitcode
        if rank in done:
            outcome["exits"][rank] = gone[rank] - done[rank]
        if process.exitcode is not None and process.exitcode < 0 and rank not in outcome["hung"]:
            outcome["aborts"].append(rank)
    return outcome


def _run_fresh(world_size, init_method, teardown, env, capture):
    tests_dir = os.path.dirname(os.path.abspath(__file__))
    child_env = dict(os.environ, **env)
    processes = [subprocess.Popen([sys.executable, "-c", _FRESH_RANK, tests_dir, str(r), str(world_size), init_method,
                                   teardown], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=child_env)
                 for r in range(world_size)]
    processes.append(subprocess.Popen([sys.executable, "-c", _BARE], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                      text=True, env=child_env))
    outcome = _new_outcome(world_size)
    done, gone = {}, {}
    deadline = time.monotonic() + 180
    # stdout is read line by line (the CHECKS line comes before teardown); stderr at the end
    import selectors

    selector = selectors.DefaultSelector()
    for rank, process in enumerate(processes):
        selector.register(process.stdout, selectors.EVENT_READ, rank)
    while len(gone) < len(processes):
        for key, _ in selector.select(timeout=0.005):
            line = key.fileobj.readline()
            if not line:
                selector.unregister(key.fileobj)
                continue
            if line.startswith("CHECKS "):
                value = json.loads(line[len("CHECKS "):])
                done[key.data] = value["done"]
                _record_checks(outcome, key.data, value["checks"])
        _look_at_exits(processes, lambda p: p.poll() is not None, lambda p: (p.kill(), p.wait()), done, gone, outcome,
                       capture, deadline)
    bare = processes.pop()
    outcome["baseline"] = gone[world_size] - done[world_size] if world_size in done else None
    bare.stderr.read()
    for rank, process in enumerate(processes):
        stderr = process.stderr.read()
        outcome["codes"][rank] = process.returncode
        if rank in done:
            outcome["exits"][rank] = gone[rank] - done[rank]
        else:
            outcome["errors"].append(f"rank {rank} (exit {process.returncode}): {stderr[-3000:]}")
        aborted = "terminate called" in stderr or (process.returncode != 0 and rank not in outcome["hung"])
        if aborted:
            outcome["aborts"].append(rank)
            outcome["errors"].append(f"rank {rank} (exit {process.returncode}): {stderr[-3000:]}")
    return outcome


def _one_all_reduce_then_destroy(rank, world_size, init_method):
    dist.init_process_group("ddplite", init_method=init_method, rank=rank, world_size=world_size,
                            timeout=timedelta(seconds=60))
    tensor = torch.ones(4)
    dist.all_reduce(tensor)
    dist.destroy_process_group()
    os._exit(0 if tensor.tolist() == [float(world_size)] * 4 else 3)


def store_files_left(jobs, world_size=2):
    """Runs `jobs` minimal jobs (init, one all_reduce, destroy, exit at once: the race between the
    exit and threads that still hold the store is at its widest). Returns (jobs whose file://
    store file shows a ~FileStore that never ran to its end, [exit codes of every rank])."""
    from harness import _mp_context

    context = _mp_context()
    left, codes = 0, []
    for _ in range(jobs):
        with tempfile.TemporaryDirectory(prefix="ddplite-store-") as folder:
            store_path = os.path.join(folder, "store")
            processes = [context.Process(target=_one_all_reduce_then_destroy,
                                         args=(rank, world_size, f"file://{store_path}"), daemon=True)
                         for rank in range(world_size)]
            for process in processes:
                process.start()
            for process in processes:
                process.join(60)
                if process.is_alive():
                    process.kill()
                    process.join()
                codes.append(process.exitcode)
            left += store_destructor_incomplete(store_path, world_size)
    return left, codes
