"""torch_ddp_lite.stragglers(): straggler scores from the collectives' own arrival and end times.
Closed forms on synthetic ledgers; then real DDP jobs with one rank 30% slower per step, on shared
memory and over TCP (across namespace hosts: tests/test_multihost.py), which must name it first
on every rank within 20 steps."""

import pytest

import straggler_workers as sw
from harness import run_ranks
from torch_ddp_lite.stragglers import score_ledgers

MS = 1_000_000


def _ledger(steps, outside_ms, wait_ms, first_arrival=0):
    """A rank that spends `outside_ms` outside collectives and `wait_ms` in each of `steps` ops."""
    entries, clock = [], first_arrival
    for seq in range(1, steps + 1):
        entries.append((seq, clock, clock + wait_ms * MS))
        clock += wait_ms * MS + outside_ms * MS
    return entries


def test_closed_form_one_rank_slower():
    # Ranks 0, 1, 3 compute 10 ms and wait 3.5 ms; rank 2 computes 13 ms and waits 0.5 ms (its
    # step is as long: 13.5 ms). Clocks start at unrelated values, as on different hosts.
    ledgers = [_ledger(20, 10, 3.5, first_arrival=offset) for offset in (0, 7 * MS, 0, 123456789)]
    ledgers[2] = _ledger(20, 13, 0.5, first_arrival=999 * MS)
    table = score_ledgers(ledgers, ["a", "a", "b", "b"])
    assert [row.rank for row in table][0] == 2
    slow = table[0]
    assert slow.host == "b" and slow.ops == 20
    assert slow.score == pytest.approx(10 / 13, rel=1e-3)  # 10 us per collective of floor
    assert slow.last_fraction == 1.0 and slow.imposed_ms == pytest.approx(3.0)
    assert slow.mean_wait_ms == pytest.approx(0.5) and slow.p95_wait_ms == pytest.approx(0.5)
    assert slow.outside_ms == pytest.approx(13.0)
    for row in table[1:]:
        assert row.score == pytest.approx(1.0) and row.last_fraction == 0.0 and row.imposed_ms == 0.0
        assert row.mean_wait_ms == pytest.approx(3.5) and row.outside_ms == pytest.approx(10.0)
    assert [row.rank for row in table[1:]] == [0, 1, 3]  # ties: by rank
    text = str(table).splitlines()
    assert text[0].split()[:3] == ["rank", "host", "score"] and text[1].split()[:3] == ["2", "b", "0.77"]


def test_closed_form_only_common_ops_and_the_window():
    # Rank 1's window has rotated further: ops 1-4 are gone there; only 5-20 count. Overlapping
    # ops (an async op issued before the previous one ended) leave no time outside between them.
    ledgers = [_ledger(20, 10, 2), _ledger(20, 10, 2)[4:]]
    ledgers[0][10] = (11, ledgers[0][9][2] - 1 * MS, ledgers[0][9][2] + 5 * MS)  # op 11 issued during op 10
    table = score_ledgers(ledgers, ["h", "h"])
    assert all(row.ops == 16 for row in table)
    by_rank = {row.rank: row for row in table}
    # Rank 0, ops 5-20: 15 gaps of 10 ms, except the one before op 11 (none: it arrived at 109 ms,
    # op 10 ended at 110) and the one after it (op 11 ended at 115, op 12 arrived at 132: 17 ms).
    assert by_rank[0].outside_ms == pytest.approx((13 * 10 + 0 + 17) / 15)
    assert by_rank[1].outside_ms == pytest.approx(10.0)
    assert table[0].rank == 1 and table[0].score == pytest.approx(147 / 150, rel=1e-3)
    assert score_ledgers(ledgers, ["h", "h"], window=4)[0].ops == 4
    empty = score_ledgers([[], [(1, 0, 5)]], ["h", "h"])
    assert [(row.ops, row.score) for row in empty] == [(0, 1.0), (0, 1.0)]
    # Back-to-back collectives on one rank (never outside): the others are not scored 0 for it.
    busy = [[(s, s * MS, (s + 1) * MS) for s in range(1, 21)], _ledger(20, 0.002, 0.998)]
    assert min(row.score for row in score_ledgers(busy, ["h", "h"])) > 0.8


@pytest.mark.parametrize("transport", ["shm", "tcp"])
@pytest.mark.parametrize("slow", [2, 0])
def test_a_rank_30_percent_slower_is_named_first_within_20_steps(transport, slow):
    results = run_ranks(sw.ddp_with_a_slow_rank, 4, slow, 20, sw.STEP_S, 1.3, env={"DDPLITE_CPU_TRANSPORT": transport})
    for rank, tables in enumerate(results):
        assert tables[20]["rows"] == results[0][20]["rows"], "every rank gets the same table"
        rows = tables[20]["rows"]
        named = rows[0]
        assert named[0] == slow, (rank, tables[20]["text"])
        # score in the sense of nvidia-resiliency-ext: 1/1.3 = 0.77 for the slow rank if the time
        # outside were only the sleeps; the others' contended compute raises it (sw.STEP_S: 0.86)
        assert 0.55 < named[2] < 0.92, tables[20]["text"]
        assert all(row[2] > named[2] for row in rows[1:]), tables[20]["text"]
        assert named[4] > 0.5, tables[20]["text"]  # it arrived last in most collectives
        assert named[3] > 1.0, tables[20]["text"]  # and made the others wait (15 ms more sleep per step)
        assert named[8] >= 20, tables[20]["text"]  # DDP's all_reduce per step, plus stragglers()'s own
    # After 10 steps it is named already.
    assert all(tables[10]["rows"][0][0] == slow for tables in results), results[0][10]["text"]


def test_bad_calls_and_a_fresh_group():
    outcomes, first = run_ranks(sw.stragglers_refused, 2)[1]
    assert outcomes["window_1"][0] == "ValueError" and "at least 2" in outcomes["window_1"][1]
    assert outcomes["window_str"][0] == "ValueError", outcomes
    assert len(first) == 2 and {row[0] for row in first} == {0, 1}


def test_a_gloo_group_is_refused():
    assert run_ranks(sw.gloo_group_refused, 2, backend="gloo") == ["the group's CPU backend is gloo, not ddplite"] * 2


def test_the_periodic_report_names_the_slow_rank_on_rank_0_only():
    """DDPLITE_STRAGGLER_REPORT=1: global rank 0 logs the default group's table every second from
    a thread of its own (no collective: the job calls nothing); the slow rank heads it. The other
    ranks log nothing."""
    env = {"DDPLITE_STRAGGLER_REPORT": "1"}
    logs = run_ranks(sw.ddp_under_the_report, 4, 3, 60, sw.STEP_S, 1.3, env=env)
    assert all("stragglers" not in log for log in logs[1:]), logs[1:]
    reports = logs[0].split("stragglers of the default group over its last ")[1:]
    assert len(reports) >= 2, logs[0]  # 60 steps of 50+ ms: 3 s and more, one report a second
    last = reports[-1].splitlines()
    assert "(DDPLITE_STRAGGLER_REPORT=1)" in last[0] and int(last[0].split()[0]) >= 16, logs[0]
    header, first = last[1].split(), last[2].split()
    assert header[3:6] == ["rank", "host", "score"], last  # after "[ddplite PID] INFO"
    assert first[3] == "3" and 0.55 < float(first[5]) < 0.92, logs[0]  # "[ddplite PID] INFO 3 host 0.77 ..."
    assert "not answering" not in logs[0] and "dead" not in logs[0], logs[0]

