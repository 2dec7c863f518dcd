"""Connections on demand (DDPLITE_CONNECT, csrc/cpu/transport/tcp_on_demand.cpp; issue 27): a
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
