"""Rank-side code for tests/test_scale.py (per-rank costs that do not grow)."""

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
    return sum(state == "01" for state, *_ in _own_sockets().values())  # 01: TCP_ESTABLISHED


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
    returns {name: (first failures, checks made)}, "path" and "why" (the path the group took and
    why), "barriers" ((entered, left) of two barriers, rank 0 then the last rank late to each) and
    "p2p" ((first failures, path))."""
    import sweeps
    import shm_workers
    import torch_ddp_lite

    outcome = {"path": torch_ddp_lite.cpu_path()[0], "why": torch_ddp_lite.cpu_path()[1]}
    for name in ("allreduce", "allreduce_coalesced", "reduce", "reduce_scatter", "broadcast", "allgather",
                 "gather_scatter", "alltoall"):
        result = sweeps.SWEEPS[name](rank, world_size, counts, dtypes)
        outcome[name] = (result["failures"][:5], result["checked"])
    # (entered, left) per barrier, on CLOCK_MONOTONIC (time.monotonic), one clock for every process
    # of the host: a rank may leave only after the last rank entered. Not the time each rank waited:
    # the ranks come to this loop up to tenths of a second apart at 64 ranks on 2 cores, so a rank
    # that comes late itself waits less than the late rank's sleep.
    barriers = []
    for late in (0, world_size - 1):
        if rank == late:
            time.sleep(0.3)
        entered = time.monotonic()
        dist.barrier()
        barriers.append((entered, time.monotonic()))
    outcome["barriers"] = barriers
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


def _tcp_table():
    """{socket inode: (state, local port, remote port, remote address as /proc/net/tcp writes it)}
    of this network namespace's TCP sockets (IPv4 and IPv6)."""
    table = {}
    for name in ("/proc/self/net/tcp", "/proc/self/net/tcp6"):
        with open(name) as rows:
            for row in list(rows)[1:]:
                fields = row.split()
                remote_ip, remote_port = fields[2].rsplit(":", 1)
                table[fields[9]] = (fields[3], int(fields[1].rsplit(":", 1)[1], 16), int(remote_port, 16), remote_ip)
    return table


def _socket_inodes():
    """The inode of each socket this process holds, as /proc/net/tcp* names it."""
    for name in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{name}")
        except OSError:
            continue  # the listing's own descriptor, closed since
        if target.startswith("socket:["):
            yield target[len("socket:["):-1]


def _own_sockets():
    """{inode: (state, local port, remote port, remote address)} of the TCP sockets this process
    holds."""
    table = _tcp_table()
    return {inode: table[inode] for inode in _socket_inodes() if inode in table}


def _store_barrier(store, key, world_size):
    store.add(key, 1)
    while store.add(key, 0) < world_size:
        time.sleep(0.005)


def simultaneous_connects(rank, world_size, rounds, collective):
    """DDPLITE_CONNECT=on_demand over TCP: `rounds` fresh groups, each started on every rank at once
    (a store barrier) with one `collective` ("all_reduce" at 2 ranks: both connect to each other at
    the same moment; "all_to_all" at more: every pair). Per round: the established sockets it added
    on this rank, how many of them this rank made (their local port is not one of its listeners'),
    the op's seconds, and whether its values are the closed form."""
    store = dist.distributed_c10d._get_default_store()
    outcomes = []
    for round_ in range(rounds):
        group = dist.new_group(backend="ddplite")
        before = _own_sockets()
        _store_barrier(store, f"simultaneous/{round_}", world_size)
        start = time.monotonic()
        if collective == "all_reduce":
            tensor = torch.full((10,), float(rank + 1))
            dist.all_reduce(tensor, group=group)
            right = tensor.eq(world_size * (world_size + 1) / 2).all().item()
        else:
            sent = torch.arange(world_size, dtype=torch.float32) + 100 * rank
            got = torch.empty(world_size)
            dist.all_to_all_single(got, sent, group=group)
            right = got.tolist() == [float(100 * source + rank) for source in range(world_size)]
        seconds = time.monotonic() - start
        after = _own_sockets()
        listening = {port for state, port, *_ in after.values() if state == "0A"}
        added = [port for inode, (state, port, *_) in after.items() if state == "01" and inode not in before]
        outcomes.append({"added": len(added), "made": sum(port not in listening for port in added),
                         "seconds": seconds, "right": right})
        _store_barrier(store, f"simultaneous/{round_}/counted", world_size)  # no peer leaves before the count
    return outcomes


def _listening_addresses():
    """("127.0.0.1", port) of each IPv4 TCP listener this process holds."""
    table = {}
    with open("/proc/self/net/tcp") as rows:
        for row in list(rows)[1:]:
            fields = row.split()
            if fields[3] == "0A":
                ip_hex, port_hex = fields[1].split(":")
                ip = ".".join(str(b) for b in reversed(bytes.fromhex(ip_hex)))
                table[fields[9]] = ("127.0.0.1" if ip == "0.0.0.0" else ip, int(port_hex, 16))
    return [table[inode] for inode in _socket_inodes() if inode in table]


