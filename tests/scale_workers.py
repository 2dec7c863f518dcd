"""Rank-side code for tests/test_scale.py (issue 27: per-rank costs that do not grow)."""

import gc
import os
import signal
import resource
import time
from datetime import timedelta

import torch
import torch.distributed as dist


def _threads_and_fds():
    return len(os.listdir("/proc/self/task")), len(os.listdir("/proc/self/fd"))


def group_rounds(rank, world_size, rounds):
    """`rounds` times: a new group of every rank, an all_reduce and a send/recv ring on it, and its
    destruction. Returns the (threads, fds) before the first round and after every round."""
    before = _threads_and_fds()
    after = []
    for round_ in range(rounds):
        group = dist.new_group(list(range(world_size)))
        total = torch.full((4,), float(rank))
        dist.all_reduce(total, group=group)
        assert total.tolist() == [float(sum(range(world_size)))] * 4, total
        if world_size > 1:
            got = torch.zeros(3)
            send = dist.isend(torch.full((3,), float(rank + round_)), (rank + 1) % world_size, group=group)
            dist.recv(got, (rank - 1) % world_size, group=group)
            send.wait()
            assert got.tolist() == [float((rank - 1) % world_size + round_)] * 3, got
        dist.destroy_process_group(group)
        del group, total  # the last Python references: the group's backend ends with them
        if world_size > 1:
            del send, got
        gc.collect()
        after.append(_threads_and_fds())
    return {"before": before, "after": after}


def _sockets():
    """Established TCP connections this process holds (its descriptors matched with /proc/net/tcp*)."""
    established = set()
    for table in ("/proc/self/net/tcp", "/proc/self/net/tcp6"):
        with open(table) as rows:
            for row in list(rows)[1:]:
                fields = row.split()
                if fields[3] == "01":  # TCP_ESTABLISHED
                    established.add(fields[9])
    count = 0
    for name in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{name}")
        except OSError:
            continue  # the listing's own descriptor, closed since
        count += target.startswith("socket:[") and target[len("socket:["):-1] in established
    return count


