"""A live rank that leaves a group (abort(), a failure it saw, destroy_process_group) while its peers
wait for it: every peer raises a DistBackendError naming it within 2 s, as with a full mesh at
init, also when the pairs connect on demand (the default past 16 ranks on a host), where no socket
between the two may exist to close. Shared memory says it through the rank's
`departed` word (csrc/cpu/shm/shm_group.hpp); TCP on demand through the closed listener."""

import pytest

import departure_workers
from harness import run_ranks

BOUND_S = 2.0
SCENARIOS = ["abort", "reduce_dtype", "destroy"]
PATHS = {"shm": {"DDPLITE_CPU_TRANSPORT": "auto"}, "tcp": {"DDPLITE_CPU_TRANSPORT": "tcp"}}


def _check_named_in_time(name, rank, outcome, victims, left_at):
    assert outcome["raised"] == "DistBackendError", (name, rank, outcome)
    # named as the peer it waited for, or (a cascade: it waited for a rank that failed first) in
    # the first failure recorded in the group, which every error quotes: "ddplite rank 0/3, ..."
    assert any(f"rank {v} (" in outcome["message"] or f"ddplite rank {v}/" in outcome["message"] for v in victims), \
        (name, rank, outcome["message"])
    started = outcome["at"] - outcome["seconds"]
    waited = outcome["at"] - max(left_at, started)
    assert waited < BOUND_S, (name, rank, f"raised {waited:.2f} s after the victim left", outcome["message"])


def _check(outcomes, world_size):
    abort = outcomes["abort"]
    for rank in range(1, world_size):
        _check_named_in_time("abort", rank, abort[rank], [0], abort[0]["left_at"])
    destroy = outcomes["destroy"]
    for rank in [r for r in range(world_size) if r != 1]:
        _check_named_in_time("destroy", rank, destroy[rank], [1], destroy[1]["left_at"])
    reduce = outcomes["reduce_dtype"]
    victims = [rank for rank, outcome in enumerate(reduce) if outcome["victim"]]
    assert 0 in victims, reduce[0]  # the root sees the mismatch
    for victim in victims:
        assert reduce[victim]["first"]["raised"] == "DistBackendError", (victim, reduce[victim])
    left_at = max(reduce[victim]["left_at"] for victim in victims)
    for rank in [r for r in range(world_size) if r not in victims]:
        _check_named_in_time("reduce_dtype", rank, reduce[rank]["next"], victims, left_at)


@pytest.mark.parametrize("path", sorted(PATHS))
@pytest.mark.parametrize("world_size,connect", [(3, "on_demand"), (24, "auto")])
def test_every_peer_learns_within_seconds_that_a_live_rank_left(path, world_size, connect):
    """3 ranks connecting on demand, and 24 ranks on auto (on demand past 16), through shared
    memory and over TCP; group timeout 60 s, so a peer that waits for the timeout fails the bound."""
    env = {**PATHS[path], "DDPLITE_CONNECT": connect}
    results = run_ranks(departure_workers.departures, world_size, SCENARIOS, env=env, pg_timeout_s=60,
                        timeout_s=400)
    outcomes = {name: [result[name] for result in results] for name in SCENARIOS}
    _check(outcomes, world_size)
