"""Several hosts: Linux network namespaces as machines, joined by veth pairs to a bridge.

Each "host" is a namespace with ``lo``, an ``eth0`` (a veth whose other end is on a bridge in a
switch namespace; 10.231.0.0/24) and a ``docker0`` that reaches nobody (a veth whose other end is
up but holds no address, 10.232.0.0/24: ARP goes unanswered, nothing arrives). Ranks start inside
the namespaces (``ip netns exec``) exactly as on separate machines: torchrun with a c10d
rendezvous on host 0's eth0 address, or one process per rank with ``--dist-url``. Training must
give the parameters of the same world size on one host, bitwise; ``DDPLITE_SOCKET_IFNAME`` picks
eth0 (the prefix and ``=`` forms); naming docker0 instead must fail on every rank within the
group's timeout, naming the peer and the address it could not reach.

Needs root and ``ip netns`` (iproute2); skipped with the reason otherwise. Namespaces carry a
per-run name and are deleted, with every process inside, even when a test fails.
"""

import json
import os
import shutil
import signal
import subprocess
import sys
import time
import uuid

import pytest
import torch

from test_cifar10 import FEW_STEPS, REPO, command, load_checkpoint, rank_environment
from tiers import exhaustive

GOOD_NET, BAD_NET = "10.231.0", "10.232.0"
STORE_PORT = 29500  # every namespace has its own ports: nothing else listens there


def _ip(*args, check=True):
    return subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30, check=check)


def namespaces_unavailable():
    if shutil.which("ip") is None:
        return "no 'ip' command (iproute2); scripts/setup.sh installs it"
    if os.geteuid() != 0:
        return "network namespaces need root"
    probe = f"ddplprobe{os.getpid()}"
    result = _ip("netns", "add", probe, check=False)
    if result.returncode != 0:
        return f"'ip netns add' is not permitted here: {result.stderr.strip()}"
    _ip("netns", "del", probe, check=False)
    return None


_UNAVAILABLE = namespaces_unavailable()
pytestmark = pytest.mark.skipif(_UNAVAILABLE is not None, reason=f"needs network namespaces: {_UNAVAILABLE}")


class Hosts:
    """``count`` namespaces on one bridge; host i has eth0 = 10.231.0.(i+1) and, unless
    ``dead_end`` is False, docker0 = 10.232.0.(i+1)."""

    def __init__(self, count, dead_end=True):
        self.dead_end = dead_end
        tag = uuid.uuid4().hex[:6]
        self.switch = f"ddpl{tag}sw"
        self.names = [f"ddpl{tag}h{i}" for i in range(count)]
        self.addresses = [f"{GOOD_NET}.{i + 1}" for i in range(count)]
        self.created = []
        try:
            self._build()
        except BaseException:
            self.destroy()
            raise

    def _netns_add(self, name):
        _ip("netns", "add", name)
        self.created.append(name)
        _ip("-n", name, "link", "set", "lo", "up")

    def _build(self):
        self._netns_add(self.switch)
        _ip("-n", self.switch, "link", "add", "br0", "type", "bridge")
        _ip("-n", self.switch, "link", "set", "br0", "up")
        for index, name in enumerate(self.names):
            self._netns_add(name)
            port = f"port{index}"
            _ip("link", "add", "name", "eth0", "netns", name, "type", "veth", "peer", "name", port, "netns", self.switch)
            _ip("-n", self.switch, "link", "set", port, "master", "br0")
            _ip("-n", self.switch, "link", "set", port, "up")
            _ip("-n", name, "addr", "add", f"{GOOD_NET}.{index + 1}/24", "dev", "eth0")
            _ip("-n", name, "link", "set", "eth0", "up")
            if not self.dead_end:
                continue
            # docker0: up, with an address, and a dead end (its peer takes no address).
            _ip("-n", name, "link", "add", "docker0", "type", "veth", "peer", "name", "vethdead0")
            _ip("-n", name, "addr", "add", f"{BAD_NET}.{index + 1}/24", "dev", "docker0")
            _ip("-n", name, "link", "set", "docker0", "up")
            _ip("-n", name, "link", "set", "vethdead0", "up")

    def run(self, host, cmd):
        return ["ip", "netns", "exec", self.names[host], *cmd]

    def pids(self):
        """Processes still running inside any of the namespaces."""
        found = []
        for name in self.created:
            result = _ip("netns", "pids", name, check=False)
            found += [int(pid) for pid in result.stdout.split()]
        return found

    def destroy(self):
        for pid in self.pids():
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        for name in reversed(self.created):
            _ip("netns", "del", name, check=False)
        self.created = []


@pytest.fixture
def hosts():
    built = []

    def build(count):
        built.append(Hosts(count))
        return built[-1]

    yield build
    for network in built:
        network.destroy()
    leftover = set(_ip("netns", "list").stdout.split()) & {n for net in built for n in [net.switch, *net.names]}
    assert not leftover, f"namespaces left behind: {leftover}"


def start(cmd, env):
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=REPO, env=env,
                            start_new_session=True)


def finish(jobs, timeout):
    """Waits for every job; returns [(returncode, output, seconds from start)]; kills leftovers' groups."""
    started = time.monotonic()
    try:
        results = []
        for job in jobs:
            output = job.communicate(timeout=max(1.0, started + timeout - time.monotonic()))[0]
            results.append((job.returncode, output, time.monotonic() - started))
        return results
    finally:
        for job in jobs:
            try:
                os.killpg(job.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            job.wait()


def host_environment(ifname, **extra):
    return {**rank_environment(), "DDPLITE_SOCKET_IFNAME": ifname, "DDPLITE_DEBUG": "INFO", **extra}


def assert_same_parameters(checkpoint, reference):
    assert checkpoint["config"] == reference["config"]
    assert checkpoint["model"].keys() == reference["model"].keys()
    for name, tensor in reference["model"].items():
        assert torch.equal(checkpoint["model"][name], tensor), name


def listen_lines(output):
    return [line for line in output.splitlines() if " listens on " in line]


@pytest.fixture(scope="module")
def synthetic_dir(tmp_path_factory):
    return str(tmp_path_factory.mktemp("generated-cifar10"))


@pytest.fixture(scope="module")
def one_host_four_ranks(tmp_path_factory, synthetic_dir):
    """The reference: 4 ranks on one host (torchrun --standalone), the same tiny run, over TCP as
    the groups across hosts are (on one host the default is shared memory, whose allreduce adds in
    another order: the same values to rounding, not bitwise)."""
    if _UNAVAILABLE is not None:
        pytest.skip(_UNAVAILABLE)
    run_dir = tmp_path_factory.mktemp("one-host-4")
    result = subprocess.run(command(str(run_dir), synthetic_dir, *FEW_STEPS, nproc=4), capture_output=True,
                            text=True, timeout=300, cwd=REPO, env=rank_environment(DDPLITE_CPU_TRANSPORT="tcp"))
    assert result.returncode == 0, result.stdout + result.stderr[-5000:]
    return load_checkpoint(run_dir)


@pytest.fixture(scope="module")
def one_host_four_ranks_paired_sums(tmp_path_factory, synthetic_dir):
    """The reference of 2 hosts x 2 ranks: their all_reduce is hierarchical, (a0 + a1) + (a2 + a3)
    for every element (each host in rank order, then the two leaders). Butterfly all_reduce on 4
    ranks over TCP adds in exactly that order (partners 1 apart, then 2 apart), so the same
    training on one host with it pinned must give the same parameters bit for bit."""
    if _UNAVAILABLE is not None:
        pytest.skip(_UNAVAILABLE)
    run_dir = tmp_path_factory.mktemp("one-host-4-butterfly")
    result = subprocess.run(command(str(run_dir), synthetic_dir, *FEW_STEPS, nproc=4), capture_output=True,
                            text=True, timeout=300, cwd=REPO,
                            env=rank_environment(DDPLITE_CPU_TRANSPORT="tcp", DDPLITE_ALGO="allreduce:butterfly"))
    assert result.returncode == 0, result.stdout + result.stderr[-5000:]
    return load_checkpoint(run_dir)


def test_two_hosts_two_ranks_each_under_torchrun(hosts, tmp_path, synthetic_dir, one_host_four_ranks_paired_sums):
    """torchrun on each host, --nnodes 2 with a c10d rendezvous on host 0's eth0;
    DDPLITE_SOCKET_IFNAME=eth (prefix). all_reduce runs hierarchically (shared memory inside each
    host), so the reference adds in the same order (one_host_four_ranks_paired_sums)."""
    network = hosts(2)
    endpoint = f"{network.addresses[0]}:{STORE_PORT}"
    jobs = []
    for node in range(2):
        # The namespaces share this machine's host name, so torchrun cannot tell that host 0 holds the
        # endpoint (is_host) nor which address the other node reaches it by (--local-addr); on real
        # machines both follow from the host names.
        torchrun = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--node-rank", str(node),
                    "--nproc-per-node", "2", "--rdzv-backend", "c10d", "--rdzv-endpoint", endpoint,
                    "--rdzv-conf", f"is_host={int(node == 0)}", "--local-addr", network.addresses[node]]
        cmd = [*torchrun, *command(str(tmp_path), synthetic_dir, *FEW_STEPS, nproc=None)[1:]]
        jobs.append(start(network.run(node, cmd), host_environment("eth")))
    results = finish(jobs, timeout=240)
    for node, (returncode, output, _) in enumerate(results):
        assert returncode == 0, f"host {node}:\n{output[-6000:]}"
        lines = listen_lines(output)
        assert len(lines) == 4, output[-6000:]  # 2 ranks x (collectives + point-to-point meshes)
        assert all(f"listens on {network.addresses[node]}:" in line and
                   "interface eth0 chosen by DDPLITE_SOCKET_IFNAME=eth" in line for line in lines), lines
    assert "launcher=torchrun world_size=4" in results[0][1] + results[1][1]
    assert "all_reduce, broadcast, reduce, all_gather, reduce_scatter and barrier within each host through " \
        "shared memory and across hosts over TCP among one leader per host; gather, scatter and all_to_all over " \
        "TCP" in results[0][1]
    assert_same_parameters(load_checkpoint(tmp_path), one_host_four_ranks_paired_sums)
    assert network.pids() == []