def connections_on_demand(rank, world_size):
    """DDPLITE_CONNECT=on_demand over TCP, all_reduce pinned to the ring: the sockets this rank holds
    after set-up, after ring all_reduces (it talks to 2 peers), and after an all_to_all (to all);
    with the values, checked against the closed form."""
    # Every rank counts before any of them goes on (through the store, which is not TCP here): a
    # peer's next transfer may connect to this rank.
    store = dist.distributed_c10d._get_default_store()

    def counted(stage):
        counts[stage] = _sockets()
        store.add(f"on-demand/{stage}", 1)
        while store.add(f"on-demand/{stage}", 0) < world_size:
            time.sleep(0.01)

    counts = {}
    counted("init")
    total = torch.full((1000,), float(rank + 1))
    for _ in range(3):
        dist.all_reduce(total)
    expected = float(world_size * (world_size + 1) // 2) * world_size ** 2
    assert total.eq(expected).all(), (total[:4], expected)
    counted("ring")
    sent = torch.arange(world_size, dtype=torch.float32) + 100 * rank
    got = torch.empty(world_size)
    dist.all_to_all_single(got, sent)
    assert got.tolist() == [float(100 * source + rank) for source in range(world_size)], got
    counted("all_to_all")  # before any peer goes on to exit (its end would close: CLOSE_WAIT here)
    return counts


def peer_killed_before_connecting(rank, world_size, victim):
    """DDPLITE_CONNECT=on_demand: `victim` is killed before any collective, so no pair with it was
    ever connected. The others then all_reduce: how long it took to fail, and how."""
    if rank == victim:
        os.kill(os.getpid(), signal.SIGKILL)
    time.sleep(1.0)  # the victim is gone (its listener closed with it)
    start = time.monotonic()
    try:
        dist.all_reduce(torch.ones(1000))
        return {"raised": None, "seconds": time.monotonic() - start}
    except Exception as error:  # noqa: BLE001 - the outcome is the result
        return {"raised": type(error).__name__, "message": str(error), "seconds": time.monotonic() - start}


def descriptors_run_out(rank, world_size, store_path, victim, headroom):
    """`victim` lowers its descriptor limit to what it has open plus `headroom` before
    init_process_group (group timeout 20 s). Returns init's outcome and how long it took."""
    if rank == victim:
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        resource.setrlimit(resource.RLIMIT_NOFILE, (len(os.listdir("/proc/self/fd")) + headroom, hard))
    start = time.monotonic()
    try:
        dist.init_process_group("ddplite", init_method=f"file://{store_path}", rank=rank, world_size=world_size,
                                timeout=timedelta(seconds=20))
        dist.all_reduce(torch.ones(1))
        outcome = {"type": None, "message": ""}
    except Exception as error:  # noqa: BLE001
        outcome = {"type": type(error).__name__, "message": str(error)}
    outcome["seconds"] = time.monotonic() - start
    return outcome


def many_ranks_round(rank, world_size, counts, dtypes, p2p_sizes):
    """Every sweep (each algorithm pinned, then the automatic choice; closed form and gloo) on
    `dtypes` and `counts`, then send/recv between every pair both ways and any-source receives;
    returns {name: (first failures, checks made)} and the path the group took."""
    import sweeps
    import shm_workers
    import torch_ddp_lite

    outcome = {"path": torch_ddp_lite.cpu_path()[0], "why": torch_ddp_lite.cpu_path()[1]}
    for name in ("allreduce", "allreduce_coalesced", "reduce", "reduce_scatter", "broadcast", "allgather",
                 "gather_scatter", "alltoall"):
        result = sweeps.SWEEPS[name](rank, world_size, counts, dtypes)
        outcome[name] = (result["failures"][:5], result["checked"])
    barrier_waits = []
    for late in (0, world_size - 1):
        started = time.monotonic()
        if rank == late:
            time.sleep(0.3)
        dist.barrier()
        barrier_waits.append(time.monotonic() - started)
    outcome["barrier_waits"] = barrier_waits
    p2p = shm_workers.p2p_through_channels(rank, world_size, p2p_sizes)
    outcome["p2p"] = (p2p["failures"][:5], p2p["path"])
    return outcome


class CountingStore(dist.Store):
    """A store that counts the requests made through it and the bytes of their keys and values (sent
    and answered), around an inner store."""

    def __init__(self, inner):
        super().__init__()
        self.inner = inner
        self.calls = 0
        self.bytes = 0

    def _count(self, *parts):
        self.calls += 1
        self.bytes += sum(len(part) for part in parts)

    def set(self, key, value):
        self._count(key, value)
        return self.inner.set(key, value)

    def get(self, key):
        value = self.inner.get(key)
        self._count(key, value)
        return value

    def add(self, key, amount):
        self._count(key)
        return self.inner.add(key, amount)

    def compare_set(self, key, expected, desired):
        value = self.inner.compare_set(key, expected, desired)
        self._count(key, expected, desired, value)
        return value

    def check(self, keys):
        self._count(*keys)
        return self.inner.check(keys)

    def wait(self, keys, timeout=None):
        self._count(*keys)
        return self.inner.wait(keys) if timeout is None else self.inner.wait(keys, timeout)

    def delete_key(self, key):
        self._count(key)
        return self.inner.delete_key(key)

    def num_keys(self):
        return self.inner.num_keys()

    def multi_get(self, keys):
        values = self.inner.multi_get(keys)
        self._count(*keys, *values)
        return values

    def multi_set(self, keys, values):
        self._count(*keys, *values)
        return self.inner.multi_set(keys, values)

    def has_extended_api(self):
        return True


def store_traffic_of_init(rank, world_size, store_path):
    """init_process_group through a CountingStore: the store requests and bytes of this rank's
    set-up (torch's and ddplite's), then an all_reduce checked against its closed form."""
    store = CountingStore(dist.FileStore(store_path + ".counted", world_size))
    dist.init_process_group("ddplite", store=store, rank=rank, world_size=world_size, timeout=timedelta(seconds=60))
    counted = {"calls": store.calls, "bytes": store.bytes}
    total = torch.full((3,), float(rank + 1))
    dist.all_reduce(total)
    assert total.tolist() == [world_size * (world_size + 1) / 2] * 3, total
    dist.destroy_process_group()
    return counted


def recv_from_peer_killed_before_connecting(rank, world_size, victim):
    """DDPLITE_CONNECT=on_demand over TCP: `victim` is killed before any transfer, so no pair with
    it was ever connected. Rank 0 receives from it (and, on the same pump, from rank 1, which
    sends): how long the recv from the victim took to fail, and how."""
    if rank == victim:
        os.kill(os.getpid(), signal.SIGKILL)
    time.sleep(1.0)  # the victim is gone (its listener closed with it)
    if rank != 0:
        if rank == 1:
            dist.send(torch.full((4,), 7.0), dst=0)
        return {"raised": None}
    from_one = torch.zeros(4)
    other = dist.irecv(from_one, src=1)
    start = time.monotonic()
    try:
        dist.recv(torch.zeros(4), src=victim)
        return {"raised": None, "seconds": time.monotonic() - start}
    except Exception as error:  # noqa: BLE001 - the outcome is the result
        outcome = {"raised": type(error).__name__, "message": str(error), "seconds": time.monotonic() - start}
    other.wait()
    outcome["from_one"] = from_one.tolist()
    return outcome
