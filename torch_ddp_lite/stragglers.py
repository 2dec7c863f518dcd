"""Straggler scores from the collectives themselves, with no code marked.

Each rank remembers, for a group's last collectives (``DDPLITE_STRAGGLER_WINDOW``, 512), when it
arrived (the backend took the call) and when the collective ended on it, on its own steady clock
(``csrc/backend/wait_ledger.hpp``). Clocks of different hosts are never compared: every figure
below is a duration measured on one rank's clock.

* **wait**: how long a rank spent in a collective, arrival to end. The rank the others wait for
  arrives last and waits least.
* **outside**: how long a rank spent with no collective of the group outstanding (computing, or
  anything else) between the first and the last collective of the window. A straggler spends
  longer outside than the others, by the time it makes them wait.
* **score** (0..1, in nvidia-resiliency-ext's sense of a relative score: 1 for the best rank): the
  least ``outside`` of any rank divided by this rank's, each plus 10 us per collective (a floor
  that keeps back-to-back collectives from scoring noise). A rank 30% slower per step of
  milliseconds scores 1/1.3 = 0.77.
* **last**: the share of the window's collectives in which the rank waited least (arrived last).
* **imposed**: the mean wait it imposed on the others per collective: in each collective it
  arrived last, the others' mean wait minus its own; summed and divided by the window's length.

Only collectives recorded on every rank count (a rank's window may have rotated further); a
collective that failed is not recorded.

With ``DDPLITE_STRAGGLER_REPORT=seconds``, global rank 0 logs the table of the default group to
stderr that often, from a thread of its own that asks every rank as ``python -m
torch_ddp_lite.status`` does (no collective: the training loop is neither called into nor
stopped), with the ranks that did not answer and an op the others have waited in for 1 s or more.
"""

import collections
import os
import pickle
import socket
import sys
import threading
import time

# Added to every rank's time outside: without it, a rank that is never outside (collectives back
# to back) would give every other rank a score of 0, and microseconds of noise would rank ranks.
FLOOR_NS_PER_GAP = 10_000
# Ranks the periodic report asks at a time, from threads of rank 0's training process.
REPORT_ASKS_AT_ONCE = 16

Row = collections.namedtuple(
    "Row", ["rank", "host", "score", "imposed_ms", "last_fraction", "mean_wait_ms", "p95_wait_ms", "outside_ms",
            "ops"])
Row.__doc__ = """One rank's straggler figures over the window (times in milliseconds; outside_ms is
per collective, like imposed_ms)."""


class Stragglers(list):
    """Rows sorted with the likeliest straggler first (lowest score, then most wait imposed);
    ``str()`` gives a table."""

    def __str__(self):
        head = f"{'rank':>4}  {'host':<16} {'score':>5}  {'imposed ms':>10}  {'last':>5}  {'mean wait ms':>12}  " \
               f"{'p95 wait ms':>11}  {'outside ms':>10}  {'ops':>5}"
        lines = [head]
        for row in self:
            lines.append(f"{row.rank:>4}  {row.host[:16]:<16} {row.score:>5.2f}  {row.imposed_ms:>10.3f}  "
                         f"{row.last_fraction:>5.0%}  {row.mean_wait_ms:>12.3f}  {row.p95_wait_ms:>11.3f}  "
                         f"{row.outside_ms:>10.3f}  {row.ops:>5}")
        return "\n".join(lines)


def _p95(values):
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(0.95 * len(ordered)))] if ordered else 0.0


def _outside_ns(entries):
    """Time with no collective outstanding between the first collective's end and the last
    collective's arrival: the gaps in the union of [arrived, ended] (entries sorted by seq)."""
    outside = 0
    latest_end = entries[0][2]
    for _, arrived, ended in entries[1:]:
        outside += max(0, arrived - latest_end)
        latest_end = max(latest_end, ended)
    return outside


