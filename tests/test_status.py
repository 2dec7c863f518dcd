"""python -m torch_ddp_lite.status against real jobs (tests/status_job.py, one process per rank,
env:// rendezvous): every rank named with what it does; a rank stopped with SIGSTOP in a 16-rank
job named as not answering, with the op and sequence number the others wait in, within 2 s of
asking; a rank killed with SIGKILL named dead; a stranger without the secret or the key answered
nothing, and the job unharmed. The straggler table it prints is torch_ddp_lite.stragglers()'s
(tests/test_stragglers.py)."""

import hashlib
import hmac
import json
import os
import signal
import socket
import struct
import subprocess
import threading
import sys
import time

import pytest

from torch_ddp_lite import status

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
JOB = os.path.join(REPO, "tests", "status_job.py")


def _free_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class Job:
    """`size` ranks of status_job.py; stop() makes them leave their loop and waits for them."""

    def __init__(self, tmp_path, size, slow_rank=-1, **env):
        self.port = _free_port()
        self.stop_file = str(tmp_path / "stop")
        self.size = size
        base = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(self.port), "WORLD_SIZE": str(size),
                "PYTHONPATH": os.pathsep.join(filter(None, [REPO, os.environ.get("PYTHONPATH")])), **env}
        self.processes = [subprocess.Popen([sys.executable, JOB, self.stop_file, str(slow_rank)],
                                           env={**base, "RANK": str(rank), "LOCAL_RANK": str(rank)},
                                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
                          for rank in range(size)]
        self.pids = {}
        deadline = time.monotonic() + 180
        for rank, process in enumerate(self.processes):
            while True:
                line = process.stdout.readline()
                assert line, f"rank {rank} ended before it was ready"
                if line.startswith("READY "):
                    self.pids[rank] = int(line.split()[2])
                    break
                assert time.monotonic() < deadline, "the job did not start within 180 s"

    @property
    def store(self):
        return f"127.0.0.1:{self.port}"

    def stop(self, timeout=120):
        open(self.stop_file, "w").close()
        outputs = []
        for process in self.processes:
            try:
                outputs.append(process.communicate(timeout=timeout)[0])
            except subprocess.TimeoutExpired:
                process.kill()
                outputs.append(process.communicate()[0] + "\n(killed: did not end)")
        return outputs

    def kill(self):
        for process in self.processes:
            if process.poll() is None:
                try:
                    os.kill(process.pid, signal.SIGCONT)
                except ProcessLookupError:
                    pass
                process.kill()
                process.wait()


def run_status(store, *args, env=None):
    """The tool as a user runs it: (exit code, stdout, stderr, seconds)."""
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "torch_ddp_lite.status", store, *args], capture_output=True,
                          text=True, timeout=60, cwd=REPO, env=env)
    return done.returncode, done.stdout, done.stderr, time.monotonic() - started


def without_torch(tmp_path):
    """An environment in which `import torch` raises: the tool must not need it (it would spend
    about 2.5 s of its 2 s importing it)."""
    fake = tmp_path / "no-torch" / "torch"
    fake.mkdir(parents=True, exist_ok=True)
    (fake / "__init__.py").write_text("raise ImportError('the status tool imported torch')\n")
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(fake.parent), REPO])}


@pytest.fixture
def jobs():
    started = []
    yield lambda *args, **kwargs: started.append(Job(*args, **kwargs)) or started[-1]
    for job in started:
        job.kill()