def test_four_hosts_one_rank_each_with_dist_url(hosts, tmp_path, synthetic_dir, one_host_four_ranks):
    """One process per host, started by hand: --dist-url tcp://<host 0>:PORT --world-size 4 --rank R;
    DDPLITE_SOCKET_IFNAME==eth0 (exact)."""
    network = hosts(4)
    url = f"tcp://{network.addresses[0]}:{STORE_PORT}"
    env = host_environment("=eth0", OMP_NUM_THREADS="1")  # as torchrun sets it, like the reference
    jobs = [start(network.run(rank, command(str(tmp_path), synthetic_dir, *FEW_STEPS, "--dist-url", url,
                                            "--world-size", "4", "--rank", str(rank), nproc=None)), env)
            for rank in range(4)]
    results = finish(jobs, timeout=240)
    for rank, (returncode, output, _) in enumerate(results):
        assert returncode == 0, f"rank {rank}:\n{output[-6000:]}"
        lines = listen_lines(output)
        assert len(lines) == 2 and all(f"listens on {network.addresses[rank]}:" in line and
                                       "chosen by DDPLITE_SOCKET_IFNAME==eth0" in line for line in lines), lines
    assert "launcher=dist-url world_size=4" in results[0][1]
    assert_same_parameters(load_checkpoint(tmp_path), one_host_four_ranks)
    assert network.pids() == []


WRONG_INTERFACE_RANK = """
import json, sys, time
from datetime import timedelta
import torch.distributed as dist
url, rank, size, timeout = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
start = time.monotonic()
try:
    dist.init_process_group("ddplite", init_method=url, rank=rank, world_size=size,
                            timeout=timedelta(seconds=timeout))
    outcome = {"raised": None}
except Exception as error:
    outcome = {"raised": type(error).__name__, "message": str(error)}
outcome["seconds"] = time.monotonic() - start
print("OUTCOME " + json.dumps(outcome), flush=True)
"""


def test_wrong_interface_fails_on_every_rank_within_the_timeout(hosts):
    """The store is on eth0 (reachable), but DDPLITE_SOCKET_IFNAME=docker0 makes every rank listen
    where no peer can reach it: each rank raises within the group's timeout, naming the peer it
    could not reach (or that never reached it) with the address, and pointing at DDPLITE_SOCKET_IFNAME."""
    network, timeout = hosts(3), 10
    url = f"tcp://{network.addresses[0]}:{STORE_PORT}"
    env = host_environment("docker0")
    jobs = [start(network.run(rank, [sys.executable, "-c", WRONG_INTERFACE_RANK, url, str(rank), "3", str(timeout)]),
                  env) for rank in range(3)]
    results = finish(jobs, timeout=120)
    bad = [f"{BAD_NET}.{i + 1}" for i in range(3)]
    for rank, (returncode, output, _) in enumerate(results):
        reported = [line for line in output.splitlines() if line.startswith("OUTCOME ")]
        assert reported, f"rank {rank}:\n{output[-5000:]}"
        outcome = json.loads(reported[0][len("OUTCOME "):])
        message = outcome["message"] if outcome["raised"] else ""
        assert outcome["raised"] == "DistBackendError", (rank, outcome, output[-3000:])
        # torch.distributed measures from init_process_group; the group's timeout bounds the set-up
        assert outcome["seconds"] < timeout + 5, (rank, outcome)
        assert "DDPLITE_SOCKET_IFNAME" in message and "Hint:" in message, message
        assert f"listens on {bad[rank]}:" in message or f"listening on {bad[rank]}:" in message, message
        assert "interface docker0 chosen by DDPLITE_SOCKET_IFNAME=docker0" in message, message
        if rank == 0:
            # waits for ranks 1 and 2, and quotes the first one that gave up on it
            # at its deadline, or as soon as a peer's (deadline) failure is recorded, whichever comes first
            assert ": Timed out waiting for rank(s) 1, 2 to connect" in message or \
                ": Gave up waiting for rank(s) 1, 2 to connect: a rank's set-up failed" in message, message
            assert f"could not connect to rank 0 at {bad[0]}:" in message, message
        else:
            # at its own deadline, or quoting a peer's failure recorded a moment earlier
            assert f"rank {rank} could not connect to rank 0 at {bad[0]}:" in message or \
                (f"rank {rank} gave up connecting to rank 0 at {bad[0]}:" in message and
                 "a rank's set-up failed; first failure reported: rank " in message), message
        print(f"rank {rank}: {outcome['seconds']:.1f} s: {message.splitlines()[0]}")
    assert network.pids() == []


