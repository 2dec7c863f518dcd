"""The shared-memory path (csrc/cpu/shm/; the default, pinned here with DDPLITE_CPU_TRANSPORT=shm):
every collective through one segment per group; send/recv through shared-memory channels.

Sweeps against the closed form and gloo (tests/sweeps.py) with a 4 KiB chunk, so that 1000 and
5000 elements span several chunks and both allreduce variants (reduce-all below 16 KiB,
reduce-scatter + allgather above) run; faults; mismatches; and nothing left in /dev/shm.
"""

import os
import time

import pytest
import torch

import shm_workers
import sweeps
import workers
from harness import RankFailed, run_ranks

SHM = {"DDPLITE_CPU_TRANSPORT": "shm", "DDPLITE_SHM_CHUNK_BYTES": "4096"}
COUNTS = [0, 1, 3, 1000, 5000]


@pytest.fixture(autouse=True)
def no_segment_left_behind():
    """Every test here must leave /dev/shm as it found it (normal exit, exception, kill -9)."""
    before = set(shm_workers.segments())
    yield
    deadline = time.monotonic() + 5
    while set(shm_workers.segments()) - before and time.monotonic() < deadline:
        time.sleep(0.1)
    assert set(shm_workers.segments()) - before == set(), "segments left in /dev/shm"


# A group of one rank has no segment (tests/test_collectives.py sweeps it); gather/scatter at 2-4
# ranks with the default chunk run in tests/test_collectives.py too.
SWEPT = [(collective, world_size) for collective in sorted(sweeps.SWEEPS) for world_size in (2, 3, 4)
         if collective != "gather_scatter" or world_size == 3]


@pytest.mark.parametrize("collective,world_size", SWEPT)
def test_sweep_on_shared_memory(collective, world_size):
    """Every collective through shared memory with a 4 KiB chunk, so 1000 and 5000 elements span
    several steps (gather, scatter and all_to_all: pieces of 4096 / P bytes per peer); the
    default-sized chunk runs in tests/test_collectives.py, where shared memory is the default."""
    results = run_ranks(sweeps.SWEEPS[collective], world_size, COUNTS, env=SHM, timeout_s=300)
    for rank, result in enumerate(results):
        assert result["failures"] == [], "\n".join(result["failures"][:20])
        assert result["checked"] >= len(workers.DTYPES) * len(COUNTS)


@pytest.mark.slow
@pytest.mark.parametrize("world_size", [2, pytest.param(3, marks=pytest.mark.exhaustive)])
def test_large_counts_on_shared_memory(world_size):
    """2^20+1 elements through the default 512 KiB chunk (many chunks, both buffers in turn);
    4 ranks run the same code with smaller counts above (kept out of CI's time on 2 cores), and
    3 ranks are `exhaustive` (scripts/test.sh --all)."""
    env = {"DDPLITE_CPU_TRANSPORT": "shm"}
    for collective in ("allreduce", "broadcast", "reduce", "allgather", "reduce_scatter"):
        results = run_ranks(sweeps.SWEEPS[collective], world_size, sweeps.LARGE_COUNTS,
                            [torch.float32, torch.bfloat16], env=env, timeout_s=600)
        for result in results:
            assert result["failures"] == [], "\n".join(result["failures"][:20])


@pytest.mark.parametrize("world_size", [2, 3, 4])
def test_half_precision_sums_round_once_like_torch(world_size):
    """fp16/bf16 accumulate in float32 over all ranks and round once (torch's stacked sum), bit
    for bit, on every reducing collective; with the default 512 KiB chunk, 4099 elements take the
    reduce-all variant, 100003 reduce-scatter + allgather, 300007 two chunks."""
    results = run_ranks(shm_workers.half_sums_rounded_once, world_size, [4099, 100003, 300007],
                        env={"DDPLITE_CPU_TRANSPORT": "shm"}, timeout_s=300)
    for result in results:
        assert result["failures"] == [], "\n".join(result["failures"][:10])
        assert result["checked"] >= 2 * 3 * 2