@pytest.mark.parametrize("transport", ["shm", "tcp"])
def test_every_rank_answers_with_what_it_does(jobs, tmp_path, transport):
    job = jobs(tmp_path, 4, slow_rank=2, DDPLITE_CPU_TRANSPORT=transport)
    time.sleep(1.5)  # about 100 steps: the straggler table has something to score
    code, out, err, _ = run_status(job.store, "--json", env=without_torch(tmp_path))
    assert code == 0, err
    report = json.loads(out)
    assert report["size"] == 4 and report["took_s"] < 2.0
    for rank, entry in enumerate(report["ranks"]):
        assert entry["outcome"] == "answered" and entry["pid"] == job.pids[rank], entry
        (group,) = entry["state"]["groups"]
        assert group["name"] == "0" and group["rank"] == rank and group["size"] == 4
        assert group["transport"] == transport and group["broken"] == ""
        assert group["last"]["op"] == "allreduce" and group["last"]["seq"] > 4  # 3 all_reduce + barrier, then the loop
        assert group["issued"] >= group["last"]["seq"]
    assert report["stragglers"][0]["rank"] == 2, report["stragglers"]
    assert report["stalled"] is None, report["stalled"]  # ranks in different ops of a running job are not a stall
    code, text, err, _ = run_status(job.store)
    assert code == 0, err
    lines = text.splitlines()
    assert lines[0].startswith("4 ranks, asked in ")
    for rank in range(4):
        assert any(line.startswith(f"rank   {rank}  ") and f"pid {job.pids[rank]}" in line
                   and "last completed allreduce #" in line for line in lines), text
    assert "stragglers (default group, answering ranks):" in lines
    assert all(output.strip().endswith("DONE ok") for output in job.stop())


def test_a_stopped_rank_in_16_is_named_with_the_op_the_others_wait_in(jobs, tmp_path):
    job = jobs(tmp_path, 16)
    victim = 11
    os.kill(job.pids[victim], signal.SIGSTOP)
    try:
        time.sleep(1.2)  # the others reach the next all_reduce and wait there (stalled: 1 s or more)
        code, out, err, seconds = run_status(job.store, "--json")
        assert code == 0, err
        report = json.loads(out)
        assert report["took_s"] < 2.0, report["took_s"]
        # The command from its start: 1.6 s here (scripts/status_at_scale.py, docs/observability.md);
        # the margin is for a loaded machine: a tool that imported torch again would take 4 s or more
        assert seconds < 3.0, seconds
        stopped = report["ranks"][victim]
        assert stopped["outcome"] == "not answering" and "stopped (SIGSTOP)" in stopped["detail"], stopped
        stalled = report["stalled"]
        assert stalled["op"] == "allreduce" and stalled["not_arrived"] == [victim], stalled
        for rank, entry in enumerate(report["ranks"]):
            if rank != victim:
                running = entry["state"]["groups"][0]["running"]
                assert running["op"] == "allreduce" and running["seq"] == stalled["seq"], (rank, entry)
        code, text, err, _ = run_status(job.store)
        assert f"rank  {victim}" in text and "NOT ANSWERING: process" in text and "stopped (SIGSTOP)" in text, text
        assert f"allreduce #{stalled['seq']}: 15 of 16 ranks arrived" in text and f"not arrived: rank {victim}" in text
    finally:
        os.kill(job.pids[victim], signal.SIGCONT)
    assert all(output.strip().endswith("DONE ok") for output in job.stop()), "the job goes on after SIGCONT"


