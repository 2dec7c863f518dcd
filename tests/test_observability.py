"""What users see of ddplite: torch.profiler spans, Work._get_duration and the flight
recorder's times, thread names, and pg_options honoured or refused. gloo is the oracle where it
has the feature (its profiler spans); closed forms elsewhere."""

from datetime import timedelta

import pytest

import observability_workers as ow
import torch_ddp_lite
from harness import run_ranks

OPS = ["all_reduce", "broadcast", "all_gather_into_tensor", "reduce_scatter_tensor", "barrier"]


def _store_path(tmp_path):
    return str(tmp_path / "store")


@pytest.mark.parametrize("world_size", [2, 4])
def test_every_op_shows_in_the_profiler_like_gloos(world_size):
    gloo = run_ranks(ow.profiled_ops, world_size, backend="gloo")
    ours = run_ranks(ow.profiled_ops, world_size, env={"DDPLITE_CPU_TRANSPORT": "shm"})
    for rank in range(world_size):
        assert ours[rank]["wrong"] == [] and gloo[rank]["wrong"] == [], (ours[rank]["wrong"], gloo[rank]["wrong"])
        assert ours[rank]["late_sum"] == [float(world_size)] * 7
        counts = ours[rank]["counts"]
        assert counts.get("ddplite:all_reduce") == 2, counts  # the every-op one and the late one
        for op in OPS[1:]:
            assert counts.get(f"ddplite:{op}", 0) >= 1, (op, counts)
        assert counts.get("ddplite:send") == 1 and counts.get("ddplite:recv") == 1, counts
        # gloo, on the same calls, shows its own spans: ddplite shows at least as many kinds.
        assert len(counts) >= len([k for k in gloo[rank]["counts"] if k != "gloo:all_reduce_coalesced"]), \
            (counts, gloo[rank]["counts"])
        # record_shapes: the inputs' shapes, as torch records them for gloo's spans.
        assert sorted(ours[rank]["shapes"]) == [[[6]], [[7]]], ours[rank]["shapes"]
        assert [[6]] in gloo[rank]["shapes"] and [[7]] in gloo[rank]["shapes"], gloo[rank]["shapes"]
        # The Chrome trace holds the spans; the late all_reduce's covers its asynchronous part.
        spans = ours[rank]["durations_us"]
        assert len(spans.get("ddplite:all_reduce", [])) == 2, spans
    waited = max(ours[0]["durations_us"]["ddplite:all_reduce"])
    assert ours[0]["returned_after_s"] < 0.25, ours[0]["returned_after_s"]  # the call itself returned early
    assert waited >= 250_000, f"rank 0's late all_reduce span lasted only {waited} us"


def test_no_profiler_no_spans_and_the_op_still_runs():
    assert run_ranks(ow.spans_off_when_not_profiling, 2) == [[2.0] * 3] * 2


@pytest.mark.parametrize("world_size", [1, 2, 3])
def test_durations_are_positive_bounded_by_wall_time_and_in_the_flight_recorder(world_size):
    results = run_ranks(ow.timed_ops, world_size)
    for rank, out in enumerate(results):
        kind, message = out["untimed"]
        assert kind == "RuntimeError" and "_enable_collectives_timing" in message and f"rank {rank}/" in message, \
            out["untimed"]
        for count, duration_ms, wall_ms, right in out["timed"]:
            assert right, (rank, count)
            assert 0.0 < duration_ms <= wall_ms, (rank, count, duration_ms, wall_ms)
        if rank == 0 and world_size > 1:
            kind, message = out["early"]
            assert kind == "RuntimeError" and "before the op completed" in message, out["early"]
        assert out["late"] > 0.0
        if world_size > 1:
            for duration_ms, wall_ms in out["p2p"]:
                assert 0.0 < duration_ms <= wall_ms, (rank, duration_ms, wall_ms)
        trace = out["trace"]
        assert trace, rank
        timed = [entry for entry in trace if entry[5] is not None]
        # Every entry after _enable_collectives_timing: 3 all_reduces, a barrier, the late one,
        # and the send and recv; the first all_reduce was not timed.
        assert len(timed) == len(trace) - 1 == 5 + (2 if world_size > 1 else 0), trace
        assert trace[0][5] is None
        for name, state, created, started, completed, duration in trace:
            assert state == "completed" and created <= started <= completed, (name, created, started, completed)
            if duration is not None:
                assert duration == pytest.approx((completed - started) / 1e6, abs=1e-3)
    if world_size > 1:
        # Rank 0's late op started at once and waited 0.5 s for rank 1.
        assert results[0]["late"] >= 400.0, results[0]["late"]