@pytest.mark.parametrize("world_size,transport", [(2, "auto"), (3, "shm"), (4, "auto"), (2, "tcp")])
def test_send_recv_through_shared_memory_channels(world_size, transport):
    """Every pair at once in both directions, from 0 bytes to 16x a channel's 256 KiB ring, then
    any-source receives: exact, through shared-memory channels on one host (TCP when pinned)."""
    sizes = [0, 1, 1000, 65536, 1 << 20]
    results = run_ranks(shm_workers.p2p_through_channels, world_size, sizes,
                        env={"DDPLITE_CPU_TRANSPORT": transport}, timeout_s=300)
    for result in results:
        assert result["failures"] == [], result["failures"][:5]
        assert result["path"] == ("TCP" if transport == "tcp" else "shared-memory channels")


def test_rank_killed_while_its_peer_receives_is_reported_within_seconds():
    results = run_ranks(shm_workers.killed_while_peer_receives, 2, pg_timeout_s=60, timeout_s=120, may_exit={1})
    outcome = results[0]
    assert outcome["type"] == "DistBackendError", outcome
    assert "rank 1" in outcome["message"] and "closed its point-to-point channels" in outcome["message"], outcome
    assert outcome["seconds"] < 5.0, outcome


def test_send_to_a_killed_rank_fails_within_seconds_not_at_the_timeout():
    """The pump has a send for the dead rank that does not fit its ring: it looks at the peer's
    process every 100 ms and fails the send with an error naming it (group timeout 60 s)."""
    results = run_ranks(shm_workers.killed_while_peer_sends, 2, pg_timeout_s=60, timeout_s=120, may_exit={1})
    outcome = results[0]
    assert outcome["type"] == "DistBackendError", outcome
    assert "rank 1" in outcome["message"] and "closed its point-to-point channels" in outcome["message"], outcome
    assert outcome["seconds"] < 5.0, outcome


@pytest.mark.parametrize("world_size", [2, 4])
def test_the_group_says_it_uses_shared_memory_and_unlinked_its_segment(world_size):
    results = run_ranks(shm_workers.transport_name, world_size, env=SHM)
    for result in results:
        assert result["transport"] == "shm"
    # unlinked once every rank attached: the group is alive, its name is gone
    assert all(set(result["segments"]) <= set(results[0]["segments"]) for result in results)


@pytest.mark.parametrize("world_size", [2, 3])
def test_barrier_synchronises_on_shared_memory(world_size, tmp_path):
    for late_rank in (0, world_size - 1):
        folder = tmp_path / f"late{late_rank}"
        folder.mkdir()
        results = run_ranks(workers.barrier_synchronises, world_size, str(folder), late_rank, 1.0, env=SHM)
        for rank, result in enumerate(results):
            assert result["missing"] == [], (rank, result)
            assert result["waited_s"] >= 0.9, (rank, result)


@pytest.mark.parametrize("kind", ["sizes", "ops", "dtypes", "roots"])
def test_mismatched_collectives_raise_instead_of_mixing_bytes(kind):
    """No rank returns a value made of another collective's bytes. A broadcast root only posts
    its data, so it may return (its own input, unchanged: as on TCP, where its send completes);
    then its next collective fails. Two ranks that both think they are the root: the one that
    posts last finds the other's post and raises at once; the other returns its own tensor and
    its next collective fails naming the roots."""
    results = run_ranks(shm_workers.mismatched_sizes, 2, kind, env=SHM, pg_timeout_s=20)
    for rank, result in enumerate(results):
        if kind == "ops" and rank == 0 and "value" in result:
            assert result["value"] == [1.0] * 8
        elif kind == "roots":
            # the root that posts last sees the other's post and checks at once; the first one
            # returns its own tensor and checks at its next step
            failed = result.get("message", "") if "value" not in result else result["next"]
            if "value" in result:
                assert result["value"] == [float(rank)] * 8, (rank, result)
            assert "collective mismatch" in failed and "root: " in failed and "broadcast #1" in failed, (rank, result)
        else:
            assert "value" not in result, (rank, result)
            assert result["raised"] == "DistBackendError", result
            assert "collective mismatch" in result["message"] and "shared memory" in result["message"], result
        assert result["next"] != "returned", (rank, result)