HIERARCHY_RANK = """
import json, sys, time
from datetime import timedelta
sys.path.insert(0, sys.argv[5])
import torch, torch.distributed as dist
import torch_ddp_lite, sweeps, shm_workers
url, rank, size, counts = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), json.loads(sys.argv[4])
dtypes = [getattr(torch, name) for name in json.loads(sys.argv[6])] if json.loads(sys.argv[6]) else None
dist.init_process_group("ddplite", init_method=url, rank=rank, world_size=size, timeout=timedelta(seconds=120))
outcome = {"path": list(torch_ddp_lite.cpu_path())}
for late in (size - 1, 0):  # a barrier holds every rank until the last one (on either host) arrives
    started = time.monotonic()
    if rank == late:
        time.sleep(0.5)
    dist.barrier()
    outcome[f"barrier_waited_{late}"] = time.monotonic() - started
for name in ("allreduce", "allreduce_coalesced", "broadcast", "reduce", "allgather", "reduce_scatter", "gather_scatter",
             "alltoall"):
    result = sweeps.SWEEPS[name](rank, size, counts, dtypes)
    outcome[name] = {"failures": result["failures"][:5], "checked": result["checked"]}
# what the flight recorder says ran each collective, at the default choice
import os, pickle, tempfile
probe = torch.ones(2 * size)
dist.all_reduce(probe)
dist.broadcast(probe, src=size - 1)
dist.reduce(probe, dst=size - 1)
dist.all_gather_into_tensor(torch.empty(2 * size), torch.ones(2))
dist.reduce_scatter_tensor(torch.empty(2), torch.ones(2 * size))
dist.gather(torch.ones(2), [torch.empty(2) for _ in range(size)] if rank == size - 1 else None, dst=size - 1)
dist.scatter(torch.empty(2), [torch.ones(2)] * size if rank == 0 else None, src=0)
dist.all_to_all_single(torch.empty(2 * size), torch.ones(2 * size))
dist.barrier()
with open(torch_ddp_lite.dump_flight_recorder(os.path.join(tempfile.mkdtemp(), "trace")), "rb") as dump:
    outcome["recorded"] = [[e["profiling_name"], e["ddplite_algorithm"]] for e in pickle.load(dump)["entries"][-9:]]
big = torch.full((3_000_001,), float(rank + 1))  # several 512 KiB chunks inside each host
dist.all_reduce(big)
outcome["big"] = bool(torch.equal(big, torch.full_like(big, size * (size + 1) / 2)))
rows = 200_003  # blocks of 800 KB: several pieces of a 512 KiB chunk in each host's segment
spread = torch.empty(size * rows)
dist.all_to_all_single(spread, torch.cat([torch.full((rows,), float(rank * size + j)) for j in range(size)]))
outcome["big_alltoall"] = bool(torch.equal(spread, torch.cat([torch.full((rows,), float(j * size + rank))
                                                              for j in range(size)])))
wide = torch.full((3_000_001,), float(rank + 1))  # from the last rank, through every host's segment
dist.broadcast(wide, src=size - 1)
outcome["big_broadcast"] = bool(torch.equal(wide, torch.full_like(wide, float(size))))
# every pair both ways at once, 0 B to several channel rings, then any-source receives
outcome["p2p"] = shm_workers.p2p_through_channels(rank, size, [0, 1, 1000, 300_000])
dist.destroy_process_group()
print("OUTCOME " + json.dumps(outcome), flush=True)
"""


@pytest.mark.parametrize("layout,connect", [([0, 0, 1, 1], "auto"), exhaustive([0, 1, 0], "on_demand"),
                                            ([0, 0, 0, 1], "on_demand"), exhaustive([0, 0, 1, 1], "on_demand"),
                                            ([0, 1, 0, 2, 1, 2, 2], "on_demand"),
                                            exhaustive([host for host in range(8) for _ in range(2)], "auto")],
                         ids=["2+2", "2+1-on-demand", "3+1-on-demand", "2+2-on-demand", "2+2+3-interleaved-on-demand",
                              "8x2"])
def test_hierarchical_collectives_across_hosts(hosts, layout, connect):
    """A group across hosts whose hosts hold several ranks runs all_reduce, broadcast, reduce (from the
    first and last rank), all_gather, reduce_scatter and barrier, and on demand gather and scatter
    (from the first and last rank) too, through shared memory
    inside each host and over TCP between one leader per host (cpu_path says "hierarchical");
    every sweep (closed form and gloo, every dtype and op, each algorithm pinned and the default)
    and a 12 MB all_reduce give exact results; a barrier holds every rank until the last one
    arrives, whichever host it is on. send/recv between the ranks of a host go through
    its channels, across hosts over TCP, all exact. Layout: host of each rank (2+1: ranks 0 and 2
    on host 0, rank 1 alone on host 1). DDPLITE_CONNECT=on_demand: the leaders' and send/recv's
    TCP pairs connect on first use."""
    network = hosts(max(layout) + 1)
    url = f"tcp://{network.addresses[0]}:{STORE_PORT}"
    env = host_environment("eth0", GLOO_SOCKET_IFNAME="eth0", DDPLITE_CONNECT=connect)
    counts = json.dumps([0, 1, 3, 1000])
    # The sweeps' inputs are bounded so that sums are exact up to 5 ranks (tests/workers.py: 8-bit
    # integers and float16); past 8 ranks, float32 sums of them are not exact in every order either,
    # so each summation order rounds its own way (tests/test_many_ranks.py). Past 5 ranks the
    # sweeps keep to dtypes whose sums are exact.
    dtypes = json.dumps(["int32", "float64"] if len(layout) > 5 else None)
    tests_dir = os.path.dirname(os.path.abspath(__file__))
    jobs = [start(network.run(host, [sys.executable, "-c", HIERARCHY_RANK, url, str(rank), str(len(layout)), counts,
                                     tests_dir, dtypes]), env) for rank, host in enumerate(layout)]
    results = finish(jobs, timeout=600)
    groups = {}
    for rank, host in enumerate(layout):
        groups.setdefault(host, []).append(rank)
    expected_layout = f"{len(groups)} hosts: ranks " + " | ".join(",".join(map(str, ranks)) for ranks in groups.values())
    for rank, (returncode, output, _) in enumerate(results):
        reported = [line for line in output.splitlines() if line.startswith("OUTCOME ")]
        assert returncode == 0 and reported, f"rank {rank}:\n{output[-6000:]}"
        outcome = json.loads(reported[0][len("OUTCOME "):])
        path, why = outcome.pop("path")
        assert path == "hierarchical" and expected_layout in why, (path, why)
        p2p = outcome.pop("p2p")
        shares_host = layout.count(layout[rank]) > 1
        assert p2p["path"] == ("shared-memory channels within each host, TCP between hosts" if shares_host
                               else "TCP"), (rank, p2p["path"])
        assert p2p["failures"] == [], (rank, p2p["failures"][:5])
        for late in (len(layout) - 1, 0):
            assert outcome.pop(f"barrier_waited_{late}") >= 0.45, (rank, late)
        recorded = outcome.pop("recorded")
        # gather, scatter and all_to_all go through the leaders when the pairs connect on demand,
        # else direct (all_to_all: pairwise)
        exchanges = ["hierarchical"] * 3 if connect == "on_demand" else ["direct", "direct", "pairwise"]
        assert [algorithm for _, algorithm in recorded] == ["hierarchical"] * 5 + exchanges + ["hierarchical"], \
            recorded
        assert outcome.pop("big") is True
        assert outcome.pop("big_broadcast") is True
        assert outcome.pop("big_alltoall") is True
        for name, result in outcome.items():
            assert result["failures"] == [], (rank, name, result["failures"])
            assert result["checked"] > 0, (rank, name)
    assert network.pids() == []