@pytest.mark.parametrize("world_size", [2, 4])
@pytest.mark.parametrize("transport", ["shm", "tcp"])
def test_every_thread_ddplite_starts_is_named(tmp_path, world_size, transport):
    """Every thread is named, and their number does not grow with the group: send/recv
    to every peer run on one pump, ddplite-p2p-shm in a group on one host, ddplite-p2p-tcp over
    TCP; no thread per peer; one ddplite-status per process (the live status query's listener)."""
    results = run_ranks(ow.thread_names, world_size, _store_path(tmp_path), backend=None,
                        env={"DDPLITE_CPU_TRANSPORT": transport})
    for rank, out in enumerate(results):
        assert out["wrong"] == [], out["wrong"]
        new = out["new"]
        assert all(name.startswith("ddplite-") for name in new), (rank, new)
        assert sorted(new) == sorted({"ddplite-worker", "ddplite-arrival", f"ddplite-p2p-{transport}",
                                                   "ddplite-status"}), (rank, new)


def test_pg_options_honoured_by_init_and_new_group(tmp_path):
    results = run_ranks(ow.init_with_options, 2, _store_path(tmp_path), "honoured", backend=None, timeout_s=120)
    for rank, out in enumerate(results):
        assert out["options_timeout_s"] == 3.0 and out["group_timeout_s"] == 9.0, out
        assert out["pair_sum"] == [2.0, 2.0]
        kind, message = out["new_group_gloo"]
        assert kind == "ValueError" and "not ddplite's options" in message and "torch_ddp_lite.Options" in message, \
            out["new_group_gloo"]
    kind, message = results[0]["stalled"]
    assert kind == "DistBackendError", results[0]["stalled"]
    assert 2.5 <= results[0]["stalled_after_s"] <= 7.0, results[0]["stalled_after_s"]


@pytest.mark.parametrize("case, expected", [
    ("gloo_options", "not ddplite's options"),
    ("disagreeing_timeouts", "disagree"),
])
def test_pg_options_refused_on_every_rank(tmp_path, case, expected):
    results = run_ranks(ow.init_with_options, 2, _store_path(tmp_path), case, backend=None, timeout_s=120)
    for rank, (kind, message) in enumerate(results):
        assert kind == "ValueError" and expected in message and f"rank {rank}/2" in message, (rank, kind, message)


def test_effective_timeout_rules():
    from torch.distributed.constants import default_pg_timeout

    from torch_ddp_lite.options import effective_timeout

    minute = timedelta(minutes=1)
    assert effective_timeout(minute, None, 0, 2) == minute
    assert effective_timeout(default_pg_timeout, torch_ddp_lite.Options(timeout=minute), 0, 2) == minute
    assert effective_timeout(minute, torch_ddp_lite.Options(), 0, 2) == minute
    assert effective_timeout(minute, torch_ddp_lite.Options(timeout=minute), 0, 2) == minute
    with pytest.raises(ValueError, match="disagree"):
        effective_timeout(minute, torch_ddp_lite.Options(timeout=2 * minute), 1, 2)
    with pytest.raises(ValueError, match="rank 1/2.*not ddplite's options"):
        effective_timeout(minute, object(), 1, 2)
    assert torch_ddp_lite.Options()._timeout == default_pg_timeout
    assert torch_ddp_lite.Options(timeout=minute).backend == "ddplite"