@pytest.mark.parametrize("world_size,victim", [(2, 1), (3, 0), (4, 2)])
def test_rank_killed_mid_allreduce_is_reported_within_seconds(world_size, victim):
    """kill -9 of a rank while the others wait inside a large shared-memory allreduce (group
    timeout 60 s): every survivor raises a DistBackendError naming it within a few seconds, and
    no segment is left (the fixture)."""
    results = run_ranks(shm_workers.killed_mid_allreduce, world_size, victim, 300_000, env=SHM, pg_timeout_s=60,
                        timeout_s=120, may_exit={victim})
    for rank, result in enumerate(results):
        if rank == victim:
            continue
        assert result["type"] == "DistBackendError", result
        assert f"rank {victim}" in result["message"], result["message"]
        # Two signs of its death race: its socket in the TCP mesh closes, its process ends.
        assert "closed the connection" in result["message"] or "'s process ended" in result["message"], \
            result["message"]
        assert result["seconds"] < 5.0, result


# "100000": the longest spin DDPLITE_SHM_SPIN_US allows (100 ms). Under it a wait still ends with
# the right error at the op's timeout and when the peer aborts (the bound of the spin by the
# deadline is below what these timings can tell on a shared 2-core machine: 100 ms at most).
LONG_SPIN = {"DDPLITE_SHM_SPIN_US": "100000"}


@pytest.mark.parametrize("spin", [{}, LONG_SPIN], ids=["default-spin", "long-spin"])
def test_rank_that_never_arrives_is_named_at_the_timeout(spin):
    results = run_ranks(workers.peer_never_arrives, 2, env=dict(SHM, **spin), pg_timeout_s=2, timeout_s=60)
    outcome = results[0]
    assert "Timed out waiting for rank 1" in outcome["message"], outcome["message"]
    assert "shared memory" in outcome["message"] and "ddplite rank 0/2, allreduce #1" in outcome["message"]
    assert 1.9 < outcome["elapsed"] < 4
    assert "unusable after an earlier failure" in outcome["second"]


@pytest.mark.parametrize("spin", [{}, LONG_SPIN], ids=["default-spin", "long-spin"])
def test_abort_wakes_the_peer_waiting_in_shared_memory(spin):
    results = run_ranks(workers.abort_fails_pending_and_later_ops, 2, env=dict(SHM, **spin), pg_timeout_s=30)
    assert results[0]["raised"] == "DistBackendError" and "abort() was called on rank 0" in results[0]["message"]
    assert results[1]["raised"] == "DistBackendError" and "rank 0" in results[1]["message"]


def test_segment_that_cannot_be_created_is_a_clear_error_when_pinned(tmp_path):
    """Rank 0 cannot reserve the segment (a file-size limit stands in for a full /dev/shm):
    every rank's init raises, naming the reason; nothing is left behind (the fixture)."""
    env = dict(SHM, DDPLITE_SHM_CHUNK_BYTES=str(1 << 20))  # a 4 MiB segment against a 64 KiB limit
    results = run_ranks(shm_workers.init_with_small_file_limit, 2, str(tmp_path / "store"), env=env, backend=None)
    for rank, result in enumerate(results):
        assert result["raised"] == "DistBackendError", result
        assert f"ddplite rank {rank}/2, init #0: DDPLITE_CPU_TRANSPORT=shm, but this group cannot use shared memory" \
            in result["message"], result["message"]
        assert "reserving" in result["message"] and "File too large" in result["message"], result["message"]
        assert "unset DDPLITE_CPU_TRANSPORT" in result["message"]


