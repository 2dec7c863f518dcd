"""torch.distributed.shrink_group on ddplite groups: the survivors of a killed (or hung) rank form
a smaller group in place and carry on with correct values."""

import pytest
import torch
import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d

import shrink_workers
from harness import run_ranks

pytestmark = pytest.mark.skipif(not hasattr(dist, "shrink_group"), reason="torch without shrink_group")


def _check_round(outcome, survivors):
    """`survivors`: global ranks left after the shrink, in order; outcome from one survivor."""
    assert outcome["failed"] == outcome["expected"], outcome  # torch_ddp_lite.failed_ranks, agreed
    size = len(survivors)
    assert outcome["size"] == size, outcome
    assert outcome["sum"] == sum(r + 1 for r in survivors), outcome
    assert outcome["gathered"] == [float(r) for r in range(size)], outcome
    assert torch.equal(outcome["broadcast"], torch.arange(5.0) * size), outcome


@pytest.mark.parametrize("transport", ["tcp", "auto"])
@pytest.mark.parametrize("world_size,victim", [(3, 2), (4, 1)])
def test_survivors_shrink_after_a_kill_and_get_closed_forms(transport, world_size, victim):
    results = run_ranks(shrink_workers.shrink_after_failures, world_size, [victim], "kill", c10d.SHRINK_DEFAULT,
                        pg_timeout_s=60, timeout_s=150, may_exit={victim}, env={"DDPLITE_CPU_TRANSPORT": transport})
    survivors = [r for r in range(world_size) if r != victim]
    for rank in survivors:
        (outcome,) = results[rank]
        assert outcome["error"][0] == "DistBackendError" and f"rank {victim}" in outcome["error"][1], outcome["error"]
        assert outcome["rank"] == survivors.index(rank), outcome
        _check_round(outcome, survivors)
        assert outcome["recovered"] < 10, outcome  # a new group in seconds, not the 60 s timeout
        # the victim's ended process is seen through its pidfd: no waiting out failed_ranks' 2 s
        assert outcome["agreed"] - outcome["noticed"] < 1.5, outcome
        print(f"{transport} {world_size} ranks, rank {victim} killed: rank {rank} raised after "
              f"{outcome['noticed']:.2f} s, failed_ranks() agreed after {outcome['agreed']:.2f} s, first correct all_reduce on the shrunk group after {outcome['recovered']:.2f} s")


def test_shrink_twice():
    results = run_ranks(shrink_workers.shrink_after_failures, 4, [3, 1], "kill", c10d.SHRINK_DEFAULT,
                        pg_timeout_s=60, timeout_s=150, may_exit={1, 3})
    for rank in (0, 2):
        first, second = results[rank]
        _check_round(first, [0, 1, 2])
        _check_round(second, [0, 2])
        assert second["rank"] == [0, 2].index(rank), second


def test_shrink_abort_after_a_hang():
    """Rank 2 of 3 stops (SIGSTOP): the survivors time out naming it, then shrink with SHRINK_ABORT."""
    results = run_ranks(shrink_workers.shrink_after_failures, 3, [2], "stop", c10d.SHRINK_ABORT,
                        pg_timeout_s=3, timeout_s=150, may_exit={2})
    for rank in (0, 1):
        (outcome,) = results[rank]
        assert outcome["error"][0] == "DistBackendError" and "rank 2" in outcome["error"][1], outcome["error"]
        assert 2.5 < outcome["noticed"] < 10, outcome
        _check_round(outcome, [0, 1])


def test_survivors_that_disagree_about_who_is_gone_raise_and_say_so():
    results = run_ranks(shrink_workers.shrink_with_disagreeing_lists, 4, pg_timeout_s=20, timeout_s=150,
                        may_exit={3})
    for rank in (0, 1, 2):
        outcome = results[rank]
        assert outcome["raised"] == "DistBackendError", (rank, outcome)
        assert "the survivors must agree" in outcome["message"] and "excludes [1, 3]" in outcome["message"], outcome
        assert "excludes [3]" in outcome["message"] and "Hint:" in outcome["message"], outcome
        assert outcome["seconds"] < 15, outcome


