"""IPv6 and dual stack.

On this host: 2 and 4 ranks whose store is ``tcp://[::1]:PORT`` or env:// with ``MASTER_ADDR=::1``,
on the default path (shared memory) and over TCP (``DDPLITE_CPU_TRANSPORT=tcp``). The ranks listen
and publish in the store's family (``[::1]:port``), and all_reduce, broadcast, all_gather and
send/recv give their closed forms.

Across IPv6-only "hosts": network namespaces joined by veth pairs to a bridge, as in
test_multihost.py, but eth0 carries only IPv6 (fd00:231::/64, added with ``nodad``; no IPv4 but
loopback), 2 hosts x 2 ranks: with ``DDPLITE_SOCKET_IFNAME=eth0``, without it (env:// with an IPv6
MASTER_ADDR, and a file:// store, where the host's lack of IPv4 decides), and with eth0 holding
only its link-local address (the rank publishes ``[fe80::...%eth0]:port`` and peers reach it
through their own eth0). Then mixed families: host 0 publishes IPv6 while host 1 has IPv6
disabled; every rank must raise within the group's timeout, saying which rank published which
family and address and what failed.

Skipped with the reason when IPv6 (``::1``) or network namespaces (root, ``ip netns``) are missing.
"""

import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist

from harness import run_ranks

TESTS_DIR = os.path.dirname(os.path.abspath(__file__))
V6_NET, V4_NET = "fd00:231::", "10.231.0."
STORE_PORT = 29500  # every namespace has its own ports


def ipv6_unavailable():
    if not socket.has_ipv6:
        return "Python was built without IPv6"
    try:
        with socket.socket(socket.AF_INET6, socket.SOCK_STREAM) as probe:
            probe.bind(("::1", 0))
    except OSError as error:
        return f"cannot bind to ::1: {error}"
    return None


def free_port_on_ipv6_loopback():
    with socket.socket(socket.AF_INET6, socket.SOCK_STREAM) as probe:
        probe.bind(("::1", 0))
        return probe.getsockname()[1]


# --- what every rank runs ----------------------------------------------------------------------


