"""What a running ddplite job is doing, asked from outside it:

    python -m torch_ddp_lite.status [STORE] [--json] [--watch SECONDS] [--key-file PATH]

STORE is the job's store: ``HOST:PORT`` (the TCPStore of ``MASTER_ADDR:MASTER_PORT``, the
default), or ``file:///path`` (or a plain path) for a ``file://`` init method. Each process of
the job answers on a port of its own (``csrc/health/status_server.hpp``: one listener and one
thread per process, nothing on the collective path); the store only says where. Every rank is
asked at once and gets ``--timeout`` (1.5 s) to answer, so the answer comes within 2 s at any
size (256 ranks asked at once; more take turns); the job is neither stopped nor slowed.

For each rank: its host and pid; what it is doing (in collective X #seq for how long, between
collectives for how long, send/recv pending and with whom); its last completed collective. Ranks
that do not answer (stopped, or hung in the kernel) and ranks that are dead (nothing listens
where they did; on this host, their process is gone) are named. For an op some ranks wait in,
which ranks have arrived and which have not. Then the straggler table
(:mod:`torch_ddp_lite.stragglers`) from every answering rank's recent collectives.

Queries are authenticated as ddplite's TCP connections are (docs/security.md): with the secret
rank 0 put in the store (the default), with the key of ``DDPLITE_AUTH_KEY_FILE`` (``--key-file``,
or that variable) when the job uses one, without either under ``DDPLITE_AUTH=0``. A process
answers nothing to a query that does not prove the secret.
"""

import argparse
import concurrent.futures
import errno
import hashlib
import hmac
import json
import os
import socket
import struct
import sys
import time
from datetime import timedelta

MAGIC = b"DDPLST01"
MAC_CONTEXT = b"ddplite-status"
ANSWER_CONTEXT = b"ddplite-status-answer"
DEFAULT_TIMEOUT_S = 1.5
REFUSED_LENGTH = 0xFFFFFFFF  # sent instead of an answer's length to a wrong proof
DEFAULT_STALL_AFTER_S = 1.0
MAX_ASKING_AT_ONCE = 256  # threads asking at once: a rank that does not answer holds one for --timeout
MIN_OPS_TO_SCORE = 16  # below this, the text shows no straggler table: a few ops' gaps are noise


class StatusError(RuntimeError):
    """The job cannot be asked: no store there, no ddplite job in it, or no key for it."""


def open_store(where, timeout_s=5.0):
    """The job's store, as a client (never the master): ``host:port`` or a file path."""
    if where.startswith("file://"):
        where = where[len("file://"):]
    if os.path.sep in where and ":" not in where.rsplit(os.path.sep, 1)[-1] or os.path.exists(where):
        if not os.path.exists(where):
            raise StatusError(f"no store file at {where}")
        return FileStoreReader(where)
    host, _, port = where.rpartition(":")
    if not host or not port.isdigit():
        raise StatusError(f"STORE must be HOST:PORT or a file path, got {where!r}")
    host = host.strip("[]")
    try:  # a plain connect first: torch's client logs a C++ stack trace for every failed try
        reader = TcpStoreReader(host, int(port), timeout_s)
    except OSError as error:
        raise StatusError(f"cannot reach the store at {where}: {error}") from None
    try:
        reader.check(["ddplite/status/size"])
        return reader
    except _StoreRefused:  # closed on the first request, or an odd reply: a torch this reader does not know
        return _torch_store_client(host, int(port), where, timeout_s)


def _torch_store_client(host, port, where, timeout_s):
    import torch.distributed as dist  # about 2.5 s: only for a store the raw reader cannot read

    try:
        return dist.TCPStore(host, port, is_master=False, timeout=timedelta(seconds=timeout_s),
                             wait_for_workers=False)
    except Exception as error:  # noqa: BLE001 - torch raises several kinds; all mean "not reachable"
        first_line = (str(error).strip().splitlines() or [type(error).__name__])[0]  # not the C++ frames
        raise StatusError(f"cannot reach the store at {where}: {first_line}") from None


class _StoreRefused(StatusError):
    """The store closed the connection or answered what torch's servers do not."""


