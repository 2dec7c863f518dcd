"""The shared-memory arrival tree (DDPLITE_SHM_SYNC=tree; the default from 3 ranks on a host):
each rank adds itself to one counter per step and reads one word, instead of every peer's flag
(csrc/cpu/shm/arrival_tree.hpp, shm_group.cpp). Forced here at 2-5 ranks with a fan-in of 2, so
the trees have uneven nodes and 1-3 levels: every collective against the closed form and gloo,
mismatches, a killed rank, a rank that never arrives, abort, and the step counter's wrap."""

import re

import pytest

import review_workers as rw
import shm_workers
import sweeps
import workers
from harness import run_ranks
from test_shm import no_segment_left_behind  # noqa: F401 - autouse: nothing left in /dev/shm

TREE = {"DDPLITE_CPU_TRANSPORT": "shm", "DDPLITE_SHM_CHUNK_BYTES": "4096", "DDPLITE_SHM_SYNC": "tree",
        "DDPLITE_SHM_TREE_FANIN": "2"}
COUNTS = [0, 1, 3, 1000, 5000]


# 4 ranks in CI (two levels: {0,1} {2,3}, then the root); 3 and 5 ranks (a node of one) exhaustive;
# gather and scatter, swept at 3 ranks only, in CI.
SWEPT = [pytest.param(collective, world_size,
                      marks=[] if world_size == 4 or collective == "gather_scatter" else [pytest.mark.exhaustive])
         for collective in sorted(sweeps.SWEEPS) for world_size in (3, 4, 5)
         if collective != "gather_scatter" or world_size == 3]


@pytest.mark.parametrize("collective,world_size", SWEPT)
def test_sweep_through_the_arrival_tree(collective, world_size):
    results = run_ranks(sweeps.SWEEPS[collective], world_size, COUNTS, env=TREE, timeout_s=300)
    for result in results:
        assert result["failures"] == [], "\n".join(result["failures"][:20])
        assert result["checked"] >= len(workers.DTYPES) * len(COUNTS)


@pytest.mark.parametrize("world_size,expected", [
    (2, "an arrival tree (fan-in 2, 1 level)"),
    (4, "an arrival tree (fan-in 2, 2 levels)"),
    (5, "an arrival tree (fan-in 2, 3 levels)"),
])
def test_cpu_path_names_the_tree(world_size, expected):
    results = run_ranks(shm_workers.sync_description, world_size, env=TREE)
    total = float(sum(range(1, world_size + 1)))
    for result in results:
        assert result["path"][0] == "shm" and f"steps synchronise through {expected}" in result["path"][1], result
        assert result["sum"] == [total] * 5


@pytest.mark.parametrize("world_size,expected", [
    (2, "flat waits (each rank reads every peer's flag at every step)"),
    (3, "an arrival tree (fan-in 8, 1 level)"),
])
def test_auto_is_flat_at_two_ranks_and_a_tree_above(world_size, expected):
    results = run_ranks(shm_workers.sync_description, world_size, env={"DDPLITE_CPU_TRANSPORT": "shm"})
    for result in results:
        assert f"steps synchronise through {expected}" in result["path"][1], result


@pytest.mark.parametrize("kind", ["sizes", "dtypes"])
@pytest.mark.parametrize("odd_rank", [3, 0])
def test_one_rank_in_another_collective_is_named_on_every_rank(kind, odd_rank):
    """The completer of the node holding the odd rank records the disagreement; every rank raises
    after the step, naming a peer whose collective differs from its own: the odd rank names one
    of the others, the others name the odd rank."""
    results = run_ranks(shm_workers.one_rank_differs, 4, odd_rank, kind, env=TREE, pg_timeout_s=20)
    for rank, result in enumerate(results):
        assert result.get("raised") == "DistBackendError", (rank, result)
        message = result["message"]
        assert "collective mismatch" in message and "shared memory" in message, (rank, message)
        # the peer this rank names comes first; a quote of the group's first failure may follow
        named = int(re.match(r"rank (\d+) \(pid", message.split("collective mismatch: ", 1)[1]).group(1))
        if rank == odd_rank:
            assert named != odd_rank, (rank, message)
        else:
            assert named == odd_rank, (rank, message)


def test_rank_killed_mid_allreduce_is_reported_within_seconds():
    results = run_ranks(shm_workers.killed_mid_allreduce, 4, 2, 300_000, env=TREE, pg_timeout_s=60,
                        timeout_s=120, may_exit={2})
    for rank, result in enumerate(results):
        if rank == 2:
            continue
        assert result["type"] == "DistBackendError", result
        assert "rank 2" in result["message"], result["message"]
        assert "closed the connection" in result["message"] or "'s process ended" in result["message"], \
            result["message"]
        assert result["seconds"] < 5.0, result