def test_a_survivor_that_comes_after_the_others_gave_up_raises_at_once_and_both_retry():
    """One decision per shrink: rank 0 gives up on rank 1 at the group's
    timeout; rank 1, 2 s later, finds that decision and raises within seconds instead of blocking
    in a new group nobody else joins. The retry carries the same shrink number on both and works."""
    timeout_s = 4
    results = run_ranks(shrink_workers.shrink_with_a_late_survivor, 3, timeout_s, pg_timeout_s=timeout_s,
                        timeout_s=150, may_exit={2})
    for rank in (0, 1):
        outcome = results[rank]
        first = outcome["first"]
        assert first["raised"] == "DistBackendError", (rank, first)
        assert "shrink #1 without [2] was abandoned by rank 0: rank 1 did not join it" in first["message"], first
        assert "Hint:" in first["message"], first
        _check_round({**outcome, "failed": [2], "expected": [2]}, [0, 1])
        assert outcome["rank"] == rank, outcome
    assert timeout_s - 0.5 < results[0]["first"]["seconds"] < timeout_s + 3, results[0]["first"]
    assert results[1]["first"]["seconds"] < 2.0, results[1]["first"]  # at once, not at its own timeout


def test_a_live_rank_the_survivors_exclude_cannot_cancel_their_shrink():
    """The decision of a shrink is keyed by its list: rank 2, alive but excluded by ranks 0 and 1,
    shrinks with a list of its own first and raises (they declared it failed); ranks 0 and 1 still
    get their 2-rank group."""
    results = run_ranks(shrink_workers.shrink_while_an_excluded_live_rank_disagrees, 4, pg_timeout_s=20,
                        timeout_s=150, may_exit={3})
    outcome = results[2]
    assert outcome["raised"] == "DistBackendError", outcome
    assert "rank 2 among them" in outcome["message"] and "excludes [2, 3]" in outcome["message"], outcome
    for rank in (0, 1):
        outcome = results[rank]
        assert outcome["raised"] is None, (rank, outcome)
        _check_round({**outcome, "failed": [2, 3], "expected": [2, 3]}, [0, 1])


def test_failed_ranks_is_empty_when_all_live_and_names_a_late_caller_everywhere():
    results = run_ranks(shrink_workers.failed_ranks_when_all_live_and_with_a_late_caller, 3, pg_timeout_s=30,
                        timeout_s=120)
    for rank, outcome in enumerate(results):
        assert outcome["everyone"] == [], outcome
        if rank < 2:
            assert outcome["second"] == [2], outcome
        else:
            kind, message = outcome["second"]
            assert kind == "DistBackendError" and "the other ranks declared this rank failed" in message, message
            assert "Hint:" in message, message


def test_shrink_a_subgroup():
    results = run_ranks(shrink_workers.shrink_a_subgroup, 4, pg_timeout_s=30, timeout_s=120, may_exit={2})
    for rank in (0, 1):
        assert results[rank] == {"failed": [2], "size": 2, "rank": rank, "sum": [3.0] * 5}, results[rank]


def test_an_excluded_rank_that_calls_shrink_raises_and_the_survivors_carry_on():
    results = run_ranks(shrink_workers.excluded_rank_calls_shrink, 3, pg_timeout_s=30, timeout_s=120)
    for rank in (0, 1):
        outcome = results[rank]
        assert outcome["failed"] == [2] and outcome["size"] == 2, outcome
        assert outcome["sum"] == 3.0 and outcome["gathered"] == [0.0, 1.0], outcome
    late = results[2]
    assert late["raised"] in ("DistBackendError", "RuntimeError", "ValueError"), late
    assert "excludes [2], rank 2 among them" in late["message"] and "a rank they declared failed" in late["message"] \
        and "Hint:" in late["message"], late
    assert late["seconds"] < 15, late
