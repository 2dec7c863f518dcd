"""Authenticated connections: the handshake's HMAC against Python's; a mesh whose rank 0
listens while strangers connect to it, send garbage, an HTTP request or a replayed handshake, or
connect and say nothing, and whose rank 1 starts only then (rank 0's log must name each stranger,
and the mesh must come up); and a whole 2-rank job under attack on every port it opens.

The mesh test runs the real set-up code alone (exchange_ranks_over_new_mesh) through a store this
test hosts, so that the strangers are certain to come first: in a whole job the ranks agree on
their settings through the store before any of them listens, so the window is short.
"""

import hashlib
import hmac
import os
import random
import socket
import struct
import subprocess
import sys
import time
from datetime import timedelta

import pytest
import torch.distributed as dist

import torch_ddp_lite

EXT = torch_ddp_lite._load_extension()
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
JOB = os.path.join(REPO, "tests", "auth_job.py")
MESH_RANK = os.path.join(REPO, "tests", "mesh_rank.py")
HELLO_MAGIC, AUTH_HELLO_MAGIC, CHALLENGE_MAGIC = 0xDD911E01, 0xDD911E02, 0xDD911E03
CHALLENGE_BYTES = 20  # magic + 16-byte nonce


def test_hmac_sha256_matches_python_across_block_boundaries():
    rng = random.Random(7)
    for key_bytes in (0, 1, 32, 63, 64, 65, 200):
        for message_bytes in (0, 1, 55, 56, 63, 64, 65, 119, 120, 1000):
            key, message = rng.randbytes(key_bytes), rng.randbytes(message_bytes)
            assert EXT.hmac_sha256(key, message) == hmac.new(key, message, hashlib.sha256).digest(), (key_bytes,
                                                                                                      message_bytes)


def free_port():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def start(script, *arguments, env=None):
    return subprocess.Popen([sys.executable, script, *map(str, arguments)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=dict(os.environ, **(env or {})), cwd=REPO)


def start_job_rank(rank, port, env):
    """A rank of a whole job under torchrun's convention: the test hosts the store, as the agent does."""
    return start(JOB, env=dict(env, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE="2",
                               TORCHELASTIC_USE_AGENT_STORE="True"))


def host_store():
    return dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=60))


def default_group_keys(store):
    """The store as the default group's ddplite backend sees it (torch's prefixes, then ddplite's
    own for the first run on a store; ddplite's keys start with ddplite/)."""
    view = store
    for prefix in ("default_pg", "0/", "cpu/", "ddplite/size2/run0"):
        view = dist.PrefixStore(prefix, view)
    return view


def wait_for_key(store, key, seconds):
    until = time.monotonic() + seconds
    while time.monotonic() < until:
        if store.check([key]):
            return store.get(key).decode()
        time.sleep(0.02)
    raise AssertionError(f"the job never published {key!r} (did torch change its store prefixes?)")


def connect(address):
    host, port = address.rsplit(":", 1)
    connection = socket.create_connection((host, int(port)), timeout=10)
    return connection, "%s:%d" % connection.getsockname()


def replayed_hello(address, secret):
    """A Hello whose MAC is right, but for another connection's challenge (what a captured and
    replayed handshake looks like to the listener). Returns (connection it was sent on, its address)."""
    first, _ = connect(address)
    second, name = connect(address)
    challenges = [struct.unpack("<I16s", conn.recv(CHALLENGE_BYTES, socket.MSG_WAITALL)) for conn in (first, second)]
    assert all(magic == CHALLENGE_MAGIC for magic, _ in challenges), challenges
    nonce = os.urandom(16)
    mac = hmac.new(secret.encode(), b"ddplite-hello" + challenges[0][1] + struct.pack("<ii", 1, 2) + nonce,
                   hashlib.sha256).digest()
    second.sendall(struct.pack("<Iii16s32s", AUTH_HELLO_MAGIC, 1, 2, nonce, mac))
    first.close()
    return second, name


def attack(address, secret, rng):
    """Connections a stranger makes to `address`: (socket, its address, kind); the sockets stay open."""
    made = []
    for _ in range(3):
        made.append((*connect(address), "silent"))
    for _ in range(4):
        connection, name = connect(address)
        connection.sendall(rng.randbytes(rng.randint(1, 400)))
        made.append((connection, name, "garbage"))
    connection, name = connect(address)
    connection.sendall(b"GET / HTTP/1.1\r\nHost: ddplite\r\n\r\n")
    made.append((connection, name, "http"))
    if secret is not None:
        made.append((*replayed_hello(address, secret), "replay"))
    return made


def closed_by_peer(connection, seconds):
    connection.settimeout(seconds)
    try:
        while True:
            chunk = connection.recv(4096)
            if not chunk:
                return True
    except (socket.timeout, ConnectionResetError):
        return False


def finish(processes, seconds):
    try:
        return [process.communicate(timeout=seconds) for process in processes]
    finally:
        for process in processes:
            if process.poll() is None:
                process.kill()
                process.wait()