class TcpStoreReader:
    """A TCPStore read without torch (importing torch takes longer than the 2 s the tool has): the
    two requests the tool needs, as torch's client sends them (torch 2.8 to 2.15, both of its
    server backends, checked by tests/test_status.py). After a VALIDATE (byte 0, then the uint32
    0x3C85F7CE; no reply), CHECK is byte 5, a uint64 count, then each key as a uint64 length and
    its bytes, answered by one byte (0: every key is set); GET is byte 3 and the key, answered by
    a uint64 length and the value. Integers are the host's order (little-endian here), as torch
    sends them; keys carry torch's "/" prefix. One connection, one request at a time; a request
    that fails closes it and raises StatusError."""

    VALIDATE, GET, CHECK = 0, 3, 5
    MAGIC = 0x3C85F7CE

    def __init__(self, host, port, timeout_s):
        self.where, self.timeout_s = f"{host}:{port}", timeout_s
        self._sock = socket.create_connection((host, port), timeout=timeout_s)
        try:
            self._sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self._sock.sendall(struct.pack("<BI", self.VALIDATE, self.MAGIC))
        except OSError:
            self._sock.close()
            raise

    @staticmethod
    def _key(key):
        data = ("/" + key).encode()
        return struct.pack("<Q", len(data)) + data

    def _exactly(self, size):
        data = b""
        while len(data) < size:
            chunk = self._sock.recv(size - len(data))
            if not chunk:
                raise ConnectionResetError("the store closed the connection")
            data += chunk
        return data

    def _ask(self, request, read_reply):
        try:
            self._sock.sendall(request)
            return read_reply()
        except socket.timeout:
            self.close()
            raise StatusError(f"the store at {self.where} did not answer within {self.timeout_s:g} s") from None
        except OSError as error:
            self.close()
            raise _StoreRefused(f"the store at {self.where} closed the connection ({error})") from None

    def check(self, keys):
        reply = self._ask(struct.pack("<BQ", self.CHECK, len(keys)) + b"".join(map(self._key, keys)),
                          lambda: self._exactly(1)[0])
        if reply not in (0, 1):
            self.close()
            raise _StoreRefused(f"the store at {self.where} answered a CHECK with {reply}, not 0 or 1")
        return reply == 0

    def get(self, key):
        return self._ask(struct.pack("<B", self.GET) + self._key(key),
                         lambda: self._exactly(struct.unpack("<Q", self._exactly(8))[0]))

    def close(self):
        self._sock.close()


class FileStoreReader:
    """A file:// store, read without joining it: torch's FileStore would count the tool among the
    job's users (its refcount), and a tool still attached when the job ends would leave the file
    behind. The file is torch's append-only log: a key and a value per set, each a 4-byte
    little-endian length then its bytes; the last value of a key is its value."""

    def __init__(self, path):
        self.path = path

    def _entries(self):
        with open(self.path, "rb") as handle:
            data = handle.read()
        items, at = [], 0
        while at + 4 <= len(data):
            size = int.from_bytes(data[at:at + 4], "little")
            if at + 4 + size > len(data):
                break  # an entry being written
            items.append(data[at + 4:at + 4 + size])
            at += 4 + size
        return {key.decode(errors="replace"): value for key, value in zip(items[0::2], items[1::2])}

    def check(self, keys):
        entries = self._entries()
        return all("/" + key in entries for key in keys)  # torch writes every key under "/"

    def get(self, key):
        return self._entries()["/" + key]


def _read(store, key):
    return store.get(key).decode() if store.check([key]) else None


def _key_from_file(path):
    with open(path, "rb") as handle:
        key = handle.read()
    return key[:-1] if key.endswith(b"\n") else key


def secret_for(auth_line, key_file=None):
    """The HMAC key of the status queries from the store's "ddplite/status/auth" line; None when
    the job does not authenticate (DDPLITE_AUTH=0)."""
    if auth_line == "none":
        return None
    if not auth_line.startswith("external "):
        return auth_line.encode()
    _, salt, check = auth_line.split(" ")
    key_file = key_file or os.environ.get("DDPLITE_AUTH_KEY_FILE")
    if not key_file:
        raise StatusError("the job authenticates with a key file (DDPLITE_AUTH_KEY_FILE): pass it with --key-file")
    key = _key_from_file(key_file)
    if hmac.new(key, b"ddplite-key-check|" + salt.encode(), hashlib.sha256).hexdigest()[:16] != check:
        raise StatusError(f"{key_file} does not hold the job's key")
    return hmac.new(key, b"ddplite-mesh|status|" + salt.encode(), hashlib.sha256).hexdigest().encode()


def _receive(sock, size, deadline):
    data = b""
    while len(data) < size:
        sock.settimeout(max(0.001, deadline - time.monotonic()))
        chunk = sock.recv(size - len(data))
        if not chunk:
            raise ConnectionResetError("closed")
        data += chunk
    return data


