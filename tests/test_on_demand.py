"""Connections on demand (DDPLITE_CONNECT, csrc/cpu/transport/tcp_on_demand.cpp): a
rank connects only to the peers it talks to, at the first transfer, and a peer that is gone is
reported, not waited for. Correctness on demand across every collective is in
tests/test_many_ranks.py (5 ranks, with and without authentication; 24 ranks by default),
tests/test_multihost.py (2+2-on-demand) and tests/test_auth.py (strangers during the job)."""

import pytest

import scale_workers
from harness import run_ranks

ON_DEMAND_TCP = {"DDPLITE_CPU_TRANSPORT": "tcp", "DDPLITE_CONNECT": "on_demand"}


@pytest.mark.parametrize("world_size", [3, 6])
def test_on_demand_a_rank_connects_only_to_the_peers_it_talks_to(world_size):
    """DDPLITE_CONNECT=on_demand: set-up connects nothing; ring all_reduces connect each rank to its
    two neighbours; an all_to_all then to every peer.
    Every value against the closed form."""
    env = {**ON_DEMAND_TCP, "DDPLITE_ALGO": "allreduce:ring"}
    results = run_ranks(scale_workers.connections_on_demand, world_size, env=env)
    for rank, counts in enumerate(results):
        assert counts["init"] == 0, (rank, counts)  # the harness's store is a file: no other TCP socket
        assert counts["ring"] - counts["init"] == 2, (rank, counts)
        assert counts["all_to_all"] - counts["init"] == world_size - 1, (rank, counts)


def test_two_ranks_connecting_to_each_other_at_once_keep_the_lower_rank_s_socket_without_a_stall():
    """Both ranks of a pair connect at the same moment (each holds its hello 300 ms after its connect,
    DDPLITE_TEST_HOOKS=tcp_hello_delay, so both connects are under way when the other's hello
    arrives): each listener keeps the connection made by the lower rank and refuses the other; the
    refused rank 1 then uses rank 0's at once, not after its 200 ms refusal wait. 5 rounds, fresh
    groups: one socket per pair, made by rank 0, the op done within the hold + 150 ms."""
    env = {**ON_DEMAND_TCP, "DDPLITE_TEST_HOOKS": "tcp_hello_delay=300"}
    results = run_ranks(scale_workers.simultaneous_connects, 2, 5, "all_reduce", env=env)
    for rank, rounds in enumerate(results):
        for round_, outcome in enumerate(rounds):
            assert outcome["right"] and outcome["added"] == 1, (rank, round_, outcome)
            assert outcome["made"] == (1 if rank == 0 else 0), (rank, round_, outcome)  # the tie-break by rank
            assert outcome["seconds"] < 0.45, (rank, round_, outcome)


def test_every_pair_connecting_at_once_ends_with_one_socket_per_pair():
    """6 ranks, 10 fresh groups, each starting with an all_to_all: every pair connects from both
    ends at once. Each rank must end each round with exactly one new socket per peer (a pair kept
    twice, or dropped, shows here) and the closed-form values."""
    results = run_ranks(scale_workers.simultaneous_connects, 6, 10, "all_to_all", env=ON_DEMAND_TCP)
    for rank, rounds in enumerate(results):
        for round_, outcome in enumerate(rounds):
            assert outcome["right"] and outcome["added"] == 5, (rank, round_, outcome)


def test_a_peer_killed_before_it_ever_connected_is_reported_within_seconds():
    """Rank 2 of 4 is killed before any collective: no pair with it was ever connected, so no
    socket ends to tell the others. Their all_reduce reaches its closed listener, and fails within
    a few seconds (not the group's 60 s timeout) naming rank 2."""
    results = run_ranks(scale_workers.peer_killed_before_connecting, 4, 2, env=ON_DEMAND_TCP, pg_timeout_s=60,
                        may_exit={2})
    for rank, outcome in enumerate(results):
        if rank == 2:
            continue
        assert outcome["raised"] == "DistBackendError", (rank, outcome)
        assert outcome["seconds"] < 20, (rank, outcome)
        assert "rank 2" in outcome["message"], (rank, outcome)
    # the ranks next to it in the ring reach its listener themselves
    assert any("refuses connections" in outcome["message"] for rank, outcome in enumerate(results) if rank != 2), \
        results


def test_a_recv_from_a_peer_killed_before_it_ever_connected_fails_within_seconds():
    """Over TCP on demand, rank 0 posts a recv from rank 2, which was killed before any transfer:
    no socket with it ever existed to end. The send/recv pump connects the pair the recv names
    (P2pLinks::reachAwaited), meets rank 2's closed listener, and the recv fails within seconds
    (not at the group's 60 s timeout), naming rank 2. A recv from rank 1 on the same pump
    completes."""
    results = run_ranks(scale_workers.recv_from_peer_killed_before_connecting, 3, 2, env=ON_DEMAND_TCP,
                        pg_timeout_s=60, may_exit={2})
    outcome = results[0]
    assert outcome["raised"] == "DistBackendError", outcome
    assert outcome["seconds"] < 15, outcome
    assert "rank 2" in outcome["message"] and "refuses connections" in outcome["message"], outcome
    assert outcome["from_one"] == [7.0] * 4, outcome


def test_a_wait_for_a_peer_s_unpublished_address_ends_with_destroy():
    """A pair's first connect reads the peer's address from the store, bounded by
    the transfer's deadline and abort(), not by the store's timeout. Rank 2's send/recv address is
    missing (as if it had died during init); rank 1's pump waits for it for a posted recv; rank 1's
    destroy_process_group must then return at once (it used to wait out the store's 60 s)."""
    results = run_ranks(scale_workers.destroy_while_a_recv_waits_for_an_address, 3, env=ON_DEMAND_TCP,
                        pg_timeout_s=60, timeout_s=200)
    outcome = results[1]
    assert outcome["destroy_seconds"] < 5.0, outcome
    assert outcome["recv"] == "DistBackendError", outcome