def check_collectives(rank, size):
    """One of each collective with values whose result has a closed form; returns the names of
    those that disagree ([] when all are right)."""
    failures = []
    count = 1000
    values = torch.arange(count, dtype=torch.float64) + rank
    dist.all_reduce(values)
    if not torch.equal(values, torch.arange(count, dtype=torch.float64) * size + size * (size - 1) / 2):
        failures.append("all_reduce")
    big = torch.full((300_001,), rank + 1, dtype=torch.int64)  # several chunks and ring segments
    dist.all_reduce(big)
    if not torch.equal(big, torch.full_like(big, size * (size + 1) // 2)):
        failures.append("all_reduce (300001 int64)")
    broadcast = torch.full((count,), float(rank))
    dist.broadcast(broadcast, src=size - 1)
    if not torch.equal(broadcast, torch.full((count,), float(size - 1))):
        failures.append("broadcast")
    gathered = [torch.empty(3, dtype=torch.int64) for _ in range(size)]
    dist.all_gather(gathered, torch.full((3,), 7 * rank + 1, dtype=torch.int64))
    if not all(torch.equal(g, torch.full((3,), 7 * r + 1, dtype=torch.int64)) for r, g in enumerate(gathered)):
        failures.append("all_gather")
    # a ring of send/recv: across hosts where the ranks span several
    outgoing = torch.full((5,), 11.0 * rank + 1)
    incoming = torch.empty(5)
    left = (rank - 1) % size
    requests = [dist.isend(outgoing, (rank + 1) % size), dist.irecv(incoming, left)]
    for request in requests:
        request.wait()
    if not torch.equal(incoming, torch.full((5,), 11.0 * left + 1)):
        failures.append("send/recv")
    return failures


def run_rank(rank, size, init_method, timeout_s):
    """init_process_group, the collectives, destroy: an outcome dict (never raises)."""
    started = time.monotonic()
    outcome = {"rank": rank}
    try:
        dist.init_process_group("ddplite", init_method=init_method, rank=rank, world_size=size,
                                timeout=timedelta(seconds=timeout_s))
        import torch_ddp_lite

        outcome["path"] = torch_ddp_lite.cpu_path()[0]
        outcome["failures"] = check_collectives(rank, size)
        dist.destroy_process_group()
        outcome["raised"] = None
    except Exception as error:  # noqa: BLE001 - reported to the test
        outcome.update(raised=type(error).__name__, message=str(error))
    outcome["seconds"] = time.monotonic() - started
    return outcome


def local_rank_job(rank, size, init_method, log_folder):
    """On this host (forked by harness.run_ranks): the rank's stderr, where DDPLITE_DEBUG=INFO
    logs the address it listens on, goes to a file for the test to read."""
    log_path = os.path.join(log_folder, f"rank{rank}.log")
    saved = os.dup(2)
    with open(log_path, "w") as log:
        os.dup2(log.fileno(), 2)
    try:
        outcome = run_rank(rank, size, init_method, 60)
    finally:
        os.dup2(saved, 2)
        os.close(saved)
    with open(log_path) as log:
        outcome["listens"] = [line.strip() for line in log if " listens on " in line]
    return outcome


# Started inside a namespace host: forks one process per rank of that host (torch is imported
# once per host), each prints "OUTCOME {json}".
HOST_RANKS = """
import json, os, sys
sys.path.insert(0, sys.argv[1])
import torch, torch.distributed
from test_ipv6 import run_rank
init_method, ranks, size, timeout = sys.argv[2], json.loads(sys.argv[3]), int(sys.argv[4]), float(sys.argv[5])
children = []
for rank in ranks:
    pid = os.fork()
    if pid == 0:
        try:
            # one write(2) per line: the ranks of a host share the pipe (atomic up to PIPE_BUF)
            os.write(1, ("OUTCOME " + json.dumps(run_rank(rank, size, init_method, timeout)) + "\\n").encode())
        finally:
            os._exit(0)
    children.append(pid)
sys.exit(max(os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) for pid in children) != 0)
"""


# --- one host, ::1 -----------------------------------------------------------------------------


@pytest.mark.parametrize("size", [2, pytest.param(4, marks=pytest.mark.exhaustive)])
@pytest.mark.parametrize("transport", ["shm", "tcp"])
@pytest.mark.parametrize("rendezvous", ["tcp-url", "env"])
def test_loopback_ipv6_store(rendezvous, transport, size, tmp_path):
    """tcp://[::1]:PORT, or env:// with MASTER_ADDR=::1: every rank listens on [::1]:port (the
    store's family) and the collectives give their closed forms. CI runs the 2-rank cases; the
    4-rank repeats are `exhaustive` (4 ranks over IPv6 run in CI across the namespace hosts below)."""
    if (reason := ipv6_unavailable()) is not None:
        pytest.skip(f"needs IPv6: {reason}")
    port = free_port_on_ipv6_loopback()
    env = {"DDPLITE_DEBUG": "INFO"}
    if transport == "tcp":
        env["DDPLITE_CPU_TRANSPORT"] = "tcp"
    if rendezvous == "env":
        env.update(MASTER_ADDR="::1", MASTER_PORT=str(port))
        init_method = "env://"
    else:
        init_method = f"tcp://[::1]:{port}"
    results = run_ranks(local_rank_job, size, init_method, str(tmp_path), backend=None, env=env, timeout_s=120)
    for rank, outcome in enumerate(results):
        assert outcome["raised"] is None, (rank, outcome)
        assert outcome["failures"] == [], (rank, outcome)
        assert outcome["path"] == ("tcp" if transport == "tcp" else "shm"), outcome["path"]
        # the TCP meshes (collectives over TCP; point-to-point on either path) listen on ::1
        assert outcome["listens"], (rank, outcome)
        why = "MASTER_ADDR=::1" if rendezvous == "env" else "the store at ::1"
        for line in outcome["listens"]:
            assert f"rank {rank}/{size} listens on [::1]:" in line and why in line, line


@pytest.mark.parametrize("master", ["::1", "127.0.0.1"])
def test_ifname_on_a_dual_stack_interface_follows_the_store_family(master, tmp_path):
    """DDPLITE_SOCKET_IFNAME==lo, which holds 127.0.0.1 and ::1: IPv4 as before, unless MASTER_ADDR
    is an IPv6 address."""
    if (reason := ipv6_unavailable()) is not None:
        pytest.skip(f"needs IPv6: {reason}")
    port = free_port_on_ipv6_loopback() if master == "::1" else 0
    if port == 0:
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
    env = {"DDPLITE_DEBUG": "INFO", "DDPLITE_SOCKET_IFNAME": "=lo", "DDPLITE_CPU_TRANSPORT": "tcp",
           "MASTER_ADDR": master, "MASTER_PORT": str(port)}
    results = run_ranks(local_rank_job, 2, "env://", str(tmp_path), backend=None, env=env, timeout_s=120)
    expected = "[::1]:" if master == "::1" else "127.0.0.1:"
    why = "interface lo chosen by DDPLITE_SOCKET_IFNAME==lo" + \
        (", its IPv6 address: the store's address is IPv6)" if master == "::1" else ")")
    for rank, outcome in enumerate(results):
        assert outcome["raised"] is None and outcome["failures"] == [], (rank, outcome)
        assert len(outcome["listens"]) == 2, outcome
        for line in outcome["listens"]:
            assert f"listens on {expected}" in line and line.endswith(why), line


def test_bracketed_and_plain_addresses_in_messages(tmp_path):
    """A bad IFNAME lists the interfaces of both families (IPv6 ones unbracketed, as `ip` prints
    them) and still says 'matches no IPv4 interface' as before."""
    results = run_ranks(local_rank_job, 2, f"file://{tmp_path / 'store'}", str(tmp_path), backend=None,
                        env={"DDPLITE_SOCKET_IFNAME": "=nosuchif0"}, timeout_s=120)
    for outcome in results:
        assert outcome["raised"] == "DistBackendError", outcome
        assert "DDPLITE_SOCKET_IFNAME==nosuchif0 matches no IPv4 interface or IPv6 interface that is up" in \
            outcome["message"], outcome["message"]
        assert "lo=127.0.0.1" in outcome["message"]
        if ipv6_unavailable() is None:
            assert "lo=::1" in outcome["message"], outcome["message"]


# --- IPv6-only hosts (network namespaces) ------------------------------------------------------


def _multihost():
    """test_multihost's namespace machinery, imported only when a namespace test runs (the ranks
    forked for the tests above import this module too)."""
    import test_multihost

    if test_multihost._UNAVAILABLE is not None:
        pytest.skip(f"needs network namespaces: {test_multihost._UNAVAILABLE}")
    if (reason := ipv6_unavailable()) is not None:
        pytest.skip(f"needs IPv6: {reason}")
    return test_multihost


def make_hosts(multihost, layout):
    """Namespaces on one bridge; layout[i] says what host i's eth0 carries: "6" fd00:231::(i+1)/64
    only, "ll" its link-local address only, "46" both that and 10.231.0.(i+1)/24, "4" IPv4 only
    with IPv6 disabled in the namespace (a host that can only do IPv4)."""

    class Ipv6Hosts(multihost.Hosts):
        def __init__(self):
            self.layout = layout
            super().__init__(len(layout))

        def _build(self):
            ip = multihost._ip
            self._netns_add(self.switch)
            ip("-n", self.switch, "link", "add", "br0", "type", "bridge")
            ip("-n", self.switch, "link", "set", "br0", "up")
            for index, (name, carries) in enumerate(zip(self.names, self.layout)):
                self._netns_add(name)
                sysctl = ["net.ipv6.conf.all.disable_ipv6=1", "net.ipv6.conf.default.disable_ipv6=1"] \
                    if carries == "4" else ["net.ipv6.conf.all.accept_dad=0", "net.ipv6.conf.default.accept_dad=0"]
                subprocess.run(["ip", "netns", "exec", name, "sysctl", "-q", "-w", *sysctl], check=True, timeout=30,
                               capture_output=True)
                port = f"port{index}"
                ip("link", "add", "name", "eth0", "netns", name, "type", "veth", "peer", "name", port, "netns",
                   self.switch)
                ip("-n", self.switch, "link", "set", port, "master", "br0")
                ip("-n", self.switch, "link", "set", port, "up")
                if "6" in carries:
                    ip("-n", name, "-6", "addr", "add", f"{V6_NET}{index + 1}/64", "dev", "eth0", "nodad")
                if "4" in carries:
                    ip("-n", name, "addr", "add", f"{V4_NET}{index + 1}/24", "dev", "eth0")
                ip("-n", name, "link", "set", "eth0", "up")

        def link_local(self, host):
            shown = multihost._ip("-n", self.names[host], "-6", "-o", "addr", "show", "dev", "eth0", "scope", "link")
            return shown.stdout.split()[3].split("/")[0]

    return Ipv6Hosts()


@pytest.fixture
def namespaces():
    multihost = _multihost()
    built = []

    def build(layout):
        built.append(make_hosts(multihost, layout))
        return built[-1]

    yield build
    for network in built:
        network.destroy()


def run_hosts(network, init_method, layout, env_of_host, timeout_s, job_timeout):
    """Starts each host's ranks (HOST_RANKS); returns ({rank: outcome}, {host: output})."""
    multihost = sys.modules["test_multihost"]
    size = len(layout)
    jobs = []
    for host in range(len(network.names)):
        ranks = [rank for rank, h in enumerate(layout) if h == host]
        env = {**multihost.rank_environment(), "DDPLITE_DEBUG": "INFO", **env_of_host(host)}
        env = {name: value for name, value in env.items() if value is not None}
        cmd = [sys.executable, "-c", HOST_RANKS, TESTS_DIR, init_method, json.dumps(ranks), str(size), str(timeout_s)]
        jobs.append(multihost.start(network.run(host, cmd), env))
    results = multihost.finish(jobs, timeout=job_timeout)
    outcomes, outputs = {}, {}
    for host, (_, output, _) in enumerate(results):
        outputs[host] = output
        for line in output.splitlines():
            if line.startswith("OUTCOME "):
                outcome = json.loads(line[len("OUTCOME "):])
                outcomes[outcome["rank"]] = outcome
    assert sorted(outcomes) == list(range(size)), (sorted(outcomes), outputs)
    return outcomes, outputs


def listen_lines(output, rank):
    return [line for line in output.splitlines() if f" rank {rank}/" in line and " listens on " in line]


LAYOUT = [0, 0, 1, 1]  # 2 hosts x 2 ranks


@pytest.mark.parametrize("setting", ["ifname-eth0", "env-master-addr", "file-store", "link-local"])
def test_ipv6_only_hosts(namespaces, tmp_path, setting):
    """2 IPv6-only hosts x 2 ranks (all_reduce and broadcast hierarchical: shared memory inside each
    host, TCP over IPv6 between them). Each rank publishes its host's eth0 address:
    ifname-eth0: DDPLITE_SOCKET_IFNAME=eth0 and tcp://[fd00:231::1]:29500;
    env-master-addr: no IFNAME, env:// with MASTER_ADDR=fd00:231::1 (the route to it);
    file-store: no IFNAME, a file:// store (no address to follow: the host has no IPv4 but loopback,
    so its IPv6 address); link-local: eth0 has only its fe80:: address, IFNAME=eth0, file:// store:
    published with its scope, reached through the peer's own eth0."""
    network = namespaces(["ll", "ll"] if setting == "link-local" else ["6", "6"])
    host_address = [f"{V6_NET}{host + 1}" for host in range(2)]
    ifname = None
    if setting == "ifname-eth0":
        init_method, ifname = f"tcp://[{host_address[0]}]:{STORE_PORT}", "eth0"
        why = "interface eth0 chosen by DDPLITE_SOCKET_IFNAME=eth0, its IPv6 address: the store's address is IPv6"
    elif setting == "env-master-addr":
        init_method = "env://"
        why = f"the interface that reaches MASTER_ADDR={host_address[0]}"
    elif setting == "file-store":
        init_method = f"file://{tmp_path / 'store'}"
        why = "interface eth0's IPv6 address: the host has no IPv4 address but loopback"
    else:
        init_method, ifname = f"file://{tmp_path / 'store'}", "eth0"
        host_address = [f"{network.link_local(host)}%eth0" for host in range(2)]
        why = "interface eth0 chosen by DDPLITE_SOCKET_IFNAME=eth0, its IPv6 link-local address: the interfaces chosen"

    def env_of_host(host):
        master = {"MASTER_ADDR": f"{V6_NET}1", "MASTER_PORT": str(STORE_PORT)} if setting == "env-master-addr" \
            else {"MASTER_ADDR": None, "MASTER_PORT": None}
        return {"DDPLITE_SOCKET_IFNAME": ifname, "NCCL_SOCKET_IFNAME": None, "GLOO_SOCKET_IFNAME": None, **master}

    outcomes, outputs = run_hosts(network, init_method, LAYOUT, env_of_host, timeout_s=60, job_timeout=120)
    for rank, host in enumerate(LAYOUT):
        outcome = outcomes[rank]
        assert outcome["raised"] is None, (rank, outcome, outputs[host][-4000:])
        assert outcome["failures"] == [], (rank, outcome)
        assert outcome["path"] == "hierarchical", outcome
        lines = listen_lines(outputs[host], rank)
        assert len(lines) == 2, outputs[host][-4000:]  # the collectives' and point-to-point meshes
        for line in lines:
            assert f"listens on [{host_address[host]}]:" in line and why in line, line
        print(f"host {host}: {lines[0]}")
    assert network.pids() == []


def test_mixed_families_fail_clearly_on_every_rank(namespaces):
    """Host 0 (dual stack) follows MASTER_ADDR=fd00:231::1 and publishes IPv6; host 1 has IPv6
    disabled and follows MASTER_ADDR=10.231.0.1 (the same store, over IPv4), publishing IPv4. Host 1's
    ranks cannot reach host 0's: every rank raises DistBackendError within the group's timeout; the
    ranks of host 1 say which rank published which family and address, and host 0's quote them as soon as
    it is recorded, before the timeout."""
    network, timeout = namespaces(["46", "4"]), 6

    def env_of_host(host):
        return {"MASTER_ADDR": f"{V6_NET}1" if host == 0 else f"{V4_NET}1", "MASTER_PORT": str(STORE_PORT),
                "DDPLITE_SOCKET_IFNAME": None, "NCCL_SOCKET_IFNAME": None, "GLOO_SOCKET_IFNAME": None}

    outcomes, outputs = run_hosts(network, "env://", LAYOUT, env_of_host, timeout_s=timeout, job_timeout=90)
    for rank, host in enumerate(LAYOUT):
        outcome = outcomes[rank]
        message = outcome.get("message", "")
        assert outcome["raised"] == "DistBackendError", (rank, outcome, outputs[host][-4000:])
        assert outcome["seconds"] < timeout + 5, (rank, outcome)
        assert "addresses of different families" in message and "Hint: give every rank addresses of one family" \
            in message, message
        if host == 1:
            assert f"rank {rank} could not connect to rank 0 at [{V6_NET}1]:" in message, message
            assert f"(rank {rank} listens on {V4_NET}2:" in message, message
            assert f"rank 0 published an IPv6 address ([{V6_NET}1]:" in message, message
            assert f"and rank {rank} an IPv4 one ({V4_NET}2:" in message, message
            assert f"rank {rank}'s host cannot reach rank 0's over IPv6" in message, message
        else:
            assert f"rank {rank} (listening on [{V6_NET}1]:" in message, message
            # the failure recorded by host 1's ranks ends the wait at once, not at the timeout
            assert "Gave up waiting for rank(s) 2, 3 to connect: a rank's set-up failed; first failure reported: rank " \
                in message, message
            assert outcome["seconds"] < timeout, (rank, outcome)
            assert "rank 0 published an IPv6 address" in message, message
        print(f"rank {rank}: {outcome['seconds']:.1f} s: {outcome['raised']}: {message}")
    assert network.pids() == []


@pytest.mark.parametrize("text, printed", [
    ("10.0.0.1:80", "10.0.0.1:80"),
    ("[::1]:80", "[::1]:80"),
    ("[fd00:231::1]:29500", "[fd00:231::1]:29500"),
    ("[fe80::1%lo]:5", "[fe80::1%lo]:5"),  # a link-local address keeps its interface
])
def test_published_addresses_parse_back_to_themselves(text, printed):
    import torch_ddp_lite

    assert torch_ddp_lite._load_extension().parse_endpoint(text) == printed


@pytest.mark.parametrize("text, problem", [
    ("[::1:80", "is not an address:port"),
    ("::1:80", "is not an address:port"),  # IPv6 without brackets is ambiguous: refused
    ("10.0.0.1", "is not an address:port"),
    ("[fd00::1]:99999", "is not an address:port"),
    ("[fe80::1%nosuch0]:5", "link-local address"),
])
def test_malformed_addresses_are_refused_with_the_problem(text, problem):
    import torch_ddp_lite

    with pytest.raises(ValueError, match=problem):
        torch_ddp_lite._load_extension().parse_endpoint(text)


def test_listen_address_follows_an_ipv6_store_host(monkeypatch):
    import torch_ddp_lite

    for name in ("MASTER_ADDR", "DDPLITE_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME"):
        monkeypatch.delenv(name, raising=False)
    address, why = torch_ddp_lite._load_extension().listen_address("::1")
    assert address == "::1" and "::1" in why, (address, why)