def test_rank_that_never_arrives_is_named_at_the_timeout():
    results = run_ranks(workers.peer_never_arrives, 3, env=TREE, pg_timeout_s=2, timeout_s=60)
    for rank in (0, 2):
        outcome = results[rank]
        assert "Timed out waiting for rank 1" in outcome["message"], outcome["message"]
        assert 1.9 < outcome["elapsed"] < 4, outcome


def test_abort_fails_the_aborting_rank_s_pending_and_later_ops():
    results = run_ranks(workers.abort_fails_pending_and_later_ops, 3, env=TREE, pg_timeout_s=30)
    assert results[0]["raised"] == "DistBackendError" and "abort() was called on rank 0" in results[0]["message"]
    for rank in (1, 2):
        assert results[rank]["raised"] == "DistBackendError" and "rank 0" in results[rank]["message"], results[rank]


@pytest.mark.parametrize("connect", ["at_init", "on_demand"])
def test_abort_wakes_the_peers_waiting_in_the_tree(connect):
    """Rank 0 aborts while ranks 1 and 2 wait for it in the tree, and stays alive: they raise within
    2 s naming rank 0 and its abort (not at the 30 s timeout), whether the TCP mesh connected the
    pairs at init (its sockets close) or on demand (no socket: the segment says it)."""
    results = run_ranks(shm_workers.abort_while_peers_wait_in_the_tree, 3, env=dict(TREE, DDPLITE_CONNECT=connect),
                        pg_timeout_s=30)
    aborted_at = results[0]["aborted_at"]
    for rank in (1, 2):
        outcome = results[rank]
        assert outcome["raised"] == "DistBackendError", (rank, outcome)
        message = outcome["message"]
        assert "rank 0 (" in message and "Timed out" not in message, (rank, message)
        if connect == "on_demand":
            assert "aborted the process group (abort() on that rank)" in message, (rank, message)
        assert outcome["at"] - aborted_at < 2.0, (rank, outcome["at"] - aborted_at, message)


def test_steps_wrap_past_two_to_the_32():
    """Counters go by the step's parity and the release word is compared modulo 2^32: broadcasts
    (the root's deferred check) and all_reduces across the wrap stay right."""
    env = dict(TREE, DDPLITE_TEST_HOOKS="shm_first_step=4294967290")
    results = run_ranks(rw.broadcasts_across_the_wrap, 3, env=env, pg_timeout_s=20, timeout_s=120)
    assert results == [[]] * 3


def test_a_tolerated_difference_does_not_hide_a_later_mismatch():
    """all_gather and all_gather_into_tensor are one collective (the names differ, the steps do
    not): nothing is recorded for them, so rank 2's later dtype mismatch is named on every rank."""
    results = run_ranks(shm_workers.tolerated_then_real_mismatch, 4, 2, env=TREE, pg_timeout_s=20)
    for rank, result in enumerate(results):
        assert result["gathered"] == [float(r) for r in range(4) for _ in range(3)], (rank, result)
        assert result.get("raised") == "DistBackendError", (rank, result)
        named = int(re.match(r"rank (\d+) \(pid", result["message"].split("collective mismatch: ", 1)[1]).group(1))
        assert (named != 2) if rank == 2 else (named == 2), (rank, result["message"])


def test_rank_dying_between_its_flag_and_its_arrival_is_named_within_seconds():
    """Every flag of the step is stored, but the tree's root is never released: the waiters look at
    every peer's liveness once a slice has passed, instead of waiting for the 60 s timeout."""
    env = dict(TREE, DDPLITE_TEST_HOOKS="shm_exit_unarrived=1:3")
    results = run_ranks(shm_workers.dies_between_flag_and_arrival, 3, 1, env=env, pg_timeout_s=60, timeout_s=120,
                        may_exit={1})
    for rank in (0, 2):
        result = results[rank]
        assert result["type"] == "DistBackendError", (rank, result)
        assert "rank 1" in result["message"] and ("'s process ended" in result["message"] or
                                                  "closed the connection" in result["message"]), result["message"]
        assert result["seconds"] < 5.0, (rank, result)


def test_a_peer_that_left_after_its_arrival_is_not_reported_as_dead():
    """Every flag of a reduce's step is stored, the root waits for the tree, and a non-root that
    already arrived leaves (destroy, exit) while another still climbs: the root gets its sum
    (it used to raise that the departed rank's arrival never reached the group)."""
    env = dict(TREE, DDPLITE_TEST_HOOKS="shm_delay_arrival=1:2:1000")
    results = run_ranks(shm_workers.peer_leaves_after_its_arrival, 3, env=env, pg_timeout_s=60, timeout_s=120)
    assert results[0]["sum"] == [6.0] * 5, results[0]
    assert results[0]["seconds"] > 0.9, results[0]  # it did wait for rank 1's late arrival