@pytest.mark.parametrize("auth", ["1", "0"])
def test_strangers_on_the_listener_hold_up_nothing_and_are_named(auth):
    store = host_store()
    env = {"DDPLITE_AUTH": auth}
    ranks = [start(MESH_RANK, store.port, 0, 2, env=env)]
    strangers = []
    try:
        address = wait_for_key(store, "ddplite/mesh-check/addr/0", 60)
        secret = wait_for_key(store, "ddplite/mesh-check/auth/secret", 5) if auth == "1" else None
        strangers = attack(address, secret, random.Random(3))
        if secret is not None:
            replay = next(connection for connection, _, kind in strangers if kind == "replay")
            assert closed_by_peer(replay, 10), "the replayed handshake was not dropped"
        ranks.append(start(MESH_RANK, store.port, 1, 2, env=env))
        outputs = finish(ranks, 60)
    finally:
        for connection, _, _ in strangers:
            connection.close()
        finish(ranks, 10)
    assert [out.split() for out, _ in outputs] == [["MESH", "0", "1"], ["MESH", "0", "1"]], outputs
    log = outputs[0][1]
    for _, name, kind in strangers:
        assert f"dropped a connection from {name}" in log, f"the {kind} stranger {name} is not named:\n{log[-4000:]}"
    if secret is not None:
        assert "does not prove it holds the group's secret" in log, log[-4000:]


def keep_attacking(keys, stop, made):
    """Connects to every port the job publishes, again and again, until `stop` is set."""
    rng = random.Random(5)
    while not stop.is_set():
        for mesh in ("", "p2p/"):
            key = f"ddplite/{mesh}addr/0"
            if not keys.check([key]):
                continue
            try:
                made += attack(keys.get(key).decode(), None, rng)
            except OSError:
                pass  # that mesh's set-up is over: its listener is closed
        time.sleep(0.05)


@pytest.mark.parametrize("transport", ["auto", "tcp", "tcp-on-demand"])
def test_whole_job_under_attack_starts_and_computes(transport):
    """Both meshes of a job (collectives', and send/recv's when pinned to TCP) are attacked from
    the moment their address is published; the job must start and give closed-form results. On
    demand the listeners stay open for the whole job, so the attack goes on while it computes."""
    import threading

    store = host_store()
    keys = default_group_keys(store)
    stop, made = threading.Event(), []
    attacker = threading.Thread(target=keep_attacking, args=(keys, stop, made), daemon=True)
    attacker.start()
    try:
        env = {"DDPLITE_CPU_TRANSPORT": "tcp", "DDPLITE_CONNECT": "on_demand"} if transport == "tcp-on-demand" \
            else {"DDPLITE_CPU_TRANSPORT": transport}
        ranks = [start_job_rank(rank, store.port, env) for rank in (0, 1)]
        outputs = finish(ranks, 120)
    finally:
        stop.set()
        attacker.join(10)
        for connection, _, _ in made:
            connection.close()
    for index, (rank, (out, err)) in enumerate(zip(ranks, outputs)):
        assert rank.returncode == 0 and "RESULT ok 5" in out, f"rank {index} failed:\n{out}\n{err[-4000:]}"


def _key_file(folder, name, key):
    path = os.path.join(folder, name)
    with open(path, "wb") as handle:
        handle.write(key)
    os.chmod(path, 0o600)
    return path


@pytest.mark.parametrize("transport", ["shm", "tcp"])
def test_key_file_keeps_the_secret_out_of_the_store(transport, tmp_path):
    """DDPLITE_AUTH_KEY_FILE on every rank: the job runs, and the store holds neither the key nor
    a secret that lets its readers join: only 'external <salt> <check>' (docs/security.md)."""
    import review_workers
    from harness import run_ranks

    key = os.urandom(32)
    path = _key_file(str(tmp_path), "key", key + b"\n")
    env = {"DDPLITE_CPU_TRANSPORT": transport} if transport == "tcp" else {}
    results = run_ranks(review_workers.job_with_key_file, 2, str(tmp_path / "store"), [path, path], backend=None,
                        env=env)
    for rank, result in enumerate(results):
        assert "error" not in result, result.get("error")
        assert result["sum"] == [3.0] * 5
    store = results[0]["store"]
    assert key not in store and key.hex().encode() not in store
    assert b"external " in store
    # the store's values: no 64-hex-digit secret follows any auth/secret key
    assert not any(len(word) == 64 for word in store.split(b"external ")[0].split() if b"secret" in word)