def score_ledgers(ledgers, hosts, window=None):
    """The straggler table from every rank's ledger (``[(seq, arrived_ns, ended_ns)]``, each on its
    own clock) and host name, indexed by group rank. Pure: the same inputs give the same table on
    every rank."""
    size = len(ledgers)
    by_seq = [{seq: (seq, arrived, ended) for seq, arrived, ended in ledger} for ledger in ledgers]
    common = sorted(set.intersection(*(set(entries) for entries in by_seq))) if size else []
    if window is not None:
        common = common[-window:] if window > 0 else []
    ops = len(common)
    waits = [[by_seq[r][s][2] - by_seq[r][s][1] for s in common] for r in range(size)]
    outside = [_outside_ns([by_seq[r][s] for s in common]) if ops > 1 else 0 for r in range(size)]
    last_counts = [0] * size
    imposed = [0.0] * size
    for i in range(ops):
        column = [waits[r][i] for r in range(size)]
        last = min(range(size), key=lambda r: (column[r], r))
        last_counts[last] += 1
        if size > 1:
            imposed[last] += sum(column[r] - column[last] for r in range(size) if r != last) / (size - 1)
    least_outside = min(outside) if outside else 0
    floor = FLOOR_NS_PER_GAP * max(ops - 1, 0)
    rows = []
    for r in range(size):
        score = (least_outside + floor) / (outside[r] + floor) if outside[r] + floor > 0 else 1.0
        rows.append(Row(
            rank=r, host=hosts[r], score=score, imposed_ms=imposed[r] / ops / 1e6 if ops else 0.0,
            last_fraction=last_counts[r] / ops if ops else 0.0,
            mean_wait_ms=sum(waits[r]) / ops / 1e6 if ops else 0.0, p95_wait_ms=_p95(waits[r]) / 1e6,
            outside_ms=outside[r] / (ops - 1) / 1e6 if ops > 1 else 0.0, ops=ops))
    rows.sort(key=lambda row: (row.score, -row.imposed_ms, row.rank))
    return Stragglers(rows)


def _all_gather_bytes(payload, group):
    """Every group rank's ``payload`` (bytes), through the group's CPU backend."""
    import torch
    import torch.distributed as dist

    size = dist.get_world_size(group)
    length = torch.tensor([len(payload)], dtype=torch.int64)
    dist.all_reduce(length, op=dist.ReduceOp.MAX, group=group)
    mine = torch.zeros(int(length.item()), dtype=torch.uint8)
    mine[:len(payload)] = torch.frombuffer(bytearray(payload), dtype=torch.uint8)
    gathered = [torch.empty_like(mine) for _ in range(size)]
    dist.all_gather(gathered, mine, group=group)
    return [bytes(tensor.numpy().tobytes()) for tensor in gathered]


def stragglers(group=None, window=None):
    """Straggler scores of a ddplite group (the default group when None) from its last collectives:
    a collective call (every rank of the group calls it) that returns the same
    :class:`Stragglers` table on every rank, likeliest straggler first. ``window``: score only the
    last N collectives recorded on every rank (default: all of them, up to
    ``DDPLITE_STRAGGLER_WINDOW``). See this module's text for what each column means."""
    from torch.distributed import distributed_c10d as c10d

    import torch_ddp_lite

    if group is not None and c10d._rank_not_in_group(group):
        raise ValueError("stragglers(): this rank is not a member of that group")
    if window is not None and (not isinstance(window, int) or window < 2):
        raise ValueError(f"stragglers(): window must be an int of at least 2 collectives, got {window!r}")
    ledger = torch_ddp_lite._call_on_cpu_backend(
        group, lambda extension, backend: [tuple(entry) for entry in extension.group_wait_ledger(backend)])
    mine = pickle.dumps((socket.gethostname(), ledger))
    # Padded to the longest: pickle ignores the bytes past its end.
    gathered = [pickle.loads(blob) for blob in _all_gather_bytes(mine, group)]
    return score_ledgers([entries for _, entries in gathered], [host for host, _ in gathered], window)