RAILS_RANK = """
import json, os, pickle, sys, tempfile
from datetime import timedelta
sys.path.insert(0, sys.argv[5])
import torch, torch.distributed as dist
import torch_ddp_lite, sweeps
url, rank, size, counts = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), json.loads(sys.argv[4])
dtypes = [getattr(torch, name) for name in json.loads(sys.argv[6])] if json.loads(sys.argv[6]) else None
dist.init_process_group("ddplite", init_method=url, rank=rank, world_size=size, timeout=timedelta(seconds=120))
outcome = {"path": list(torch_ddp_lite.cpu_path())}
result = sweeps.SWEEPS["allreduce"](rank, size, counts, dtypes)
outcome["allreduce"] = {"failures": result["failures"][:5], "checked": result["checked"]}
# one op, several collectives across hosts (one per dtype): on rails, on the leaders (one element,
# fewer than the rails), on rails again; each rank numbers their wire parts alike
mixed = [torch.full((1001,), float(rank + 1)), torch.full((1,), rank + 1, dtype=torch.int64),
         torch.full((2003,), float(rank + 1), dtype=torch.float64), torch.full((77,), 2 * rank + 1, dtype=torch.int32)]
# torch.distributed.all_reduce_coalesced refuses mixed dtypes; the process group's own call does not
dist.group.WORLD.allreduce_coalesced(mixed, dist.AllreduceCoalescedOptions()).wait()
total = size * (size + 1) // 2
outcome["coalesced"] = [bool(torch.equal(mixed[0], torch.full((1001,), float(total)))),
                        bool(torch.equal(mixed[1], torch.full((1,), total, dtype=torch.int64))),
                        bool(torch.equal(mixed[2], torch.full((2003,), float(total), dtype=torch.float64))),
                        bool(torch.equal(mixed[3], torch.full((77,), size * size, dtype=torch.int32)))]
# several chunks of the segment per part, an odd count; MAX and AVG over rails too
big = torch.arange(3_000_001, dtype=torch.float64) + rank
dist.all_reduce(big)
outcome["big"] = bool(torch.equal(big, torch.arange(3_000_001, dtype=torch.float64) * size + (size - 1) * size / 2))
peak = torch.arange(1_000_003, dtype=torch.float32) * (rank + 1)
dist.all_reduce(peak, op=dist.ReduceOp.MAX)
outcome["max"] = bool(torch.equal(peak, torch.arange(1_000_003, dtype=torch.float32) * size))
mean = torch.full((500_001,), float(rank), dtype=torch.float64)
dist.all_reduce(mean, op=dist.ReduceOp.AVG)
outcome["avg"] = bool(torch.equal(mean, torch.full_like(mean, (size - 1) / 2)))
# what ran them: the flight recorder names the path
probe = torch.ones(size)
dist.all_reduce(probe)
dist.all_reduce(torch.ones(size - 1))  # one element fewer than the most crowded host's ranks... or not
dist.all_reduce(torch.ones(1))
with open(torch_ddp_lite.dump_flight_recorder(os.path.join(tempfile.mkdtemp(), "trace")), "rb") as dump:
    outcome["recorded"] = [e["ddplite_algorithm"] for e in pickle.load(dump)["entries"][-3:]]
dist.destroy_process_group()
print("OUTCOME " + json.dumps(outcome), flush=True)
"""


@pytest.mark.parametrize("layout", [[0, 0, 1, 1], [0, 0, 0, 1], [0, 1, 0, 2, 1, 2, 2]],
                         ids=["2+2", "3+1", "2+2+3-interleaved"])
def test_all_reduce_on_rails_across_hosts(hosts, layout):
    """DDPLITE_RAILS_BYTES=1 puts every all_reduce of at least one element per rail on rails: each
    host reduces through its segment to its ranks' parts, every rank all-reduces its parts over TCP
    with its rail (one rank per host; a host with fewer ranks than the rails gives a rank several,
    3+1: the lone rank carries all three), and each host gathers the parts. Against the closed form
    and gloo (every dtype and op, counts 0, 1, 3, 1000, each algorithm pinned and the default), an
    all_reduce_coalesced of four dtypes in one op (rails, leaders, rails, rails: the wire parts
    must be numbered alike on every rank; through the process group's own allreduce_coalesced,
    since torch.distributed.all_reduce_coalesced refuses mixed dtypes), 3,000,001 float64 (several segment chunks per part),
    MAX and AVG; the flight recorder names "hierarchical-rails" from as many elements as the most
    crowded host holds ranks, "hierarchical" (the leaders) below."""
    network = hosts(max(layout) + 1)
    url = f"tcp://{network.addresses[0]}:{STORE_PORT}"
    env = host_environment("eth0", GLOO_SOCKET_IFNAME="eth0", DDPLITE_RAILS_BYTES="1")
    dtypes = json.dumps(["int32", "float64"] if len(layout) > 5 else None)  # exact sums (see above)
    tests_dir = os.path.dirname(os.path.abspath(__file__))
    jobs = [start(network.run(host, [sys.executable, "-c", RAILS_RANK, url, str(rank), str(len(layout)),
                                     json.dumps([0, 1, 3, 1000]), tests_dir, dtypes]), env)
            for rank, host in enumerate(layout)]
    results = finish(jobs, timeout=600)
    rails = max(layout.count(host) for host in set(layout))
    for rank, (returncode, output, _) in enumerate(results):
        reported = [line for line in output.splitlines() if line.startswith("OUTCOME ")]
        assert returncode == 0 and reported, f"rank {rank}:\n{output[-6000:]}"
        outcome = json.loads(reported[0][len("OUTCOME "):])
        path, why = outcome["path"]
        assert path == "hierarchical" and f"all_reduce from 1 bytes (DDPLITE_RAILS_BYTES) on {rails} rails" in why, why
        assert outcome["allreduce"]["failures"] == [] and outcome["allreduce"]["checked"] > 0, (rank, outcome)
        assert outcome["coalesced"] == [True] * 4, (rank, outcome)
        assert (outcome["big"], outcome["max"], outcome["avg"]) == (True, True, True), (rank, outcome)
        size = len(layout)
        expected = ["hierarchical-rails" if count >= rails else "hierarchical" for count in (size, size - 1, 1)]
        assert outcome["recorded"] == expected, (rank, outcome["recorded"])
    assert network.pids() == []


DETAIL_ACROSS_HOSTS_RANK = """
import json, sys
from datetime import timedelta
import torch, torch.distributed as dist
url, rank, size = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
dist.init_process_group("ddplite", init_method=url, rank=rank, world_size=size, timeout=timedelta(seconds=60))
outcome = {}
try:
    small = torch.full((3,), float(rank + 1))
    dist.all_reduce(small)
    big = torch.full((1_000_001,), float(rank + 1))  # on rails
    dist.all_reduce(big)
    gathered = [torch.empty(2) for _ in range(size)] if rank == 0 else None
    dist.gather(torch.full((2,), float(rank)), gathered, dst=0)
    spread = torch.empty(size)
    dist.all_to_all_single(spread, torch.arange(size, dtype=torch.float32) + 10 * rank)
    total = size * (size + 1) / 2
    outcome["right"] = [bool(torch.equal(small, torch.full((3,), total))), bool(torch.equal(big, torch.full_like(big, total))),
                        gathered is None or [g.tolist() for g in gathered] == [[float(r)] * 2 for r in range(size)],
                        spread.tolist() == [float(rank + 10 * r) for r in range(size)]]
except Exception as error:
    outcome["raised"] = f"{type(error).__name__}: {error}"[:600]
dist.destroy_process_group()
print("OUTCOME " + json.dumps(outcome), flush=True)
"""