@pytest.mark.parametrize("world_size,combine_delay_ms", [(4, 0), (5, 0), (4, 30)])
def test_small_allreduce_combined_on_arrival_has_the_flat_bits(world_size, combine_delay_ms):
    """With the tree, the rank that completes a step reduces for everyone (combined on arrival); the
    others copy its result. Same rank order as the flat path, so the same bits, on every rank; 16 KiB
    (4096 float32, 2048 float64): four 4 KiB chunks, each combined by whichever rank comes last.
    With a delay inside the combiner (DDPLITE_TEST_HOOKS=shm_combine_delay), a combiner that
    released the step before it wrote its result would hand the others stale bits."""
    env = dict(TREE, DDPLITE_TEST_HOOKS=f"shm_combine_delay={combine_delay_ms}") if combine_delay_ms else TREE
    results = run_ranks(shm_workers.combined_bits_equal_flat, world_size, [1, 3, 1000, 4096], env=env,
                        timeout_s=300)
    assert results == [[]] * world_size, results


@pytest.mark.parametrize("sync,world_size", [("tree", 4), ("tree", 5), ("flat", 4)])
def test_a_small_op_runs_on_the_caller_only_once_every_peer_started(sync, world_size):
    """Whether every peer has started an op: with the tree, one word (the root's started summary,
    raised bottom-up by each rank's markStarted); flat, every peer's. Neither may say yes while a
    rank has not started (rank 0 would run the op inline and wait for it), and both must say yes
    once all have: rank 0, calling last, then completes the op before all_reduce returns."""
    late = world_size - 1
    results = run_ranks(shm_workers.inline_once_every_peer_started, world_size, late, 3,
                        env=dict(TREE, DDPLITE_SHM_SYNC=sync), pg_timeout_s=20, timeout_s=120)
    assert True in results[0]["all started"], results[0]  # a "no" every time: the summary never got there
    assert results[0]["one late"] == [False] * 3, results[0]  # a "yes": it ran ahead of the late rank
    assert all(result["sums right"] for result in results), results


# NUMA: level 0 of the tree is formed within each NUMA node (arrival_tree.hpp). This VM has one
# node, so the layout is synthetic here: the shape through the extension, and whole jobs whose ranks
# say they run on node r % 2 (DDPLITE_TEST_HOOKS=shm_numa_nodes=2).

def tree_shape(ranks, fan_in, domains):
    import torch_ddp_lite

    return torch_ddp_lite._load_extension().arrival_tree_shape(ranks, fan_in, domains)


@pytest.mark.parametrize("ranks,fan_in,domains,leaves", [
    (8, 2, [], [[0, 1], [2, 3], [4, 5], [6, 7]]),
    (8, 2, [0] * 8, [[0, 1], [2, 3], [4, 5], [6, 7]]),
    (8, 2, [r % 2 for r in range(8)], [[0, 2], [4, 6], [1, 3], [5, 7]]),
    (5, 4, [0, 1, 0, 1, 0], [[0, 2, 4], [1, 3]]),
    (6, 4, [-1, 0, 0, 1, 1, 1], [[0, 1, 2, 3], [4, 5]]),  # a rank not pinned: no grouping
    (3, 8, [1, 0, 1], [[1], [0, 2]]),
])
def test_level_zero_of_the_tree_stays_within_a_numa_node(ranks, fan_in, domains, leaves):
    shape = tree_shape(ranks, fan_in, domains)
    assert shape["leaves"] == leaves, shape
    grouped = domains and min(domains) >= 0 and len(set(domains)) > 1
    assert shape["numa_nodes"] == (len(set(domains)) if grouped else 1), shape