def test_segment_that_cannot_be_created_falls_back_to_tcp_under_auto(tmp_path):
    """The same failure with DDPLITE_CPU_TRANSPORT unset (auto): the group runs over TCP, says why,
    and its collectives give the closed form."""
    env = {"DDPLITE_SHM_CHUNK_BYTES": str(1 << 20)}
    results = run_ranks(shm_workers.init_with_small_file_limit, 2, str(tmp_path / "store"), env=env, backend=None)
    for result in results:
        assert result["raised"] is None, result
        path, why = result["path"]
        assert path == "tcp" and why.startswith("DDPLITE_CPU_TRANSPORT=auto, and no shared memory: "), why
        assert "File too large" in why, why
        assert result["sum"] == [3.0]


@pytest.mark.parametrize("world_size", [1, 2, 3])
def test_the_default_is_shared_memory_and_says_why(world_size):
    results = run_ranks(shm_workers.cpu_paths, world_size)
    for rank, paths in enumerate(results):
        expected = ("tcp", "a group of one rank exchanges nothing") if world_size == 1 else \
            ("shm", f"DDPLITE_CPU_TRANSPORT=auto, and all {world_size} ranks share this host; steps synchronise "
                    "through " + ("flat waits (each rank reads every peer's flag at every step)" if world_size == 2
                                  else "an arrival tree (fan-in 8, 1 level)"))
        assert paths["world"] == expected, paths
        assert paths["sum"] == [float(world_size)] * 3
        if world_size > 1 and rank < 2:
            assert paths["pair"] == ("shm", "DDPLITE_CPU_TRANSPORT=auto, and all 2 ranks share this host; steps "
                                            "synchronise through flat waits (each rank reads every peer's flag at every step)")
            assert paths["pair_sum"] == [float(world_size) * 2] * 3
        assert "not ddplite" in paths["gloo"], paths


def test_pinned_tcp_says_so():
    results = run_ranks(shm_workers.cpu_paths, 2, env={"DDPLITE_CPU_TRANSPORT": "tcp"})
    assert all(paths["world"] == ("tcp", "DDPLITE_CPU_TRANSPORT=tcp") for paths in results), results


SETTINGS_THAT_DIFFER = {
    "transport": ({"DDPLITE_CPU_TRANSPORT": "tcp"}, "DDPLITE_CPU_TRANSPORT='tcp' here, 'auto' on rank 0",
                  "DDPLITE_CPU_TRANSPORT='auto' here, 'tcp' on rank 1"),
    "chunk": ({"DDPLITE_SHM_CHUNK_BYTES": "8192"}, "DDPLITE_SHM_CHUNK_BYTES='8192' here, '524288' on rank 0",
              "DDPLITE_SHM_CHUNK_BYTES='524288' here, '8192' on rank 1"),
    "sync": ({"DDPLITE_SHM_SYNC": "tree"}, "DDPLITE_SHM_SYNC='tree' here, 'auto' on rank 0",
             "DDPLITE_SHM_SYNC='auto' here, 'tree' on rank 1"),
    "fanin": ({"DDPLITE_SHM_TREE_FANIN": "4"}, "DDPLITE_SHM_TREE_FANIN='4' here, '8' on rank 0",
              "DDPLITE_SHM_TREE_FANIN='8' here, '4' on rank 1"),
    "fingerprint": ({"DDPLITE_FINGERPRINT": "0"}, "DDPLITE_FINGERPRINT='0' here, '1' on rank 0",
                    "DDPLITE_FINGERPRINT='1' here, '0' on rank 1"),
    # a rank with the status query on waits for rank 0's status secret, which a rank 0 with it off never writes
    "status": ({"DDPLITE_STATUS": "0"}, "DDPLITE_STATUS='0' here, '1' on rank 0", "DDPLITE_STATUS='1' here, '0' on rank 1"),
}