@pytest.mark.parametrize("case", ["other key", "no key on rank 1", "no key on rank 0"])
def test_ranks_that_disagree_about_the_key_fail_at_once_and_say_so(case, tmp_path):
    import review_workers
    from harness import run_ranks

    mine = _key_file(str(tmp_path), "mine", os.urandom(32))
    other = _key_file(str(tmp_path), "other", os.urandom(32))
    keys = {"other key": [mine, other], "no key on rank 1": [mine, None], "no key on rank 0": [None, mine]}[case]
    started = time.monotonic()
    # Rank 0 learns of the disagreement only when its group's timeout (8 s here) ends its wait for
    # rank 1; rank 1's error, the one checked, comes at once.
    results = run_ranks(review_workers.job_with_key_file, 2, str(tmp_path / "store"), keys, 8, backend=None,
                        timeout_s=120)
    expected = {"other key": "holds another key than rank 0's",
                "no key on rank 1": "rank 0 authenticates connections with a key from DDPLITE_AUTH_KEY_FILE; rank 1 has none",
                "no key on rank 0": "but rank 0 has none"}[case]
    kind, message = results[1]["error"]
    assert kind == "DistBackendError" and expected in message, results[1]["error"]
    assert results[1]["failed_after_s"] < 6, results[1]  # at once, not at its 8 s timeout
    assert time.monotonic() - started < 60  # rank 0 fails when its timeout ends its wait for rank 1


def test_a_short_key_file_is_refused(tmp_path):
    import review_workers
    from harness import run_ranks

    short = _key_file(str(tmp_path), "short", b"0123456789")
    results = run_ranks(review_workers.job_with_key_file, 2, str(tmp_path / "store"), [short, short], backend=None)
    for result in results:
        kind, message = result["error"]
        assert kind == "DistBackendError" and "holds 10 bytes; a key needs at least 16" in message, result["error"]


@pytest.mark.parametrize("churn", [False, True], ids=["reconnect-when-dropped", "churning"])
def test_silent_strangers_on_demand_hold_at_most_64_descriptors_per_listener_and_the_job_computes(churn):
    """A 24-rank job connecting on demand over TCP; 200 silent connections to each
    listener of ranks 0 and 11 (collectives' and send/recv meshes, live status), each reopened as soon as it is
    dropped (churning: each also closes itself within 0.5 s and reconnects, so every slot stays
    young), while every pair connects (all_to_all) and computes. An attacked rank's descriptors
    grow by at most 64 per listener plus one socket per peer (the cap was P + 64 per listener);
    every value is the closed form, and the ranks' own connects get in within seconds: neither a
    chain of evictions nor slots kept full locks them out."""
    import scale_workers
    from harness import run_ranks

    world_size, attacked, per_listener = 24, [0, 11], 200
    env = {"DDPLITE_CPU_TRANSPORT": "tcp", "DDPLITE_CONNECT": "on_demand"}
    results = run_ranks(scale_workers.silent_connections_during_the_job, world_size, attacked, per_listener, churn,
                        env=env, pg_timeout_s=60, timeout_s=400)
    assert all(outcome["right"] for outcome in results), results
    slowest = max(outcome["seconds"] for outcome in results)
    assert slowest < 20, slowest  # 3 rounds of all_to_all + all_reduce; a locked-out connect waits 60 s
    # the status query, asked under the attack, is answered by every rank within its 1.5 s
    assert results[1]["status"]["outcomes"] == ["answered"] * world_size, results[1]["status"]
    assert results[1]["status"]["took_s"] < 2.0, results[1]["status"]
    for rank in attacked:
        outcome = results[rank]
        assert outcome["listeners"] == 3, outcome  # two meshes and the live status listener

        grown = outcome["peak"] - outcome["before"]
        assert grown <= 64 * outcome["listeners"] + (world_size - 1), (rank, grown, outcome)
        assert grown >= 64, (rank, grown, outcome)  # the strangers did land: the test measures something
        print(f"rank {rank}: {outcome['before']} descriptors before the attack, {outcome['peak']} at its peak "
              f"({per_listener} strangers on each of its {outcome['listeners']} listeners); the job's ops under "
              f"the attack took at most {slowest:.1f} s")


@pytest.mark.parametrize("connect", ["at_init", "on_demand"])
def test_without_authentication_every_rank_warns_who_can_take_its_place_and_when(connect):
    """DDPLITE_AUTH=0 lets anyone who reaches a listener take a rank's place; at
    init only during set-up, on demand for the whole job (a pair's first hello wins). Every rank
    says which, once per kind of mesh; the job computes."""
    store = host_store()
    env = {"DDPLITE_AUTH": "0", "DDPLITE_CPU_TRANSPORT": "tcp", "DDPLITE_CONNECT": connect}
    ranks = [start_job_rank(rank, store.port, env) for rank in (0, 1)]
    for index, (rank, (out, err)) in enumerate(zip(ranks, finish(ranks, 120))):
        assert rank.returncode == 0 and "RESULT ok 5" in out, f"rank {index} failed:\n{out}\n{err[-4000:]}"
        warnings = [line for line in err.splitlines() if "DDPLITE_AUTH=0: ddplite's TCP connections are not" in line]
        assert len(warnings) == 1, (index, warnings)  # two meshes (collectives', send/recv's), one warning
        if connect == "on_demand":
            assert "for the rest of the job" in warnings[0] and "the real rank r is refused" in warnings[0], warnings
        else:
            assert "during set-up" in warnings[0] and "rest of the job" not in warnings[0], warnings