def test_any_numa_layout_fits_the_segment_and_keeps_every_rank_once():
    """The segment is laid out before the ranks' nodes are known (ArrivalTree::nodeCapacity): no
    layout may need more nodes. Every rank arrives at exactly one leaf, leaves never mix NUMA nodes,
    a NUMA node of n ranks fills ceil(n / k) leaves, and above level 0 every member has a rank to
    stand for it (a completer compares their fingerprints)."""
    import random

    rng = random.Random(7)
    layouts = [(64, 8, list(range(64))), (64, 2, list(range(64))), (2, 64, [0, 1])]
    for _ in range(400):
        ranks = rng.randint(2, 80)
        layouts.append((ranks, rng.randint(2, 9), [rng.randint(-1, rng.randint(0, 6)) for _ in range(ranks)]))
    for ranks, fan_in, domains in layouts:
        shape = tree_shape(ranks, fan_in, domains)
        assert shape["node_count"] <= shape["capacity"], (ranks, fan_in, domains, shape)
        leaves = shape["leaves"]
        assert sorted(r for leaf in leaves for r in leaf) == list(range(ranks)), (ranks, fan_in, domains, leaves)
        if min(domains) < 0:  # a rank not pinned: ranks in order, as on one node
            assert leaves == [list(range(f, min(f + fan_in, ranks))) for f in range(0, ranks, fan_in)], leaves
            continue
        assert all(len({domains[r] for r in leaf}) == 1 for leaf in leaves), (domains, leaves)
        for node in set(domains):
            count = domains.count(node)
            assert sum(1 for leaf in leaves if domains[leaf[0]] == node) == -(-count // fan_in), (domains, leaves)
        assert all(-1 not in row for row in shape["representatives"][1:]), shape


def numa_node_from_sys():
    """numaNodeOfThisProcess's answer, from /sys and the affinity mask."""
    import os

    nodes = set()
    for cpu in os.sched_getaffinity(0):
        folder = f"/sys/devices/system/cpu/cpu{cpu}"
        entries = [e for e in os.listdir(folder) if re.fullmatch(r"node\d+", e)] if os.path.isdir(folder) else []
        nodes.add(int(entries[0][4:]) if entries else -1)
    return nodes.pop() if len(nodes) == 1 and -1 not in nodes else -1


def test_numa_node_of_this_process_follows_the_affinity_mask():
    import glob
    import os

    import torch_ddp_lite

    ext = torch_ddp_lite._load_extension()
    allowed = os.sched_getaffinity(0)
    try:
        assert ext.numa_node_of_this_process() == numa_node_from_sys()
        for cpu in sorted(allowed):  # pinned to one CPU: that CPU's node
            os.sched_setaffinity(0, {cpu})
            assert ext.numa_node_of_this_process() == numa_node_from_sys(), cpu
            if glob.glob(f"/sys/devices/system/cpu/cpu{cpu}/node*"):  # sysfs names its node: found
                assert ext.numa_node_of_this_process() >= 0, cpu
    finally:
        os.sched_setaffinity(0, allowed)


NUMA = dict(TREE, DDPLITE_TEST_HOOKS="shm_numa_nodes=2")


@pytest.mark.parametrize("collective", ["allreduce", "broadcast", "reduce_scatter", "allgather"])
def test_sweep_with_ranks_on_two_numa_nodes(collective):
    """5 ranks, fan-in 2, ranks 0, 2, 4 on node 0 and 1, 3 on node 1: leaves {0,2} {4} {1,3}."""
    results = run_ranks(sweeps.SWEEPS[collective], 5, COUNTS, env=NUMA, timeout_s=300)
    for result in results:
        assert result["failures"] == [], "\n".join(result["failures"][:20])
        assert result["checked"] >= len(workers.DTYPES) * len(COUNTS)


def test_cpu_path_names_the_numa_nodes():
    results = run_ranks(shm_workers.sync_description, 5, env=NUMA)
    for result in results:
        assert "steps synchronise through an arrival tree (fan-in 2, 3 levels; level 0 within each of 2 NUMA " \
               "nodes)" in result["path"][1], result
        assert result["sum"] == [15.0] * 5


@pytest.mark.parametrize("world_size,odd_rank", [(4, 1), (4, 2), (5, 4)])
def test_one_rank_in_another_collective_is_named_across_numa_nodes(world_size, odd_rank):
    """At 5 ranks rank 4 is alone in its leaf ({0,2} {4} {1,3}): only level 1 compares it, through
    the rank standing for that leaf."""
    results = run_ranks(shm_workers.one_rank_differs, world_size, odd_rank, "dtypes", env=NUMA, pg_timeout_s=20)
    for rank, result in enumerate(results):
        assert result.get("raised") == "DistBackendError", (rank, result)
        named = int(re.match(r"rank (\d+) \(pid", result["message"].split("collective mismatch: ", 1)[1]).group(1))
        assert (named != odd_rank) if rank == odd_rank else (named == odd_rank), (rank, result["message"])


def test_the_started_hint_with_ranks_on_two_numa_nodes():
    results = run_ranks(shm_workers.inline_once_every_peer_started, 5, 3, 3, env=NUMA, pg_timeout_s=20,
                        timeout_s=120)
    assert True in results[0]["all started"], results[0]
    assert results[0]["one late"] == [False] * 3, results[0]
    assert all(result["sums right"] for result in results), results