def _keep_silent_connections(addresses, per_listener, opened, stop, churn):
    """Holds `per_listener` silent connections to each address; reconnects each one the listener
    drops, at once, until `stop` is set (strangers that come back as soon as they are pushed out).
    `churn`: each one also closes itself within 0.5 s of its connect and reconnects at once, so the
    pending slots never hold a connection older than that."""
    import random
    import select
    import socket

    held, closes_at = [], {}
    draw = random.Random(7)

    def one(address):
        connection = socket.socket()
        connection.setblocking(True)
        connection.settimeout(5)
        connection.connect(address)
        connection.setblocking(False)
        closes_at[connection] = time.monotonic() + draw.uniform(0.05, 0.5)
        return (connection, address)

    for address in addresses:
        held += [one(address) for _ in range(per_listener)]
    opened.set()
    while not stop.is_set():
        if churn:
            now = time.monotonic()
            for index, (connection, address) in enumerate(held):
                if closes_at.get(connection, now + 1) <= now:
                    closes_at.pop(connection, None)
                    connection.close()
                    try:
                        held[index] = one(address)
                    except OSError:
                        held[index] = (socket.socket(), address)
        # poll(), not select(): with three listeners per attacked rank the attacker holds over 1024
        # descriptors, past select()'s limit.
        poller = select.poll()
        by_fd = {}
        for c, _ in held:
            if c.fileno() >= 0:
                poller.register(c.fileno(), select.POLLIN)
                by_fd[c.fileno()] = c
        readable = [by_fd[fd] for fd, _ in poller.poll(50)]
        for connection in readable:
            try:
                dropped = connection.recv(64) == b""  # a challenge (authentication) is not a drop
            except (BlockingIOError, InterruptedError):
                dropped = False
            except OSError:
                dropped = True
            if dropped:
                index = next(i for i, (c, _) in enumerate(held) if c is connection)
                address = held[index][1]
                closes_at.pop(connection, None)
                connection.close()
                try:
                    held[index] = one(address)
                except OSError:
                    held[index] = (socket.socket(), address)  # the listener is gone: the job ended
    for connection, _ in held:
        connection.close()


def silent_connections_during_the_job(rank, world_size, attacked, per_listener, churn=False):
    """DDPLITE_CONNECT=on_demand over TCP. The last rank opens `per_listener` silent connections to
    every listener of each rank in `attacked` (its collectives' and send/recv meshes, its status
    listener) and reopens
    each one that is dropped, while the job connects its pairs (an all_to_all: every pair) and
    computes. Returns this rank's descriptor count before the attack and at its peak, its
    listeners, and whether the values were right."""
    import threading

    store = dist.distributed_c10d._get_default_store()
    attacker = world_size - 1
    total = torch.full((100,), float(rank + 1))
    dist.all_reduce(total)  # the group works; some pairs connect
    if rank in attacked:
        store.set(f"attack/listeners/{rank}", repr(_listening_addresses()))
    _store_barrier(store, "attack/published", world_size)
    before = len(os.listdir("/proc/self/fd"))
    stop, opened = threading.Event(), threading.Event()
    if rank == attacker:
        import ast

        addresses = [a for r in attacked for a in ast.literal_eval(store.get(f"attack/listeners/{r}").decode())]
        thread = threading.Thread(target=_keep_silent_connections,
                                  args=(addresses, per_listener, opened, stop, churn), daemon=True)
        thread.start()
        if not opened.wait(60):
            raise AssertionError("the attacker could not open its connections")
        store.set("attack/opened", "1")
    store.wait(["attack/opened"])
    time.sleep(1.0)  # every listener's acceptor has taken (or refused) the strangers
    peak = len(os.listdir("/proc/self/fd"))
    asked = None
    if rank == 1:  # the live status query still gets through the attacked ranks' status listeners
        from torch_ddp_lite import status

        report = status.collect(store)
        asked = {"outcomes": [entry["outcome"] for entry in report["ranks"]], "took_s": report["took_s"]}
    right = True
    started = time.monotonic()
    for _ in range(3):  # every pair connects (to the attacked ranks too) under the attack
        sent = torch.arange(world_size, dtype=torch.float32) + 100 * rank
        got = torch.empty(world_size)
        dist.all_to_all_single(got, sent)
        right &= got.tolist() == [float(100 * source + rank) for source in range(world_size)]
        total = torch.full((100,), float(rank + 1))
        dist.all_reduce(total)
        right &= bool(total.eq(world_size * (world_size + 1) / 2).all())
        peak = max(peak, len(os.listdir("/proc/self/fd")))
        time.sleep(0.5)
    seconds = time.monotonic() - started - 1.5  # the loop's own sleeps aside
    peak = max(peak, len(os.listdir("/proc/self/fd")))
    _store_barrier(store, "attack/counted", world_size)
    if rank == attacker:
        stop.set()
        thread.join(30)
    _store_barrier(store, "attack/over", world_size)
    return {"right": right, "before": before, "peak": peak, "listeners": len(_listening_addresses()),
            "seconds": seconds, "status": asked}


def destroy_while_a_recv_waits_for_an_address(rank, world_size):
    """DDPLITE_CONNECT=on_demand over TCP, 3 ranks: rank 2's send/recv address is taken out of the
    store, as if rank 2 had died during its init before it published it. Rank 1 posts a recv from
    rank 2, so its send/recv pump waits for that address; then rank 1 destroys the group. The
    wait must end with the destroy (abort), not at the store's timeout (60 s here): how long the
    destroy took."""
    store = dist.distributed_c10d._get_default_store()
    key = f"cpu//ddplite/size{world_size}/run0/ddplite/p2p/addr/2"  # torch's prefixes, then ddplite's
    if rank == 0:
        store.wait([key], timedelta(seconds=30))  # published (an on-demand init waits for no peer)
        store.delete_key(key)
        store.set("address/unpublished", "1")
    store.wait(["address/unpublished"])
    if rank == 1:
        work = dist.irecv(torch.zeros(4), src=2)
        time.sleep(1.0)  # the pump now waits for rank 2's address
        start = time.monotonic()
        dist.destroy_process_group()
        seconds = time.monotonic() - start
        try:
            work.wait()
            failed = None
        except Exception as error:  # noqa: BLE001
            failed = type(error).__name__
        outcome = {"destroy_seconds": seconds, "recv": failed}
    else:
        outcome = {}
    _store_barrier(store, "address/done", world_size)
    return outcome