class _ClosedUnanswered(Exception):
    """The connection closed before the answer's length came, without the refusal marker: the
    process pushed it out to make room for a newcomer (at most 64 askers are held at once,
    csrc/health/status_server.cpp), or ended."""


def _ask_once(address, secret, deadline):
    host, _, port = address.rpartition(":")
    with socket.create_connection((host.strip("[]"), int(port)),
                                  timeout=max(0.001, deadline - time.monotonic())) as sock:
        try:
            greeting = _receive(sock, len(MAGIC) + 16, deadline)
            if greeting[:len(MAGIC)] != MAGIC:
                return "refused", f"{address} is not a ddplite status port"
            nonce = greeting[len(MAGIC):]
            proof = bytes(32) if secret is None else hmac.new(
                secret, MAC_CONTEXT + b"|" + address.encode() + b"|" + nonce, hashlib.sha256).digest()
            sock.sendall(proof)
            length = struct.unpack(">I", _receive(sock, 4, deadline))[0]
        except (ConnectionResetError, BrokenPipeError):
            raise _ClosedUnanswered() from None
        if length == REFUSED_LENGTH:
            return "refused", f"{address} did not accept the proof (is the key the job's?)"
        body = _receive(sock, length, deadline)
        seal = _receive(sock, 32, deadline)
        if secret is not None and not hmac.compare_digest(
                seal, hmac.new(secret, ANSWER_CONTEXT + b"|" + nonce + body, hashlib.sha256).digest()):
            return "refused", f"the answer from {address} is not sealed with the job's secret"
        return "answered", json.loads(body.decode("utf-8", "replace"))


def ask(address, secret, timeout_s=DEFAULT_TIMEOUT_S):
    """One process's answer: ("answered", state) or (outcome, detail) with outcome "dead" (nothing
    listens there), "not answering" (no answer in time) or "refused" (the secret was not the
    job's; or an answer not sealed with it). The proof is bound to ``address`` as published: a
    relay at another address cannot pass it on. A connection closed before the answer without
    the refusal marker (pushed out to make room: strangers holding the port's 64 slots) is made
    again, after 1, 2, 4 ... 50 ms, until ``timeout_s``; a process that ended then refuses the
    next connect ("dead")."""
    deadline = time.monotonic() + timeout_s
    pause = 0.001
    closed = 0

    def closed_note():
        return f" (closed before answering {closed} times first)" if closed else ""

    while True:
        try:
            return _ask_once(address, secret, deadline)
        except _ClosedUnanswered:
            closed += 1
            if time.monotonic() + pause >= deadline:
                return "not answering", (f"closed before answering {closed} times within {timeout_s:g} s (a port "
                                         "that strangers keep full, or not a ddplite status port)")
            time.sleep(pause)
            pause = min(0.05, pause * 2)
        except ConnectionRefusedError:
            return "dead", f"nothing listens at {address}" + closed_note()
        except (socket.timeout, TimeoutError):
            return "not answering", f"no answer within {timeout_s:g} s" + closed_note()
        except ConnectionResetError:
            return "refused", f"{address} reset the connection during its answer"
        except ValueError as error:  # not JSON, a malformed address
            return "refused", f"{address}: unreadable answer ({error})"
        except OSError as error:
            if error.errno in (errno.EHOSTUNREACH, errno.ENETUNREACH):
                return "not answering", f"{address} unreachable: {error.strerror}"
            return "dead", f"{address}: {error}"


def _local_process_state(pid):
    """'gone', 'stopped' or None (running, or not readable) for a pid on this host."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            state = stat.read().rsplit(")", 1)[1].split()[0]
    except OSError:
        return "gone"
    return "stopped" if state in ("T", "t") else None


def root_store(store):
    """The store under every PrefixStore: the status keys are at the root of the job's store."""
    if isinstance(store, (TcpStoreReader, FileStoreReader)):
        return store  # the tool's own readers (torch is not imported for them)
    import torch.distributed as dist

    while isinstance(store, dist.PrefixStore):
        store = store.underlying_store
    return store