@pytest.mark.parametrize("connect", ["at_init", "on_demand"])
def test_argument_check_then_tcp_collectives_across_hosts(hosts, connect):
    """DDPLITE_DEBUG=DETAIL at 2 hosts x 2 ranks: every op first checks its arguments across ranks
    through collectives that the leaders run over TCP and the others inside their segments; the op
    itself may then run over TCP among all ranks (gather and all_to_all direct when the pairs
    connect at init), through the leaders (on demand) or on rails. Each rank numbers the op's wire
    parts alike (HostHierarchy::claimParts); gather at init raised a "collective mismatch" before
    (a leader's part 3 against a non-leader's 1). Results against closed forms."""
    network = hosts(2)
    url = f"tcp://{network.addresses[0]}:{STORE_PORT}"
    env = host_environment("eth0", DDPLITE_DEBUG="DETAIL", DDPLITE_CONNECT=connect, DDPLITE_RAILS_BYTES="1")
    jobs = [start(network.run(host, [sys.executable, "-c", DETAIL_ACROSS_HOSTS_RANK, url, str(rank), "4"]), env)
            for rank, host in enumerate([0, 0, 1, 1])]
    for rank, (returncode, output, _) in enumerate(finish(jobs, timeout=180)):
        reported = [line for line in output.splitlines() if line.startswith("OUTCOME ")]
        assert returncode == 0 and reported, f"rank {rank}:\n{output[-5000:]}"
        outcome = json.loads(reported[0][len("OUTCOME "):])
        assert outcome == {"right": [True] * 4}, (rank, outcome)
    assert network.pids() == []


PLACEMENT_RANK = """
import json, sys
from datetime import timedelta
import torch, torch.distributed as dist
import torch_ddp_lite
url, rank, size = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
dist.init_process_group("ddplite", init_method=url, rank=rank, world_size=size, timeout=timedelta(seconds=120))
outcome = {"path": list(torch_ddp_lite.cpu_path()), "failures": []}
for count in (0, 1, 3, 1000, 70_001):  # 70,001 float64: several 512 KiB chunks per host's slot
    mine = torch.arange(count, dtype=torch.float64) + 1_000_000 * rank
    expected = [torch.arange(count, dtype=torch.float64) + 1_000_000 * r for r in range(size)]
    pieces = [torch.full((count,), -1.0, dtype=torch.float64) for _ in range(size)]
    dist.all_gather(pieces, mine)
    flat = torch.full((size * count,), -1.0, dtype=torch.float64)
    dist.all_gather_into_tensor(flat, mine)
    block = torch.empty(count, dtype=torch.float64)
    dist.reduce_scatter_tensor(block, torch.cat([torch.full((count,), float(r + 1) * (rank + 1), dtype=torch.float64)
                                                 for r in range(size)]))
    for r in range(size):
        if not torch.equal(pieces[r], expected[r]):
            outcome["failures"].append(f"all_gather {count}: block of rank {r}")
        if not torch.equal(flat[r * count:(r + 1) * count], expected[r]):
            outcome["failures"].append(f"all_gather_into_tensor {count}: block of rank {r}")
    if not torch.equal(block, torch.full((count,), float(rank + 1) * size * (size + 1) / 2, dtype=torch.float64)):
        outcome["failures"].append(f"reduce_scatter_tensor {count}")
dist.destroy_process_group()
print("OUTCOME " + json.dumps(outcome), flush=True)
"""


@pytest.mark.parametrize("layout", [[0, 1, 1], [0, 1, 0, 1]], ids=["0_12", "02_13"])
def test_hierarchical_all_gather_places_every_block_in_layouts_that_are_not_host_major(hosts, layout):
    """The hierarchical all_gather stages blocks host-major (a slot of M blocks per host) and then
    puts them in rank order; reduce_scatter stages the same way. In layouts where host-major is not
    rank order (a host with fewer ranks than another first: 0 | 1,2; hosts interleaved: 0,2 | 1,3)
    every block must land in its rank's place (this used to be exercised only by a shrink test),
    at 0, 1, 3, 1000 and 70,001 elements."""
    network = hosts(max(layout) + 1)
    url = f"tcp://{network.addresses[0]}:{STORE_PORT}"
    env = host_environment("eth0")
    jobs = [start(network.run(host, [sys.executable, "-c", PLACEMENT_RANK, url, str(rank), str(len(layout))]), env)
            for rank, host in enumerate(layout)]
    results = finish(jobs, timeout=300)
    for rank, (returncode, output, _) in enumerate(results):
        reported = [line for line in output.splitlines() if line.startswith("OUTCOME ")]
        assert returncode == 0 and reported, f"rank {rank}:\n{output[-6000:]}"
        outcome = json.loads(reported[0][len("OUTCOME "):])
        assert outcome["path"][0] == "hierarchical", outcome["path"]
        assert outcome["failures"] == [], (rank, outcome["failures"][:10])
    assert network.pids() == []


STORE_HOST = """
import sys, time
import torch.distributed as dist
store = dist.TCPStore(sys.argv[1], int(sys.argv[2]), is_master=True, wait_for_workers=False)
print("STORE READY", flush=True)
time.sleep(3600)
"""

KILLED_THEN_SHRUNK_RANK = """
import json, os, signal, sys, time
from datetime import timedelta
import torch, torch.distributed as dist
import torch_ddp_lite
host, port, rank, size, victim = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
store = dist.TCPStore(host, port, is_master=False)  # hosted apart, as torchrun's agent does: it outlives rank 0
dist.init_process_group("ddplite", store=store, rank=rank, world_size=size, timeout=timedelta(seconds=300))
outcome = {"path_before": torch_ddp_lite.cpu_path()[0]}
tensor = torch.ones(4_000_000)
dist.all_reduce(tensor)  # everyone is in, connected and warm
import pickle, tempfile
with open(torch_ddp_lite.dump_flight_recorder(os.path.join(tempfile.mkdtemp(), "trace")), "rb") as dump:
    outcome["algorithm"] = pickle.load(dump)["entries"][-1]["ddplite_algorithm"]  # what the loop runs
if rank == victim:
    os.kill(os.getpid(), signal.SIGKILL)
start = time.monotonic()
try:
    for _ in range(1000):
        dist.all_reduce(tensor)
    outcome.update(raised=None)
except Exception as error:
    outcome.update(raised=type(error).__name__, message=str(error))
outcome["seconds"] = time.monotonic() - start
failed = torch_ddp_lite.failed_ranks(wait=2.0)
outcome["failed"] = failed
dist.shrink_group(failed)
survivors = [r for r in range(size) if r not in failed]
new_rank, new_size = dist.get_rank(), dist.get_world_size()
outcome.update(new_rank=new_rank, new_size=new_size, path_after=list(torch_ddp_lite.cpu_path()))
small = torch.full((1001,), float(rank + 1))
dist.all_reduce(small)
big = torch.full((3_000_001,), float(rank + 1))  # several 512 KiB chunks inside each host
dist.all_reduce(big)
gathered = [torch.zeros(3) for _ in range(new_size)]
dist.all_gather(gathered, torch.full((3,), float(rank)))
root = torch.arange(5.0) * (new_rank + 1)
dist.broadcast(root, src=new_size - 1)
total = float(sum(r + 1 for r in survivors))
outcome["sums"] = [bool(torch.equal(small, torch.full_like(small, total))),
                   bool(torch.equal(big, torch.full_like(big, total)))]
outcome["gathered"] = [g[0].item() for g in gathered]
outcome["broadcast"] = root.tolist()
dist.destroy_process_group()
print("OUTCOME " + json.dumps(outcome), flush=True)
"""


@pytest.mark.parametrize("victim,rails", [(3, True), (2, True), (0, True), (3, False)],
                         ids=["non-leader", "leader", "rank-0", "non-leader-leaders-path"])
