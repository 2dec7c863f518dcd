"""The torch.distributed calls gloo serves and ddplite used to refuse (issue: parity with gloo),
each against gloo on the same calls, or the closed form where gloo lacks the call."""

import pytest

import parity_workers as pw
from harness import run_ranks

TIMEOUT_S = 1.0


def first_line(message):
    return message.split("\n")[0]


def run_monitored(backend, world_size, missing, wait_all):
    idle_s = TIMEOUT_S + (4 if backend == "gloo" else 2)  # past the arrived ranks' errors
    return run_ranks(pw.monitored_barrier, world_size, backend, set(missing), wait_all, TIMEOUT_S, idle_s,
                     pg_timeout_s=30)


@pytest.mark.parametrize("world_size,missing,wait_all", [(3, [1], False), (4, [1, 3], True)],
                         ids=["first-missing", "wait-all-ranks"])
def test_monitored_barrier_raises_where_gloo_raises_with_gloo_phrases(world_size, missing, wait_all):
    gloo = run_monitored("gloo", world_size, missing, wait_all)
    ours = run_monitored("ddplite", world_size, missing, wait_all)
    expected_sum = [float(sum(range(1, world_size + 1)))] * 2
    for rank in range(world_size):
        assert [o[0] for o in ours[rank]["passed"]] == [o[0] for o in gloo[rank]["passed"]] == ["ok", "ok"]
        assert ours[rank]["sum"] == expected_sum, "the group is not usable after a failed monitored_barrier"
        if rank in missing:
            assert ours[rank]["failed"] is None and gloo[rank]["failed"] is None
            continue
        ours_kind, ours_runtime, ours_message, ours_seconds = ours[rank]["failed"]
        gloo_kind, gloo_runtime, gloo_message, _ = gloo[rank]["failed"]
        assert gloo_kind == "RuntimeError" and ours_kind == "DistBackendError" and ours_runtime, ours[rank]
        # gloo's first line ("[Rank 0]: Rank 1 failed to pass monitoredBarrier in 1000 ms",
        # "Rank 2 successfully reached monitoredBarrier, but ...") is in ours, after our context
        assert first_line(gloo_message) in ours_message, (gloo_message, ours_message)
        assert f"ddplite rank {rank}/{world_size}, monitored_barrier #3" in ours_message
        assert ours_seconds < TIMEOUT_S + 2, ours[rank]  # arrived ranks hear rank 0's verdict at once
    failed = ", ".join(str(r) for r in missing)
    assert ("Ranks " if len(missing) > 1 else "Rank ") + f"{failed} failed to pass monitoredBarrier" \
        in first_line(ours[0]["failed"][2])
    for rank in set(range(1, world_size)) - set(missing):
        assert f"rank 0 reports that rank(s) {failed} failed to pass monitoredBarrier" in ours[rank]["failed"][2]


@pytest.mark.parametrize("world_size", [1, 2, 3, 4])
def test_monitored_barrier_names_the_rank_that_never_arrives(world_size):
    missing = [world_size - 1] if world_size > 1 else []
    results = run_monitored("ddplite", world_size, missing, False)
    for rank, result in enumerate(results):
        assert [o[0] for o in result["passed"]] == ["ok", "ok"]
        if world_size == 1:
            assert result["failed"][0] == "ok"
        elif rank == 0:
            assert f"[Rank 0]: Rank {world_size - 1} failed to pass monitoredBarrier in 1000 ms" in result["failed"][2]
            assert TIMEOUT_S - 0.1 < result["failed"][3] < TIMEOUT_S + 2, result["failed"]
        elif rank not in missing:
            assert f"Rank {rank} successfully reached monitoredBarrier" in result["failed"][2]


def test_monitored_barrier_with_no_time_left_matches_gloo():
    gloo = run_ranks(pw.monitored_barrier_rank0_alone, 3, "gloo")
    ours = run_ranks(pw.monitored_barrier_rank0_alone, 3, "ddplite")
    assert gloo[1:] == ours[1:] == [None, None]
    assert gloo[0][0] == "RuntimeError" and ours[0][0] == "DistBackendError"
    # Which of gloo's two phrases comes depends on whether a whole millisecond passed before rank 0
    # looked for rank 1 (gloo's rule, which ddplite follows): either is right, on both backends.
    phrases = ("[Rank 0]: Rank 1 failed to pass monitoredBarrier in 0 ms",
               "Rank 0 timed out in monitoredBarrier after 0 ms.")
    assert first_line(gloo[0][2]) in phrases, gloo[0]
    assert any(first_line(ours[0][2]).endswith(": " + phrase) for phrase in phrases), ours[0]


@pytest.mark.parametrize("world_size", [1, 2, 3, 4])
def test_all_gather_coalesced_matches_gloo_and_closed_form(world_size):
    results = run_ranks(pw.all_gather_coalesced, world_size)
    cases = sum(len(shapes) for shapes in pw.ALLGATHER_COALESCED_SHAPES) * len(pw.ALLGATHER_COALESCED_DTYPES)
    for result in results:
        assert result["failures"] == [], result["failures"][:10]
        assert result["checked"] == cases * world_size


@pytest.mark.parametrize("world_size", [2, 3])
def test_all_gather_coalesced_refuses_what_gloo_refuses(world_size):
    results = run_ranks(pw.all_gather_coalesced_refusals, world_size)
    for rank, result in enumerate(results):
        for name, outcome in result["outcomes"].items():
            assert outcome["gloo"][0] == "RuntimeError", (name, outcome)
            assert outcome["ddplite"][0] == "ValueError", (name, outcome)
            assert f"ddplite rank {rank}/{world_size}, allgather_coalesced" in outcome["ddplite"][2], outcome
        assert result["sum"] == [float(sum(range(1, world_size + 1)))] * 2


@pytest.mark.parametrize("world_size", [1, 2, 3, 4])
def test_coalescing_groups_ops_into_one_work(world_size):
    for rank, out in enumerate(run_ranks(pw.coalescing, world_size)):
        assert out["supports"] is True and out["gloo_supports"] is False
        if world_size > 1:
            # one Work for the group (gloo, which cannot coalesce, returns one per op); right values
            assert out["ring 5"] == out["ring 300000"] == (1, 2, True, True), out
            assert out["ring work"] == ("Work", True, True, 0, 2), out  # SUCCESS; both ops' tensors
        assert out["fast path"][0] == 1 and out["fast path ok"], out
        assert out["one by one"] == (1, True, True), out
        assert out["sync"] is True
        kind, message = out["end without start"]
        assert kind == "ValueError" and "endCoalescing without startCoalescing" in message, message


def test_a_failed_part_fails_the_coalesced_work_with_its_result():
    results = run_ranks(pw.coalesced_failure, 2, pg_timeout_s=2)
    kind, is_runtime, message = results[1]["failed"]
    assert kind == "DistBackendError" and "Timed out waiting for a message from rank 0" in message, message
    assert results[1]["result"] == 1  # WorkResult.TIMEOUT
    assert results[0]["sum"] == results[1]["sum"] == [3.0, 3.0]
