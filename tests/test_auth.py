"""Authenticated connections (issue 13): the handshake's HMAC against Python's; a mesh whose rank 0
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


@pytest.mark.parametrize("transport", ["auto", "tcp"])
def test_whole_job_under_attack_starts_and_computes(transport):
    """Both meshes of a job (collectives', and send/recv's when pinned to TCP) are attacked from
    the moment their address is published; the job must start and give closed-form results."""
    import threading

    store = host_store()
    keys = default_group_keys(store)
    stop, made = threading.Event(), []
    attacker = threading.Thread(target=keep_attacking, args=(keys, stop, made), daemon=True)
    attacker.start()
    try:
        ranks = [start_job_rank(rank, store.port, {"DDPLITE_CPU_TRANSPORT": transport}) for rank in (0, 1)]
        outputs = finish(ranks, 120)
    finally:
        stop.set()
        attacker.join(10)
        for connection, _, _ in made:
            connection.close()
    for index, (rank, (out, err)) in enumerate(zip(ranks, outputs)):
        assert rank.returncode == 0 and "RESULT ok 5" in out, f"rank {index} failed:\n{out}\n{err[-4000:]}"