def test_rank_killed_across_hosts_is_reported_everywhere_and_the_survivors_shrink(hosts, victim, rails):
    """2 hosts x 2 ranks, a 16 MB all_reduce in a loop, hierarchical: on rails (the default from 2 MiB;
    the flight recorder says "hierarchical-rails"), or through the hosts' leaders (DDPLITE_RAILS_BYTES=0,
    "hierarchical"). Group timeout 300 s, the store hosted apart (as
    torchrun's agent does): kill -9 of a rank (host 1's leader, rank 2; rank 3; or rank 0, the
    leader of the leaders) makes every survivor raise a DistBackendError within seconds, on either
    host (inside a host the segment's liveness probe sees it; across hosts the leaders' TCP
    connections). The survivors agree on [victim] (failed_ranks), shrink_group, and the 3-rank group
    across the 2 hosts is hierarchical again and gives the closed forms of all_reduce (small and 12
    MB), all_gather and broadcast. Nothing is left in /dev/shm."""
    network = hosts(2)
    env = host_environment("eth0", **({} if rails else {"DDPLITE_RAILS_BYTES": "0"}))
    before = {name for name in os.listdir("/dev/shm") if name.startswith("ddplite-")}
    store = start(network.run(0, [sys.executable, "-c", STORE_HOST, network.addresses[0], str(STORE_PORT)]), env)
    try:
        seen = []  # torch may warn first (the namespaces have no host names)
        while not seen or seen[-1] not in ("STORE READY", ""):
            seen.append(store.stdout.readline().strip())
        assert seen[-1] == "STORE READY", seen
        args = [network.addresses[0], str(STORE_PORT)]
        jobs = [start(network.run(host, [sys.executable, "-c", KILLED_THEN_SHRUNK_RANK, *args, str(rank), "4",
                                         str(victim)]), env)
                for rank, host in enumerate([0, 0, 1, 1])]
        results = finish(jobs, timeout=180)
    finally:
        store.kill()
        store.wait()
    survivors = [r for r in range(4) if r != victim]
    new_layout = [host for rank, host in enumerate([0, 0, 1, 1]) if rank != victim]
    for rank, (returncode, output, _) in enumerate(results):
        if rank == victim:
            assert returncode == -signal.SIGKILL, output[-3000:]
            continue
        reported = [line for line in output.splitlines() if line.startswith("OUTCOME ")]
        assert returncode == 0 and reported, f"rank {rank}:\n{output[-5000:]}"
        outcome = json.loads(reported[0][len("OUTCOME "):])
        assert outcome["path_before"] == "hierarchical", outcome
        assert outcome["algorithm"] == ("hierarchical-rails" if rails else "hierarchical"), outcome
        assert outcome["raised"] == "DistBackendError", (rank, outcome)
        assert outcome["seconds"] < 10, (rank, outcome)
        assert f"rank {victim}" in outcome["message"], (rank, outcome["message"])
        assert outcome["failed"] == [victim], (rank, outcome)
        assert (outcome["new_rank"], outcome["new_size"]) == (survivors.index(rank), 3), (rank, outcome)
        path, why = outcome["path_after"]
        hosts_ranks = [[i for i, h in enumerate(new_layout) if h == host] for host in sorted(set(new_layout))]
        expected = "2 hosts: ranks " + " | ".join(",".join(map(str, ranks)) for ranks in hosts_ranks)
        assert path == "hierarchical" and expected in why, (rank, path, why)
        assert outcome["sums"] == [True, True], (rank, outcome)
        assert outcome["gathered"] == [float(r) for r in survivors], (rank, outcome)
        assert outcome["broadcast"] == [3.0 * i for i in range(5)], (rank, outcome)
    assert network.pids() == []
    assert {name for name in os.listdir("/dev/shm") if name.startswith("ddplite-")} <= before


REFUSED_THEN_LATE = """
import json, sys
from datetime import timedelta
sys.path.insert(0, sys.argv[5])
import torch.distributed as dist
import torch_ddp_lite, review_workers
url, rank, size, late = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
dist.init_process_group("ddplite", init_method=url, rank=rank, world_size=size, timeout=timedelta(seconds=60))
outcome = review_workers.refused_then_late_leader(rank, size, late)
outcome["path"] = torch_ddp_lite.cpu_path()[0]
dist.destroy_process_group()
print("OUTCOME " + json.dumps(outcome), flush=True)
"""


def test_refused_call_then_a_late_leader_is_no_mismatch(hosts):
    """2 hosts x 2 ranks, hierarchical: every rank refuses the same call (ValueError), then host
    1's leader (rank 2) enters the next all_reduce half a second late, so host 0's leader's first
    message for it already waits on its socket. That message belongs to the new op, not to the
    refused one: the all_reduce must give the sum on every rank (it raised a collective mismatch
    before the fix)."""
    network = hosts(2)
    url = f"tcp://{network.addresses[0]}:{STORE_PORT}"
    env = host_environment("eth0")
    tests_dir = os.path.dirname(os.path.abspath(__file__))
    jobs = [start(network.run(host, [sys.executable, "-c", REFUSED_THEN_LATE, url, str(rank), "4", "2", tests_dir]),
                  env) for rank, host in enumerate([0, 0, 1, 1])]
    results = finish(jobs, timeout=300)
    for rank, (returncode, output, _) in enumerate(results):
        reported = [line for line in output.splitlines() if line.startswith("OUTCOME ")]
        assert returncode == 0 and reported, f"rank {rank}:\n{output[-5000:]}"
        outcome = json.loads(reported[0][len("OUTCOME "):])
        assert outcome["path"] == "hierarchical", outcome
        assert outcome["refused"][0] == "ValueError", (rank, outcome)
        assert outcome["result"] == ["ok", ""] and outcome["right"], (rank, outcome)
    assert network.pids() == []


LATE_NON_LEADER = """
import json, sys
from datetime import timedelta
sys.path.insert(0, sys.argv[4])
import torch.distributed as dist
import torch_ddp_lite, workers
url, rank, size = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
dist.init_process_group("ddplite", init_method=url, rank=rank, world_size=size, timeout=timedelta(seconds=60))
outcome = workers.sleeps_while_a_peer_is_late(rank, size, 3, 0.005)
outcome["path"] = torch_ddp_lite.cpu_path()[0]
dist.destroy_process_group()
print("OUTCOME " + json.dumps(outcome), flush=True)
"""


@pytest.mark.skipif(not os.path.exists("/proc/thread-self/schedstat"),
                    reason="no /proc/<pid>/task/<tid>/schedstat on this kernel (the thread's run time)")
@pytest.mark.parametrize("caller_spin_us", ["100000", "0"])
def test_blocked_callers_spin_through_a_late_rank_across_hosts(hosts, caller_spin_us):
    """2 hosts x 2 ranks, hierarchical; rank 3 (host 1's non-leader) comes 5 ms late to each of 20
    all_reduces. Every other rank waits for it: rank 2 in host 1's segment, rank 0 (host 0's
    leader) on its socket to rank 2, rank 1 in host 0's segment for its leader's broadcast. Their
    sync ops run on their own threads, which spin up to DDPLITE_CALLER_SPIN_US (always: no trial): with 100 ms they
    run through the wait and do not sleep, with 0 each sleeps (a futex or poll()) once per op. The
    async ops, on the worker, keep the short spin (tests/test_caller_thread.py on one host)."""
    network = hosts(2)
    url = f"tcp://{network.addresses[0]}:{STORE_PORT}"
    env = host_environment("eth0", DDPLITE_CALLER_SPIN_US=caller_spin_us, DDPLITE_CALLER_SPIN_TRIAL="0")
    tests_dir = os.path.dirname(os.path.abspath(__file__))
    jobs = [start(network.run(host, [sys.executable, "-c", LATE_NON_LEADER, url, str(rank), "4", tests_dir]), env)
            for rank, host in enumerate([0, 0, 1, 1])]
    outcomes = []
    for rank, (returncode, output, _) in enumerate(finish(jobs, timeout=300)):
        reported = [line for line in output.splitlines() if line.startswith("OUTCOME ")]
        assert returncode == 0 and reported, f"rank {rank}:\n{output[-5000:]}"
        outcomes.append(json.loads(reported[0][len("OUTCOME "):]))
    for rank, outcome in enumerate(outcomes):
        assert outcome["path"] == "hierarchical" and outcome["right"], (rank, outcome)
    for rank in (0, 1, 2):
        sync, asynchronous = outcomes[rank]["sync"], outcomes[rank]["async"]
        if caller_spin_us == "0":
            assert sync["sleeps"] >= 0.9 and sync["cpu_s"] < 0.001, (rank, sync)
        else:
            assert sync["sleeps"] <= 0.5 and sync["cpu_s"] > 0.0005, (rank, sync)  # 1.9-5.2 ms here, 0.2 without
        assert asynchronous["cpu_s"] < 0.001, (rank, asynchronous)
    assert network.pids() == []