def test_processes_whose_first_groups_are_disjoint_are_all_asked(jobs, tmp_path):
    # gloo's default group of 4, then ddplite groups {0, 1} and {2, 3}: each process's first ddplite
    # group is its half, and every process publishes the world's size, 4 (rank 0 alone wrote its
    # group's size, 2, and ranks 2 and 3 went unasked)
    job = jobs(tmp_path, 4, JOB_HALVES="1")
    code, out, err, _ = run_status(job.store, "--json")
    assert code == 0, err
    report = json.loads(out)
    assert report["size"] == 4, report
    names = set()
    for rank, entry in enumerate(report["ranks"]):
        assert entry["outcome"] == "answered" and entry["pid"] == job.pids[rank], entry
        (group,) = entry["state"]["groups"]
        assert group["rank"] == rank % 2 and group["size"] == 2, (rank, group)
        names.add((rank // 2, group["name"]))
    assert len(names) == 2 and len({name for _, name in names}) == 2, names  # a group for each half
    os.kill(job.pids[3], signal.SIGSTOP)  # rank 2 waits for it in its group; rank 0's group runs on
    try:
        time.sleep(1.2)
        code, out, err, _ = run_status(job.store, "--json", env=without_torch(tmp_path))
        assert code == 0, err
        stalled = json.loads(out)["stalled"]
        assert stalled["op"] == "allreduce" and stalled["arrived"] == [2] and stalled["not_arrived"] == [3], stalled
        assert stalled["ranks"] == 2, stalled
        code, text, err, _ = run_status(job.store, env=without_torch(tmp_path))
        assert code == 0 and f"allreduce #{stalled['seq']}: 1 of 2 ranks arrived" in text, (text, err)
    finally:
        os.kill(job.pids[3], signal.SIGCONT)
    assert all(output.strip().endswith("DONE ok") for output in job.stop())


def test_a_killed_rank_is_named_dead(jobs, tmp_path):
    job = jobs(tmp_path, 4, DDPLITE_CPU_TRANSPORT="tcp", JOB_TIMEOUT_S="30")
    victim = 2
    os.kill(job.pids[victim], signal.SIGKILL)
    job.processes[victim].wait()
    time.sleep(0.5)
    code, out, err, _ = run_status(job.store, "--json")
    assert code == 0, err
    report = json.loads(out)
    dead = report["ranks"][victim]
    assert dead["outcome"] == "dead", dead
    assert f"process {job.pids[victim]} is gone" in dead["detail"] or "nothing listens" in dead["detail"], dead
    for rank, entry in enumerate(report["ranks"]):
        if rank != victim:
            assert entry["outcome"] == "answered", entry
    outputs = job.stop()
    for rank, output in enumerate(outputs):
        if rank != victim:
            assert "RAISED" in output and output.strip().endswith("DONE DistBackendError"), output[-2000:]


def _greeting(address):
    host, _, port = address.rpartition(":")
    sock = socket.create_connection((host, int(port)), timeout=5)
    data = b""
    while len(data) < 24:
        data += sock.recv(24 - len(data))
    return sock, data


def _proof(secret, address, greeting):
    return hmac.new(secret, b"ddplite-status|" + address.encode() + b"|" + greeting[8:], hashlib.sha256).digest()


def _answered(sock):
    """Whether an answer's length came (not the refusal marker, not a close)."""
    sock.settimeout(3)
    try:
        length = sock.recv(4)
    except (socket.timeout, ConnectionResetError):
        return False
    return len(length) == 4 and length != struct.pack(">I", status.REFUSED_LENGTH)


def _asked_with(address, make_proof):
    """Whether the listener at `address` answers a proof made by make_proof(greeting)."""
    sock, greeting = _greeting(address)
    try:
        sock.sendall(make_proof(greeting))
        return _answered(sock)
    finally:
        sock.close()


def test_a_stranger_without_the_secret_gets_nothing(jobs, tmp_path):
    job = jobs(tmp_path, 2)
    store = status.open_store(job.store)
    address = store.get("ddplite/status/rank/1").decode().split()[0]
    secret = store.get("ddplite/status/auth/1")
    assert len(secret) == 64  # the default: a secret of its own in the store
    # the right proof is answered (so that the refusals below are refusals)
    assert _asked_with(address, lambda greeting: _proof(secret, address, greeting))
    assert not _asked_with(address, lambda greeting: _proof(b"not the secret", address, greeting))
    assert not _asked_with(address, lambda greeting: b"GET / HTTP/1.0\r\n\r\n" + bytes(14))
    # rank 0's secret does not open rank 1
    assert not _asked_with(address, lambda greeting: _proof(store.get("ddplite/status/auth/0"), address, greeting))
    # a proof made for another address (a relay that rewrote the store) proves nothing here
    assert not _asked_with(address, lambda greeting: _proof(secret, "10.9.9.9:1", greeting))
    # nor a proof replayed from another connection: the nonce differs
    first, greeting = _greeting(address)
    replayed = _proof(secret, address, greeting)
    first.close()
    assert not _asked_with(address, lambda greeting: replayed)
    # the tool with a wrong secret is told so at once (the refusal marker), not after its timeout
    started = time.monotonic()
    assert status.ask(address, b"not the secret", timeout_s=5.0)[0] == "refused"
    assert time.monotonic() - started < 2.0
    # strangers that connect and say nothing delay no query
    silent = [socket.create_connection(tuple([address.rpartition(":")[0], int(address.rpartition(":")[2])]))
              for _ in range(20)]
    code, out, err, _ = run_status(job.store, "--json")
    for sock in silent:
        sock.close()
    assert code == 0 and all(entry["outcome"] == "answered" for entry in json.loads(out)["ranks"]), (out, err)
    assert json.loads(out)["took_s"] < 1.0
    outputs = job.stop()
    assert all(output.strip().endswith("DONE ok") for output in outputs)
    assert "a status query from 127.0.0.1:" in outputs[1] and "dropped unanswered" in outputs[1], outputs[1][-3000:]
    # at most one warning per 10 s, with a count of the others: five refusals here, one line
    assert outputs[1].count("dropped unanswered") == 1, outputs[1][-3000:]


def test_with_a_key_file_only_its_holders_are_answered(jobs, tmp_path):
    key = tmp_path / "key"
    key.write_bytes(os.urandom(32))
    key.chmod(0o600)
    other = tmp_path / "other"
    other.write_bytes(os.urandom(32))
    job = jobs(tmp_path, 2, DDPLITE_AUTH_KEY_FILE=str(key))
    env_without = {k: v for k, v in os.environ.items() if k != "DDPLITE_AUTH_KEY_FILE"}
    done = subprocess.run([sys.executable, "-m", "torch_ddp_lite.status", job.store], capture_output=True, text=True,
                          timeout=60, cwd=REPO, env=env_without)
    assert done.returncode == 2 and "pass it with --key-file" in done.stderr, done.stderr
    code, _, err, _ = run_status(job.store, "--key-file", str(other))
    assert code == 2 and "does not hold the job's key" in err, err
    # The store holds no secret: what it holds opens nothing, nor another key; the key does.
    store = status.open_store(job.store)
    address = store.get("ddplite/status/rank/1").decode().split()[0]
    auth_line = store.get("ddplite/status/auth/1").decode()
    assert auth_line.startswith("external ")
    salt = auth_line.split()[1].encode()
    derived = hmac.new(key.read_bytes(), b"ddplite-mesh|status|" + salt, hashlib.sha256).hexdigest().encode()
    other_derived = hmac.new(other.read_bytes(), b"ddplite-mesh|status|" + salt, hashlib.sha256).hexdigest().encode()
    assert _asked_with(address, lambda greeting: _proof(derived, address, greeting))
    for guess in (auth_line.encode(), salt, other_derived):
        assert not _asked_with(address, lambda greeting, guess=guess: _proof(guess, address, greeting)), guess
    code, out, err, _ = run_status(job.store, "--json", "--key-file", str(key))
    assert code == 0 and all(entry["outcome"] == "answered" for entry in json.loads(out)["ranks"]), (out, err)
    assert all(output.strip().endswith("DONE ok") for output in job.stop())


def test_without_authentication_anyone_may_ask_and_no_key_is_read(jobs, tmp_path):
    # DDPLITE_AUTH=0 with a key file that does not exist: nothing reads it, no rank waits for another
    job = jobs(tmp_path, 2, DDPLITE_AUTH="0", DDPLITE_AUTH_KEY_FILE=str(tmp_path / "missing"))
    store = status.open_store(job.store)
    assert store.get("ddplite/status/auth/0") == b"none"
    code, out, err, _ = run_status(job.store, "--json")
    assert code == 0 and all(entry["outcome"] == "answered" for entry in json.loads(out)["ranks"]), (out, err)
    assert all(output.strip().endswith("DONE ok") for output in job.stop())


def test_a_file_store_is_read_without_joining_it(tmp_path):
    # torch's FileStore counts its users in the file; a tool still attached when the job ends would
    # leave the file behind. The tool only reads it.
    path = tmp_path / "store"
    import torch.distributed as dist

    writer = dist.FileStore(str(path), 1)
    writer.set("ddplite/status/size", "1")
    size_before = path.stat().st_size
    reader = status.open_store(f"file://{path}")
    assert reader.check(["ddplite/status/size"]) and not reader.check(["absent"])
    assert reader.get("ddplite/status/size") == b"1"
    assert path.stat().st_size == size_before  # nothing appended: no refcount of its own
    del writer
    assert not path.exists()


@pytest.mark.parametrize("libuv", [True, False], ids=["libuv-server", "classic-server"])
def test_the_tool_reads_torchs_tcp_store_without_torch(libuv):
    import torch.distributed as dist

    master = dist.TCPStore("127.0.0.1", 0, is_master=True, use_libuv=libuv, wait_for_workers=False)
    every_byte, large = bytes(range(256)), os.urandom(3 << 20)
    master.set("ddplite/status/size", "16")
    master.set("binary", every_byte)
    master.set("large", large)
    master.set("empty", b"")
    dist.PrefixStore("default_pg", master).set("prefixed", "x")
    # torch's SET has no reply, and the reader has a connection of its own: a request answered on
    # the writer's connection is what says its sets before it have been applied
    assert master.check(["default_pg/prefixed"])
    reader = status.open_store(f"127.0.0.1:{master.port}")
    assert isinstance(reader, status.TcpStoreReader)
    try:
        assert reader.check(["ddplite/status/size"]) and reader.get("ddplite/status/size") == b"16"
        assert reader.check(["binary", "large", "empty"]) and not reader.check(["binary", "absent"])
        assert not reader.check(["prefixed"]) and reader.check(["default_pg/prefixed"])
        assert reader.get("binary") == every_byte and reader.get("large") == large and reader.get("empty") == b""
        master.set("ddplite/status/size", "17")  # a value set again reads as the new one
        assert master.get("ddplite/status/size") == b"17"
        assert reader.get("ddplite/status/size") == b"17"
    finally:
        reader.close()


def test_no_job_in_the_store_and_status_off(jobs, tmp_path):
    job = jobs(tmp_path, 2, DDPLITE_STATUS="0")
    code, _, err, _ = run_status(job.store)
    assert code == 2 and "no ddplite job has published its status" in err, err
    assert all(output.strip().endswith("DONE ok") for output in job.stop())
    code, _, err, _ = run_status("127.0.0.1:1")
    assert code == 2 and "cannot reach the store" in err, err


def _fake_status_port(secret, push_out_first):
    """A listener speaking the status protocol that closes its first `push_out_first` askers
    unanswered (half before the greeting, as a process that ends; half after reading the proof,
    as a full port pushes one out), then answers."""
    listener = socket.create_server(("127.0.0.1", 0))
    address = f"127.0.0.1:{listener.getsockname()[1]}"
    connections = []

    def serve():
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            connections.append(conn)
            with conn:
                if len(connections) <= push_out_first and len(connections) % 2 == 1:
                    continue  # closed before the greeting
                nonce = os.urandom(16)
                conn.sendall(status.MAGIC + nonce)
                proof = conn.recv(32)
                if len(connections) <= push_out_first:
                    continue  # pushed out after the proof came
                expected = hmac.new(secret, status.MAC_CONTEXT + b"|" + address.encode() + b"|" + nonce,
                                    hashlib.sha256).digest()
                if proof != expected:
                    conn.sendall(struct.pack(">I", status.REFUSED_LENGTH))
                    continue
                body = json.dumps({"groups": [], "pid": 1}).encode()
                seal = hmac.new(secret, status.ANSWER_CONTEXT + b"|" + nonce + body, hashlib.sha256).digest()
                conn.sendall(struct.pack(">I", len(body)) + body + seal)

    threading.Thread(target=serve, daemon=True).start()
    return listener, address, connections


@pytest.mark.parametrize("push_out_first", [0, 5, 10**6], ids=["answered", "pushed-out-5-times", "always-full"])
def test_the_tool_asks_again_when_pushed_out_and_gives_up_at_its_deadline(push_out_first):
    """A port whose 64 slots strangers hold closes an asker to make room; the tool connects again
    (1, 2, 4 ... 50 ms apart) until its timeout, and says "not answering" with how often it was
    closed unanswered. A wrong secret is "refused" at once."""
    secret = b"s" * 64
    listener, address, connections = _fake_status_port(secret, push_out_first)
    try:
        started = time.monotonic()
        outcome, detail = status.ask(address, secret, timeout_s=1.0)
        took = time.monotonic() - started
        if push_out_first == 10**6:
            assert outcome == "not answering" and "closed before answering" in detail, (outcome, detail)
            assert 0.9 < took < 2.0 and 10 < len(connections) < 60, (took, len(connections))
        else:
            assert outcome == "answered" and detail == {"groups": [], "pid": 1}, (outcome, detail)
            assert len(connections) == push_out_first + 1 and took < 1.0, (len(connections), took)
            started = time.monotonic()
            assert status.ask(address, b"w" * 64, timeout_s=1.0)[0] == "refused"
            assert time.monotonic() - started < 0.5
    finally:
        listener.shutdown(socket.SHUT_RDWR)  # wakes the accept() of the serving thread
        listener.close()