class _Report:
    """The periodic straggler report of this process (global rank 0 only): one daemon thread,
    started by the first ddplite group created with the knob set, that reports on the default
    group of whichever job this process is in at each tick (it holds no store between ticks, so
    a destroyed job's store goes when torch lets it go). ``_every_s`` is guarded by ``_lock``."""

    _lock = threading.Lock()
    _thread = None
    _every_s = 0

    @classmethod
    def follow(cls, every_s):
        with cls._lock:
            cls._every_s = every_s  # a later job's value applies from the next tick
            if cls._thread is None:
                thread = threading.Thread(target=cls._run, name="ddplite-stragglers", daemon=True)
                thread.start()
                cls._thread = thread

    @classmethod
    def _run(cls):
        import torch.distributed as dist

        from torch_ddp_lite import status

        while True:
            with cls._lock:
                every_s = cls._every_s
            time.sleep(every_s)
            try:
                if not dist.is_initialized():
                    continue  # set-up not finished yet, or no job now
                text = report_text(status.root_store(dist.distributed_c10d._get_default_store()), every_s)
            except Exception as error:  # the job ending under the query; a store gone
                text = f"rank 0: no straggler report this time: {type(error).__name__}: {error}"
            try:
                for line in text.splitlines():
                    print(f"[ddplite {os.getpid()}] INFO {line}", file=sys.stderr, flush=True)
            except Exception:  # stderr closed or broken: nothing to report to, but keep going
                pass


def report_text(store, every_s=None):
    """The straggler report of the job whose (root) store is ``store``: the default group's table
    over the ranks that answered, the ranks that did not and why, and an op the answering ranks
    have waited in for 1 s or more; "" while the status keys are not all published."""
    from torch_ddp_lite import status

    try:
        report = status.analyse(status.collect(store, at_once=REPORT_ASKS_AT_ONCE))
    except status.StatusError:
        return ""
    knob = f" (DDPLITE_STRAGGLER_REPORT={every_s:g})" if every_s else ""
    rows = report["stragglers"]
    lines = []
    if not rows:
        lines.append(f"rank 0: stragglers: no rank answered{knob}")
    elif rows[0]["ops"] < status.MIN_OPS_TO_SCORE:
        lines.append(f"rank 0: stragglers: too few collectives to score yet ({rows[0]['ops']}){knob}")
    else:
        name = report.get("stragglers_group")
        which = "the default group" if name in (None, "0") else f"group {name}"
        lines.append(f"rank 0: stragglers of {which} over its last {rows[0]['ops']} collectives{knob}:")
        lines.extend(str(Stragglers(Row(**row) for row in rows)).splitlines())
    for entry in report["ranks"]:
        if entry["outcome"] != "answered":
            lines.append(f"rank 0: rank {entry['rank']} {entry['outcome']}: {entry['detail']}")
    stalled = report["stalled"]
    if stalled and stalled["not_arrived"]:
        lines.append(f"rank 0: {stalled['op']} #{stalled['seq']} waited in for {stalled['waiting_s']:.2f} s; "
                     f"not arrived: rank {', '.join(str(r) for r in stalled['not_arrived'])}")
    return "\n".join(lines)


def start_report_if_asked(global_rank):
    """Called for each ddplite group this process creates: on global rank 0 with
    ``DDPLITE_STRAGGLER_REPORT`` > 0, starts the report (once; a later job's interval replaces
    the first's). The knob's value was checked on every rank when the group was created. Never
    raises: a report that cannot start is a warning, the group is made all the same."""
    import warnings

    from torch_ddp_lite import _load_extension

    try:
        every_s = _load_extension().straggler_report_seconds()
        if every_s <= 0 or global_rank != 0:
            return
        if os.environ.get("DDPLITE_STATUS", "1") == "0":
            warnings.warn("DDPLITE_STRAGGLER_REPORT is set but DDPLITE_STATUS=0: the report asks the ranks' status "
                          "listeners, which are off; no report will be logged", stacklevel=2)
            return
        _Report.follow(every_s)
    except Exception as error:  # no thread to be had
        warnings.warn(f"DDPLITE_STRAGGLER_REPORT: the report could not start: {error}", stacklevel=2)