def mismatch_everywhere(results):
    """Each rank's OUTCOME: a DistBackendError saying "collective mismatch" (its own or quoted from
    the first failure), raised within 15 s (the groups' timeout is 60 s)."""
    outcomes = []
    for rank, (_, output, _) in enumerate(results):
        reported = [line for line in output.splitlines() if line.startswith("OUTCOME ")]
        assert reported, f"rank {rank}:\n{output[-5000:]}"
        outcome = json.loads(reported[0][len("OUTCOME "):])
        assert outcome["raised"] == "DistBackendError", (rank, outcome)
        assert "collective mismatch" in outcome["message"], (rank, outcome["message"])
        assert outcome["seconds"] < 15, (rank, outcome)
        outcomes.append(outcome)
    return outcomes


MISMATCHED_RANK = """
import json, sys, time
from datetime import timedelta
import torch, torch.distributed as dist
url, rank, size, odd = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
dist.init_process_group("ddplite", init_method=url, rank=rank, world_size=size, timeout=timedelta(seconds=60))
dist.all_reduce(torch.ones(4))
started = time.monotonic()
try:
    if rank == odd:  # the same bytes as the others' reduce_scatter, another collective
        dist.all_gather_into_tensor(torch.empty(4 * size), torch.ones(4))
    else:
        dist.reduce_scatter_tensor(torch.empty(4), torch.ones(4 * size))
    outcome = {"raised": None}
except Exception as error:
    outcome = {"raised": type(error).__name__, "message": str(error)}
outcome["seconds"] = time.monotonic() - started
print("OUTCOME " + json.dumps(outcome), flush=True)
time.sleep(2)  # rank 0 holds the store, where the others read the first failure of the group
"""


def test_hierarchical_collectives_that_differ_are_a_mismatch_on_every_rank(hosts):
    """2 hosts x 2 ranks: rank 3 (host 1, not its leader) runs all_gather while the others run
    reduce_scatter of the same bytes. Both go hierarchically; host 1's segment sees the two
    collectives meet, and every rank, on either host, raises a DistBackendError within seconds (the
    group's timeout is 60 s) that says "collective mismatch", itself or quoting the first failure."""
    network = hosts(2)
    url = f"tcp://{network.addresses[0]}:{STORE_PORT}"
    jobs = [start(network.run(host, [sys.executable, "-c", MISMATCHED_RANK, url, str(rank), "4", "3"]),
                  host_environment("eth0")) for rank, host in enumerate([0, 0, 1, 1])]
    results = finish(jobs, timeout=120)
    mismatch_everywhere(results)
    assert network.pids() == []


SPLITS_RANK = """
import json, sys, time
from datetime import timedelta
import torch, torch.distributed as dist
url, rank, size, case = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
dist.init_process_group("ddplite", init_method=url, rank=rank, world_size=size, timeout=timedelta(seconds=60))
dist.all_reduce(torch.ones(4))
send = [2] * size  # elements to each rank; rank 0 expects 2 from everyone
if case == "length" and rank == 2:
    send[0] = 3  # host 1 sends host 0 one element more than host 0 expects
if case == "blocks" and rank in (2, 3):
    send[0] = 3 if rank == 2 else 1  # the same total from host 1 to host 0, other blocks
if case == "local" and rank == 1:
    send[0] = 3  # within host 0
recv = [2] * size
started = time.monotonic()
outcome = {"raised": None}
try:
    dist.all_to_all_single(torch.empty(sum(recv)), torch.ones(sum(send)), recv, send)
    dist.barrier()  # a rank whose all_to_all completed learns of the failure here
except Exception as error:
    outcome = {"raised": type(error).__name__, "message": str(error)}
outcome["seconds"] = time.monotonic() - started
print("OUTCOME " + json.dumps(outcome), flush=True)
time.sleep(2)  # rank 0 holds the store, where the others read the first failure of the group
"""


@pytest.mark.parametrize("case", ["length", "blocks", "local"])
def test_hierarchical_all_to_all_with_splits_that_differ_fails_on_every_rank(hosts, case):
    """2 hosts x 2 ranks, connections on demand (all_to_all through the segments, rank 0 and rank 2
    the hosts' proxies for each other): host 1's ranks send rank 0 other block sizes than rank 0's
    output splits expect. "length": the message between the hosts is longer than host 0 expects;
    "blocks": it has the expected length, but ranks 2 and 3 send 3 and 1 elements where 2 and 2
    are expected (the size hash differs). "local": rank 1 sends rank 0, on its host, 3 elements
    (both ranks of host 0 see it in the split sizes they all_gather). Rank 0 raises a collective
    mismatch naming the sizes or the other host's ranks; every
    rank raises a DistBackendError within seconds (the group's timeout is 60 s), in the
    all_to_all or in the barrier after it, itself or quoting the first failure."""
    network = hosts(2)
    url = f"tcp://{network.addresses[0]}:{STORE_PORT}"
    env = host_environment("eth0", DDPLITE_CONNECT="on_demand")
    jobs = [start(network.run(host, [sys.executable, "-c", SPLITS_RANK, url, str(rank), "4", case]), env)
            for rank, host in enumerate([0, 0, 1, 1])]
    results = finish(jobs, timeout=120)
    outcomes = mismatch_everywhere(results)
    leader = outcomes[0]
    if case == "local":
        assert "sends 12 bytes to this rank, which expects 8 [message length: 8 bytes expected here, 12 bytes " \
            "sent by the peer" in leader["message"], leader
        assert "sends 12 bytes to rank 0, which expects 8" in outcomes[1]["message"], outcomes[1]
    elif case == "length":
        assert "message length: 40 bytes expected here, 44 bytes sent by the peer" in leader["message"], leader
    else:
        assert "all_to_all split sizes differ between the ranks of another host (ranks 2,3, through rank 2) and " \
            "the ranks of this one (ranks 0,1)" in leader["message"], leader
    assert network.pids() == []