def collect(store, key_file=None, timeout_s=DEFAULT_TIMEOUT_S, at_once=MAX_ASKING_AT_ONCE):
    """Every rank's answer: {"size", "ranks": [{"rank", "address", "pid", "host", "outcome",
    "detail", "state"}], "took_s"}; ``at_once`` ranks are asked at a time."""
    store = root_store(store)
    started = time.monotonic()
    size_text = _read(store, "ddplite/status/size")
    if size_text is None:
        raise StatusError("no ddplite job has published its status in this store (is the job running, on a "
                          "ddplite group, with DDPLITE_STATUS=1?)")
    size = int(size_text)
    ranks, secrets = [], {}
    for rank in range(size):
        published = _read(store, f"ddplite/status/rank/{rank}")
        auth_line = _read(store, f"ddplite/status/auth/{rank}")
        if published is None or auth_line is None:
            ranks.append({"rank": rank, "outcome": "not published", "detail": "no status address in the store",
                          "address": None, "pid": None, "host": None, "state": None})
            continue
        address, pid, host = published.split(" ", 2)
        secrets[rank] = secret_for(auth_line, key_file)
        ranks.append({"rank": rank, "address": address, "pid": int(pid), "host": host, "state": None})
    with concurrent.futures.ThreadPoolExecutor(max_workers=min(at_once, max(1, size))) as pool:
        answers = {entry["rank"]: pool.submit(ask, entry["address"], secrets[entry["rank"]], timeout_s)
                   for entry in ranks if entry["address"] is not None}
        for entry in ranks:
            if entry["rank"] in answers:
                entry["outcome"], detail = answers[entry["rank"]].result()
                if entry["outcome"] == "answered":
                    entry["state"], entry["detail"] = detail, ""
                else:
                    entry["detail"] = detail
    here = socket.gethostname()
    for entry in ranks:
        if entry["outcome"] in ("dead", "not answering") and entry["host"] == here:
            local = _local_process_state(entry["pid"])
            if local == "gone":
                entry["outcome"], entry["detail"] = "dead", f"process {entry['pid']} is gone"
            elif local == "stopped":
                entry["outcome"], entry["detail"] = "not answering", f"process {entry['pid']} is stopped (SIGSTOP)"
    return {"size": size, "ranks": ranks, "took_s": time.monotonic() - started}


def _main_group(state):
    """The default group's entry of a process's answer ("0"), else its first group."""
    groups = state["groups"]
    for group in groups:
        if group["name"] == "0":
            return group
    return groups[0] if groups else None


def _stall(groups, members, stall_after_s):
    """The op the answering ranks of one group (``groups``: rank -> its entry) have waited in for at
    least ``stall_after_s``, who of ``members`` arrived and who not; None when there is none."""
    running = {rank: group["running"] for rank, group in groups.items() if group["running"]}
    if not running or max(op["seconds"] for op in running.values()) < stall_after_s:
        return None
    seq = max(op["seq"] for op in running.values())
    waiting = sorted(rank for rank, op in running.items() if op["seq"] == seq)
    arrived = sorted(rank for rank, group in groups.items()
                     if (group["running"] and group["running"]["seq"] >= seq)
                     or (group["last"] and group["last"]["seq"] >= seq))
    return {"op": running[waiting[0]]["op"], "seq": seq, "waiting_s": max(running[r]["seconds"] for r in waiting),
            "arrived": arrived, "not_arrived": [rank for rank in members if rank not in arrived],
            "ranks": len(members)}


def analyse(report, stall_after_s=DEFAULT_STALL_AFTER_S):
    """Adds "stalled" (the op answering ranks have waited in for at least ``stall_after_s``, who
    arrived, who not; None when there is none: in a job that runs, ranks asked a few milliseconds
    apart are in different ops) and "stragglers" (the table over the default group's answering
    ranks) to a collect() report. When the processes' first groups differ (ddplite subgroups of
    disjoint ranks under another backend's default group), each group is looked at for a stall
    (the first found is reported) and the table is the lowest answering rank's group's."""
    from torch_ddp_lite.stragglers import score_ledgers

    by_group = {}  # group name -> {rank: its entry}, every group of every answering process,
    main = None    # in the order of their lowest answering rank; main: that rank's main group's name
    for entry in sorted(report["ranks"], key=lambda entry: entry["rank"]):
        if entry["outcome"] != "answered" or _main_group(entry["state"]) is None:
            continue
        main = main or _main_group(entry["state"])["name"]
        for group in entry["state"]["groups"]:
            by_group.setdefault(group["name"], {})[entry["rank"]] = group
    everyone = [entry["rank"] for entry in report["ranks"]]
    report["stalled"] = None
    for groups in by_group.values():
        members = next(iter(groups.values())).get("global_ranks") or everyone
        report["stalled"] = _stall(groups, members, stall_after_s)
        if report["stalled"] is not None:
            break
    groups = by_group.get(main, {})
    report["stragglers_group"] = main
    ordered = sorted(groups)
    table = score_ledgers([[tuple(e) for e in groups[r]["ledger"]] for r in ordered],
                          [next(x["host"] for x in report["ranks"] if x["rank"] == r) for r in ordered])
    report["stragglers"] = [dict(row._asdict(), rank=ordered[row.rank]) for row in table]
    return report


