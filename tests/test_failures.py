"""Failure paths: no hang, no crash; errors name the rank, the op, its sequence number and a hint."""

import pytest

import workers
from harness import run_ranks


@pytest.mark.parametrize("world_size,victim", [(2, 1), (3, 2), (4, 1)])
def test_rank_exit_is_reported_by_every_other_rank(world_size, victim):
    results = run_ranks(workers.rank_exits_midway, world_size, victim, 5, pg_timeout_s=60, timeout_s=120,
                        may_exit={victim})
    for rank, result in enumerate(results):
        if rank == victim:
            continue
        assert result["type"] == "DistBackendError", result
        assert result["is_dist_error"]
        assert f"rank {victim}" in result["message"], result["message"]
        assert f"ddplite rank {rank}/{world_size}, allreduce #" in result["message"]
        assert "Hint:" in result["message"]
        # Reported through the closed connection within moments, not at the 60 s group timeout:
        # a broken "peer closed" path that fell back on the timeout would fail here.
        assert "closed the connection" in result["message"], result["message"]
        assert result["seconds"] < 5.0, result


def test_exit_seen_while_only_receiving_is_reported_as_closed():
    """The end-of-stream path (recv returns 0) on its own: rank 0 only receives from rank 1,
    which exits; no send fails first with EPIPE or ECONNRESET to report it instead."""
    results = run_ranks(workers.receiver_sees_exit, 2, pg_timeout_s=60, timeout_s=120, may_exit={1},
                        env={"DDPLITE_CPU_TRANSPORT": "tcp"})
    result = results[0]
    assert result["type"] == "DistBackendError", result
    assert "rank 1" in result["message"] and "closed the connection (recv: end of stream)" in result["message"], \
        result["message"]
    assert result["seconds"] < 5.0, result


def test_wait_timeout_is_honoured():
    results = run_ranks(workers.wait_with_timeout, 2)
    outcome = results[0]
    assert outcome["raised"] == "DistBackendError", outcome
    assert outcome["is_dist_error"]
    assert "expired after 500 ms" in outcome["message"]
    assert outcome["elapsed"] < 2.5
    assert outcome["value"] == 3.0 and results[1]["value"] == 3.0


MISSING_PEER = {"tcp": "Timed out waiting to receive from rank 1",
                "auto": "Timed out waiting for rank 1 (pid "}  # shared memory: "... to post its data for step 1"


@pytest.mark.parametrize("transport", sorted(MISSING_PEER))
def test_group_timeout_names_the_missing_peer(transport):
    """A stuck peer (alive, connection open) is reported at the group's timeout, not before, on
    either path."""
    results = run_ranks(workers.peer_never_arrives, 2, pg_timeout_s=2, timeout_s=60,
                        env={"DDPLITE_CPU_TRANSPORT": transport})
    outcome = results[0]
    assert outcome["raised"], outcome
    assert MISSING_PEER[transport] in outcome["message"], outcome["message"]
    assert "ddplite rank 0/2, allreduce #1" in outcome["message"]
    assert 1.9 < outcome["elapsed"] < 4
    assert "unusable after an earlier failure" in outcome["second"]


@pytest.mark.parametrize("transport", ["tcp", "auto"])
@pytest.mark.parametrize("world_size,missing", [(3, [2]), (4, [2, 3]), (4, [1])])
def test_timeout_lists_every_rank_that_did_not_arrive(transport, world_size, missing):
    """Every rank that times out names all the ranks that never reached the collective (not only
    the neighbour it waited for), and none of those that did."""
    results = run_ranks(workers.some_ranks_never_arrive, world_size, missing, pg_timeout_s=3, timeout_s=60,
                        env={"DDPLITE_CPU_TRANSPORT": transport})
    expected = "rank(s) that did not arrive at this collective: " + ", ".join(map(str, missing)) + " ("
    for rank, outcome in enumerate(results):
        if rank in missing:
            continue
        assert outcome["raised"] == "DistBackendError", (rank, outcome)
        assert expected in outcome["message"], (rank, outcome["message"])
        assert outcome["elapsed"] < 6, (rank, outcome)


@pytest.mark.parametrize("scenario,expected", [("success", "SUCCESS"), ("timeout", "TIMEOUT"),
                                               ("dead_peer", "COMM_ERROR")])
def test_work_get_future_result_says_how_the_op_ended(scenario, expected):
    """work.get_future_result() (torch's WorkResult): SUCCESS, TIMEOUT when a peer never arrives
    within the group's timeout, COMM_ERROR when a peer is gone; asked before and after the op
    completes."""
    import torch

    results = run_ranks(workers.work_results, 2, scenario, pg_timeout_s=2, timeout_s=60, may_exit={1})
    outcome = results[0]
    wanted = int(torch._C._distributed_c10d.WorkResult.__members__[expected].value)
    assert outcome["early"] == wanted and outcome["late"] == wanted, (outcome, expected)
    if scenario == "success":
        assert outcome["value"] == 2.0


def test_invalid_inputs_raise_clear_errors_and_keep_the_group_usable():
    results = run_ranks(workers.invalid_inputs, 2)
    for rank, outcomes in enumerate(results):
        assert outcomes.pop("after") == [2.0] * 5
        for number, (name, outcome) in enumerate(outcomes.items(), start=1):
            assert outcome["raised"] in ("ValueError",), (name, outcome)
            assert f"ddplite rank {rank}/2" in outcome["message"], (name, outcome["message"])
            # a refused call still takes its number, on every rank alike (docs/reliability.md)
            assert f"#{number}:" in outcome["message"], (name, outcome["message"])
            assert "Hint:" in outcome["message"], (name, outcome["message"])


def test_abort_fails_later_collectives_on_every_rank():
    results = run_ranks(workers.abort_fails_pending_and_later_ops, 2, pg_timeout_s=30)
    assert results[0]["raised"] == "DistBackendError", results
    assert "abort() was called on rank 0" in results[0]["message"]
    assert results[1]["raised"] == "DistBackendError", results
    assert "rank 0" in results[1]["message"]


def test_socket_ifname_selects_interface(tmp_path):
    results = run_ranks(workers.init_with_interface, 2, str(tmp_path / "store"), "=lo", backend=None)
    assert all(r == {"raised": None, "value": [2.0, 2.0, 2.0]} for r in results), results


def test_socket_ifname_without_match_is_a_clear_error(tmp_path):
    results = run_ranks(workers.init_with_interface, 2, str(tmp_path / "store"), "=nosuchif0", backend=None)
    for result in results:
        assert result["raised"] == "DistBackendError", result
        assert "DDPLITE_SOCKET_IFNAME==nosuchif0 matches no IPv4 interface" in result["message"]
        assert "lo=127.0.0.1" in result["message"]  # lists what is available