ALLTOALL_SOCKETS_RANK = """
import json, sys, time
from datetime import timedelta
sys.path.insert(0, sys.argv[4])
import torch, torch.distributed as dist
import scale_workers
url, rank, size = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
dist.init_process_group("ddplite", init_method=url, rank=rank, world_size=size, timeout=timedelta(seconds=120))
store = dist.distributed_c10d._get_default_store()
def store_barrier(key):  # over the store's existing connection: opens no socket
    store.add(key, 1)
    while store.add(key, 0) < size:
        time.sleep(0.01)
store_barrier("count")  # no rank connects to this one (all_to_all) before it has counted
before = scale_workers._own_sockets()
store_barrier("counted")
source = torch.arange(size * 3, dtype=torch.float32) + 100 * rank  # 3 elements for each rank
output = torch.empty(size * 3)
dist.all_to_all_single(output, source)
after = scale_workers._own_sockets()
expected = torch.cat([torch.arange(3 * rank, 3 * rank + 3, dtype=torch.float32) + 100 * peer for peer in range(size)])
# Established sockets that appeared, but the store's: torch may open a store connection of its
# own meanwhile (seen on torch 2.15: rank 0's server accepted one), at either end of it.
store_port = int(url.rsplit(":", 1)[1])
opened = [(local, remote, ip) for inode, (state, local, remote, ip) in after.items()
          if state == "01" and inode not in before]
store_side = [pair for pair in opened if store_port in pair[:2]]
outcome = {"opened": len(opened) - len(store_side), "store_connections": len(store_side), "pairs": opened,
           "listening": sorted(local for state, local, *_ in after.values() if state == "0A"),
           "right": bool(torch.equal(output, expected))}
store_barrier("measured")  # before any rank's barrier: its leaders' connections would count here
dist.barrier()
dist.destroy_process_group()
print("OUTCOME " + json.dumps(outcome), flush=True)
"""


@pytest.mark.parametrize("detail", [False, True], ids=["default", "DETAIL"])
def test_hierarchical_all_to_all_opens_one_socket_per_rank_at_3_hosts_of_2(hosts, detail):
    """3 hosts x 2 ranks, connections on demand: the first collective is an all_to_all. Each host's
    2 ranks share the other 2 hosts between them (one proxy each), so each rank connects to one
    rank of one other host (flat, each rank would connect to its 5 peers); every block lands where
    the closed form says. Under TORCH_DISTRIBUTED_DEBUG=DETAIL the op first checks its arguments
    across ranks through the leaders (which also connect then): rank 0, a leader, and rank 3, not
    one, are each other's proxies, and their messages must still agree on the op's part."""
    network = hosts(3)
    url = f"tcp://{network.addresses[0]}:{STORE_PORT}"
    detail_env = {"TORCH_DISTRIBUTED_DEBUG": "DETAIL", "GLOO_SOCKET_IFNAME": "eth0"} if detail else {}  # torch's wrapper: gloo
    env = host_environment("eth0", DDPLITE_CONNECT="on_demand", **detail_env)
    tests_dir = os.path.dirname(os.path.abspath(__file__))
    layout = [0, 0, 1, 1, 2, 2]
    jobs = [start(network.run(host, [sys.executable, "-c", ALLTOALL_SOCKETS_RANK, url, str(rank), str(len(layout)),
                                     tests_dir]), env) for rank, host in enumerate(layout)]
    results = finish(jobs, timeout=120)
    for rank, (returncode, output, _) in enumerate(results):
        reported = [line for line in output.splitlines() if line.startswith("OUTCOME ")]
        assert returncode == 0 and reported, f"rank {rank}:\n{output[-5000:]}"
        outcome = json.loads(reported[0][len("OUTCOME "):])
        assert outcome["right"], (rank, outcome)
        if not detail:
            assert outcome["opened"] == 1, (rank, outcome)
    assert network.pids() == []


STRAGGLER_RANK = """
import json, sys
from datetime import timedelta
import torch.distributed as dist
sys.path.insert(0, "tests")
import straggler_workers
url, rank, size, slow = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
dist.init_process_group("ddplite", init_method=url, rank=rank, world_size=size, timeout=timedelta(seconds=120))
tables = straggler_workers.ddp_with_a_slow_rank(rank, size, slow, 20, straggler_workers.STEP_S, 1.3)
dist.destroy_process_group()
print("OUTCOME " + json.dumps({str(step): table for step, table in tables.items()}), flush=True)
"""


@pytest.mark.parametrize("slow", [3, 0], ids=["non-leader", "rank-0"])
def test_stragglers_name_a_slow_rank_across_hosts(hosts, slow):
    """A DDP job at 2 hosts x 2 ranks (hierarchical) in which one rank sleeps 30% longer per step:
    torch_ddp_lite.stragglers() names it first on every rank within 20 steps, from each rank's own
    clock only (the namespaces share one clock here; tests/test_stragglers.py gives the ledgers
    unrelated clocks)."""
    network = hosts(2)
    url = f"tcp://{network.addresses[0]}:{STORE_PORT}"
    env = host_environment("eth0")
    jobs = [start(network.run(host, [sys.executable, "-c", STRAGGLER_RANK, url, str(rank), "4", str(slow)]), env)
            for rank, host in enumerate([0, 0, 1, 1])]
    for rank, (returncode, output, _) in enumerate(finish(jobs, timeout=180)):
        reported = [line for line in output.splitlines() if line.startswith("OUTCOME ")]
        assert returncode == 0 and reported, f"rank {rank}:\n{output[-5000:]}"
        tables = json.loads(reported[0][len("OUTCOME "):])
        rows = tables["20"]["rows"]
        assert rows[0][0] == slow and 0.55 < rows[0][2] < 0.92, (rank, tables["20"]["text"])
        assert all(row[2] > rows[0][2] for row in rows[1:]), tables["20"]["text"]
        assert tables["10"]["rows"][0][0] == slow, tables["10"]["text"]
    assert network.pids() == []


def test_status_across_hosts_names_a_stopped_rank(hosts, tmp_path):
    """python -m torch_ddp_lite.status, run on host 1, against a hierarchical job at 2 hosts x 2
    ranks (tests/status_job.py) in which rank 3 is stopped with SIGSTOP: the other ranks answer
    from their hosts' addresses, rank 3 is named not answering, and the all_reduce the others wait
    in names it as the one not arrived; after SIGCONT the job ends cleanly."""
    network = hosts(2)
    stop_file = str(tmp_path / "stop")
    env = host_environment("eth0", MASTER_ADDR=network.addresses[0], MASTER_PORT=str(STORE_PORT), WORLD_SIZE="4")
    layout = [0, 0, 1, 1]
    jobs = [start(network.run(host, [sys.executable, "tests/status_job.py", stop_file]),
                  {**env, "RANK": str(rank), "LOCAL_RANK": str(rank % 2)}) for rank, host in enumerate(layout)]
    try:
        pids = {}
        for rank, job in enumerate(jobs):
            for line in job.stdout:
                if line.startswith("READY "):
                    pids[rank] = int(line.split()[2])
                    break
            assert rank in pids, f"rank {rank} ended before it was ready"
        os.kill(pids[3], signal.SIGSTOP)
        try:
            time.sleep(1.5)
            done = subprocess.run(network.run(1, [sys.executable, "-m", "torch_ddp_lite.status",
                                                  f"{network.addresses[0]}:{STORE_PORT}", "--json"]),
                                  capture_output=True, text=True, timeout=60, cwd=REPO, env=rank_environment())
            assert done.returncode == 0, done.stderr[-3000:]
            report = json.loads(done.stdout)
        finally:
            os.kill(pids[3], signal.SIGCONT)
        assert report["took_s"] < 2.0, report["took_s"]
        for rank, entry in enumerate(report["ranks"]):
            if rank == 3:
                assert entry["outcome"] == "not answering", entry
                continue
            assert entry["outcome"] == "answered", entry
            assert entry["address"].startswith(network.addresses[layout[rank]] + ":"), entry
            (group,) = entry["state"]["groups"]
            assert group["transport"] == "hierarchical" and group["running"]["op"] == "allreduce", group
        assert report["stalled"]["not_arrived"] == [3], report["stalled"]
        open(stop_file, "w").close()
        for rank, (returncode, output, _) in enumerate(finish(jobs, timeout=120)):
            assert returncode == 0 and output.strip().endswith("DONE ok"), f"rank {rank}:\n{output[-3000:]}"
    finally:
        for job in jobs:
            if job.poll() is None:
                os.killpg(job.pid, signal.SIGKILL)
    assert network.pids() == []