def _doing(group):
    if group["running"]:
        op = group["running"]
        return f"in {op['op']} #{op['seq']} for {op['seconds']:.2f} s"
    if group["last"]:
        return f"between collectives for {group['last']['seconds']:.2f} s"
    return "no collective yet"


def render(report):
    lines = [f"{report['size']} ranks, asked in {report['took_s']:.2f} s"]
    for entry in report["ranks"]:
        where = f"{entry['host'] or '?'} pid {entry['pid'] or '?'}"
        if entry["outcome"] != "answered":
            lines.append(f"rank {entry['rank']:>3}  {where:<28} {entry['outcome'].upper()}: {entry['detail']}")
            continue
        group = _main_group(entry["state"])
        if group is None:
            lines.append(f"rank {entry['rank']:>3}  {where:<28} no group")
            continue
        text = _doing(group)
        if group["last"]:
            text += f"; last completed {group['last']['op']} #{group['last']['seq']}"
        if group["p2p_pending"] and group["last_p2p"]:
            p2p = group["last_p2p"]
            text += f"; {group['p2p_pending']} send/recv pending (latest: {p2p['op']} with rank {p2p['peer']}, " \
                    f"{p2p['seconds']:.2f} s)"
        if group["broken"]:
            text += f"; BROKEN: {group['broken'][:200]}"
        others = [g for g in entry["state"]["groups"] if g is not group]
        for other in others:
            text += f"; group {other['name']} (rank {other['rank']}/{other['size']}): {_doing(other)}"
        lines.append(f"rank {entry['rank']:>3}  {where:<28} {text}")
    stalled = report.get("stalled")
    if stalled and stalled["not_arrived"]:
        missing = ", ".join(str(r) for r in stalled["not_arrived"])
        lines.append(f"{stalled['op']} #{stalled['seq']}: {len(stalled['arrived'])} of {stalled.get('ranks', report['size'])} ranks arrived "
                     f"(waiting up to {stalled['waiting_s']:.2f} s); not arrived: rank {missing}")
    if report.get("stragglers") and report["stragglers"][0]["ops"] < MIN_OPS_TO_SCORE:
        lines.append("")
        lines.append(f"stragglers: too few collectives to score ({report['stragglers'][0]['ops']}, fewer than "
                     f"{MIN_OPS_TO_SCORE}); torch_ddp_lite.stragglers() has them")
    elif report.get("stragglers"):
        from torch_ddp_lite.stragglers import Row, Stragglers

        lines.append("")
        name = report.get("stragglers_group")
        lines.append(f"stragglers ({'default group' if name in (None, '0') else 'group ' + name}, answering ranks):")
        lines.append(str(Stragglers(Row(**row) for row in report["stragglers"])))
    return "\n".join(lines)


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m torch_ddp_lite.status", description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    default_store = None
    if os.environ.get("MASTER_ADDR") and os.environ.get("MASTER_PORT"):
        default_store = f"{os.environ['MASTER_ADDR']}:{os.environ['MASTER_PORT']}"
    parser.add_argument("store", nargs="?", default=default_store,
                        help="HOST:PORT of the job's TCPStore (default: MASTER_ADDR:MASTER_PORT), or its file:// path")
    parser.add_argument("--json", action="store_true", help="one JSON object per report, for tools")
    parser.add_argument("--watch", type=float, metavar="SECONDS", help="ask again every SECONDS until interrupted")
    parser.add_argument("--key-file", help="the job's DDPLITE_AUTH_KEY_FILE, when it uses one (default: that variable)")
    parser.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT_S,
                        help="seconds each rank gets to answer (default %(default)s)")
    parser.add_argument("--stall-after", type=float, default=DEFAULT_STALL_AFTER_S, metavar="SECONDS",
                        help="an op ranks have waited in this long is reported as stalled (default %(default)s)")
    args = parser.parse_args(argv)
    if args.store is None:
        parser.error("give the job's store (HOST:PORT or a file path), or set MASTER_ADDR and MASTER_PORT")
    try:
        store = open_store(args.store)
        while True:
            report = analyse(collect(store, args.key_file, args.timeout), args.stall_after)
            if args.json:
                print(json.dumps(report), flush=True)
            else:
                if args.watch:
                    print("\033[H\033[2J", end="")
                print(render(report), flush=True)
            if not args.watch:
                return 0
            time.sleep(args.watch)
    except StatusError as error:
        print(f"torch_ddp_lite.status: {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 0


if __name__ == "__main__":
    sys.exit(main())