@pytest.mark.parametrize("case", sorted(SETTINGS_THAT_DIFFER))
def test_settings_that_differ_between_ranks_fail_init_on_every_rank(case, tmp_path):
    """A rank with another DDPLITE_CPU_TRANSPORT (or chunk, or fingerprint switch) would wait on a
    path its peers never take: init_process_group raises a ValueError on both, naming the knob,
    both values and the peer, within seconds."""
    settings, on_rank_1, on_rank_0 = SETTINGS_THAT_DIFFER[case]
    start = time.monotonic()
    results = run_ranks(shm_workers.init_with_own_settings, 2, str(tmp_path / "store"), {1: settings}, backend=None,
                        timeout_s=60)
    assert time.monotonic() - start < 30
    for rank, expected in ((0, on_rank_0), (1, on_rank_1)):
        assert results[rank]["raised"] == "ValueError", results[rank]
        assert f"ddplite rank {rank}/2, init #0: the ranks of this group run with different settings: " \
               f"{expected}" in results[rank]["message"], results[rank]["message"]


def test_fan_in_is_not_compared_when_every_group_waits_flat(tmp_path):
    """DDPLITE_SHM_TREE_FANIN shapes only arrival trees: with DDPLITE_SHM_SYNC=flat on every rank,
    a different fan-in on one rank changes nothing, so init goes through."""
    settings = {0: {"DDPLITE_SHM_SYNC": "flat"}, 1: {"DDPLITE_SHM_SYNC": "flat", "DDPLITE_SHM_TREE_FANIN": "4"}}
    results = run_ranks(shm_workers.init_with_own_settings, 2, str(tmp_path / "store"), settings, backend=None,
                        timeout_s=60)
    for result in results:
        assert result["raised"] is None, result
        assert "flat waits" in result["path"][1], result


def test_chunk_knob_is_bounded():
    with pytest.raises(RankFailed) as failure:
        run_ranks(shm_workers.transport_name, 2, env=dict(SHM, DDPLITE_SHM_CHUNK_BYTES=str(1 << 42)))
    assert "DDPLITE_SHM_CHUNK_BYTES='4398046511104' is not a valid value; use a whole number of bytes >= 4096 " \
        "and <= 1073741824" in str(failure.value)


def test_two_jobs_at_once_never_share_a_segment():
    """Two 2-rank jobs on the same machine at the same time, each checked against its closed form."""
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(2) as pool:
        outcomes = list(pool.map(_one_job, [0, 1]))
    assert outcomes == ["ok", "ok"], outcomes


def _one_job(job):
    results = run_ranks(sweeps.SWEEPS["allreduce"], 2, [1000, 5000], [torch.float32, torch.int64], env=SHM)
    return "ok" if all(result["failures"] == [] for result in results) else str(results)


def test_settings_that_differ_on_one_rank_of_three_name_it_on_every_rank(tmp_path):
    """Each rank compares its settings with rank 0's and the first rank that differs is recorded in
    the store (O(1) store traffic per rank): ranks 0 and 1 name rank 2's value, rank 2 names rank 0's."""
    results = run_ranks(shm_workers.init_with_own_settings, 3, str(tmp_path / "store"),
                        {2: {"DDPLITE_SHM_CHUNK_BYTES": "8192"}}, backend=None, timeout_s=60)
    expected = {0: "DDPLITE_SHM_CHUNK_BYTES='524288' here, '8192' on rank 2",
                1: "DDPLITE_SHM_CHUNK_BYTES='524288' here, '8192' on rank 2",
                2: "DDPLITE_SHM_CHUNK_BYTES='8192' here, '524288' on rank 0"}
    for rank, text in expected.items():
        assert results[rank]["raised"] == "ValueError", results[rank]
        assert f"ddplite rank {rank}/3, init #0: the ranks of this group run with different settings: {text}" \
            in results[rank]["message"], results[rank]["message"]
