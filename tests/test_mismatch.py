"""Ranks that disagree about a collective never compute with each other's bytes.

Every collective's first message to each peer carries a fingerprint (csrc/cpu/transport/
fingerprint.hpp); a call refused on one rank still takes its sequence number there. So when the
ranks disagree (one refused a call the others ran; different ops, dtypes, sizes, roots, reduce
ops, order, all_to_all splits or algorithm pins), the first rank to receive a stray message
raises a DistBackendError naming both collectives, and every other rank fails cleanly after it:
no rank returns a value made from another collective's bytes. DDPLITE_FINGERPRINT=0 (a knob for
measuring the check's cost) shows the wrong value the check prevents.
"""

import pytest

import mismatch_workers as mw
from harness import run_ranks

# Fail fast if a mismatch were to turn into a wait: detection must come long before this.
PG_TIMEOUT_S = 60
DETECTION_LIMIT_S = 15


def assert_failed_cleanly(step, rank, *fragments):
    assert "error" in step, f"rank {rank} returned {step.get('value')} instead of raising"
    assert step["dist"], f"rank {rank} raised {step['error']}, not DistBackendError: {step['message']}"
    assert step["seconds"] < DETECTION_LIMIT_S, f"rank {rank} took {step['seconds']:.1f} s to fail"
    for fragment in fragments:
        assert fragment in step["message"], f"rank {rank}: {fragment!r} not in:\n{step['message']}"


@pytest.mark.parametrize("world_size", [2, 3, 4])
def test_gather_list_one_short_on_root(world_size):
    """The trust issue's case: rank 0's all_reduce used to return rank 1's gather bytes as data."""
    results = run_ranks(mw.gather_one_short, world_size, pg_timeout_s=PG_TIMEOUT_S)
    root = results[0]
    assert root["gather"]["error"] == "ValueError"
    assert "gather #1" in root["gather"]["message"]
    assert_failed_cleanly(root["all_reduce"], 0, "collective mismatch", "gather #1", "allreduce #2",
                          "refused gather #1")
    for rank in range(1, world_size):
        # Through shared memory the peers' gather waits for every rank's step, so it meets rank 0's
        # all_reduce #2 and fails; over TCP their sends are buffered and the gather returns.
        gather = results[rank]["gather"]
        if "error" in gather:
            assert_failed_cleanly(gather, rank, "collective mismatch", "gather #1", "allreduce #2")
        else:
            assert gather == {"value": None, "seconds": gather["seconds"]}
        # A peer's all_reduce #2 may meet rank 0's all_reduce #2 (TCP: rank 0 sent its data before
        # it read the stray gather header) and finish, but only with the true sum of the ranks'
        # all_reduce inputs; else, and in any case on its next collective, it fails, quoting the
        # mismatch rank 0 saw.
        step = results[rank]["all_reduce"]
        if "value" in step:
            assert step["value"] == [float(world_size)] * 3, (rank, step)
        else:
            assert_failed_cleanly(step, rank, "collective mismatch")
        assert_failed_cleanly(results[rank]["next"], rank, "collective mismatch")


def assert_correct_or_failed(step, rank, world_size):
    """An all_reduce of 1.0s next to a failure: it may still complete (its peers' data was on the
    wire before one of them saw the mismatch), but then only with the true sum; else it raises."""
    if "value" in step:
        assert step["value"] == [float(world_size)] * 3, (rank, step)
    else:
        assert_failed_cleanly(step, rank)


@pytest.mark.parametrize("world_size", [2, 3])
def test_allreduce_against_broadcast(world_size):
    results = run_ranks(mw.allreduce_against_broadcast, world_size, pg_timeout_s=PG_TIMEOUT_S)
    messages = []
    for rank in range(world_size):
        first = results[rank]["first"]
        if "value" in first:
            # Rank 0 never joined the broadcast from rank 1, but ranks 1 and up could finish it
            # among themselves: every one of them then holds rank 1's tensor (ones(7) * 1).
            assert rank != 0 and first["value"] == [1.0] * 7, (rank, first)
        else:
            assert_failed_cleanly(first, rank, "collective mismatch")
            messages.append(first["message"])
        assert_correct_or_failed(results[rank]["second"], rank, world_size)
        assert_failed_cleanly(results[rank]["third"], rank, "collective mismatch")
    assert any("broadcast #1" in m and "allreduce #1" in m for m in messages), messages


CASES = {
    # case: what the detecting rank's message names (either way round)
    "dtype": ("dtype: Float here, Int at the peer", "dtype: Int here, Float at the peer"),
    "numel": ("size: 16 bytes here, 20 bytes at the peer", "size: 20 bytes here, 16 bytes at the peer"),
    "reduce_op": ("reduce op: SUM here, MAX at the peer", "reduce op: MAX here, SUM at the peer"),
    "op": ("collective: allreduce here, allgather at the peer", "collective: allgather here, allreduce at the peer"),
    "root": ("root: 0 here, ", "collective mismatch"),
    "order": ("collective: allreduce here, broadcast at the peer", "collective: broadcast here, allreduce at the peer"),
    "alltoall_splits": ("message length: 12 bytes expected here, 8 bytes sent by the peer",),
    # identical calls but for the sequence number: the last rank refused one call alone
    "seq": ("sequence number: #1 here, #2 at the peer", "sequence number: #2 here, #1 at the peer"),
}


@pytest.mark.parametrize("world_size", [2, 3])
@pytest.mark.parametrize("case", sorted(CASES))
def test_one_rank_differs(case, world_size):
    results = run_ranks(mw.one_rank_differs, world_size, case, pg_timeout_s=PG_TIMEOUT_S)
    messages = []
    for rank, steps in enumerate(results):
        first = steps["first"]
        if "value" in first:
            # A rank may finish the differing call only if it received nothing stray in it: a
            # broadcast root (its input stands), a rank whose all_to_all peers all agreed with it.
            assert case in ("root", "alltoall_splits"), (rank, first)
        else:
            assert_failed_cleanly(first, rank)
            messages.append(first["message"])
        assert_correct_or_failed(steps["second"], rank, world_size)
        assert_failed_cleanly(steps["third"], rank)
        messages.append(steps["third"]["message"])
    assert any(fragment in message for message in messages for fragment in CASES[case]), "\n---\n".join(messages)
    assert all("collective mismatch" in message or "out of step" in message for message in messages), \
        "\n---\n".join(messages)


def test_disagreement_where_no_message_crosses_times_out():
    """Over TCP, two ranks that each think they are the root of a reduce both wait to receive: no
    byte crosses, so there is nothing to check; it is reported at the group's timeout, like a rank
    that never arrives, naming the peer waited for."""
    results = run_ranks(mw.one_rank_differs, 2, "reduce_root", pg_timeout_s=3, timeout_s=60,
                        env={"DDPLITE_CPU_TRANSPORT": "tcp"})
    for rank, steps in enumerate(results):
        assert_failed_cleanly(steps["first"], rank, "Timed out waiting to receive from rank")
        assert steps["first"]["seconds"] >= 2.5


def test_the_same_disagreement_in_shared_memory_is_found_at_once():
    """Through shared memory every rank posts a header for each step, roots included: the two
    roots see each other's at once."""
    results = run_ranks(mw.one_rank_differs, 2, "reduce_root", pg_timeout_s=60, timeout_s=60)
    assert_failed_cleanly(results[0]["first"], 0, "collective mismatch", "root: 0 here, 1 at the peer")
    assert_failed_cleanly(results[1]["first"], 1, "collective mismatch")


@pytest.mark.parametrize("world_size", [3, 4])
def test_coalesced_parts_on_different_algorithms_are_no_mismatch(world_size):
    results = run_ranks(mw.coalesced_parts_with_mixed_algorithms, world_size, 30, pg_timeout_s=PG_TIMEOUT_S)
    for rank, failures in enumerate(results):
        assert failures == [], (rank, failures[:5])


def test_algorithm_pins_that_differ():
    pinned = run_ranks(_allreduce_with_rank_pin, 2, pg_timeout_s=PG_TIMEOUT_S)
    texts = [step["message"] for step in pinned if "message" in step]
    assert any("algorithm: ring here, butterfly at the peer" in t or "algorithm: butterfly here, ring at the peer" in t
               for t in texts), texts
    for rank, step in enumerate(pinned):
        assert_failed_cleanly(step, rank)


def _allreduce_with_rank_pin(rank, world_size):
    import torch_ddp_lite
    torch_ddp_lite.set_algorithm("allreduce", "ring" if rank == 0 else "butterfly")
    return mw.outcome(lambda: mw.all_reduce_of(mw.torch.ones(8)))


def _pinned_on_one_rank_only(rank, world_size, algorithm, late_rank):
    """Rank 0 pins a TCP algorithm; the others keep the automatic choice (shared memory). The
    late rank enters a moment after the others, so both orders of arrival are covered."""
    import time

    import torch_ddp_lite
    if rank == 0:
        torch_ddp_lite.set_algorithm("allreduce", algorithm)
    if rank == late_rank:
        time.sleep(0.3)
    return mw.outcome(lambda: mw.all_reduce_of(mw.torch.ones(8)))


@pytest.mark.parametrize("world_size", [2, 3])
@pytest.mark.parametrize("algorithm", ["ring", "naive"])
@pytest.mark.parametrize("late_rank", [0, 1])
def test_a_pin_on_one_rank_takes_it_off_shared_memory_and_is_found_at_once(world_size, algorithm, late_rank):
    """A pinned collective runs its algorithm over TCP even where the group has shared memory. A
    pin on some ranks only sends them over TCP while their peers wait in shared memory: the
    waiters see the TCP rank's announcement and every rank fails within seconds (the group's
    timeout is a minute), quoting the mismatch; no rank returns a value."""
    results = run_ranks(_pinned_on_one_rank_only, world_size, algorithm, late_rank, pg_timeout_s=60, timeout_s=120)
    texts = [step.get("message", "") for step in results]
    assert any(f"algorithm: shared memory here, {algorithm} at the peer" in t for t in texts), texts
    for rank, step in enumerate(results):
        assert_failed_cleanly(step, rank, "collective mismatch")


@pytest.mark.parametrize("world_size", [1, 2, 3])
def test_calls_refused_everywhere_keep_the_group_usable(world_size):
    results = run_ranks(mw.refused_everywhere, world_size, pg_timeout_s=PG_TIMEOUT_S)
    total = float(sum(range(1, world_size + 1)))
    for rank, steps in enumerate(results):
        assert steps["unsupported_dtype"]["error"] == "ValueError"
        assert steps["expanded"]["error"] == "ValueError"
        assert "share memory" in steps["expanded"]["message"]
        assert steps["expanded"]["seconds"] < 1.0
        assert steps["expanded_gather"]["error"] == "ValueError"
        assert steps["after"] == {"value": [total] * 3, "seconds": steps["after"]["seconds"]}
        assert steps["broadcast_after"]["value"] == [float(world_size - 1)] * 2


def test_without_the_check_the_wrong_value_comes_back():
    """What the fingerprint prevents (so the tests above can fail): with DDPLITE_FINGERPRINT=0,
    rank 0's all_reduce reads rank 1's gather payload (11.0) as the first of its own peer's
    elements, then two of rank 1's 1.0s: [12, 2, 2] comes back as if it were a sum."""
    results = run_ranks(mw.gather_one_short, 2, pg_timeout_s=10, env=mw.fingerprint_off_env(), timeout_s=60)
    assert results[0]["gather"]["error"] == "ValueError"
    assert results[0]["all_reduce"].get("value") == [12.0, 2.0, 2.0], results[0]["all_reduce"]


def test_bad_fingerprint_knob_fails_init():
    with pytest.raises(AssertionError, match="DDPLITE_FINGERPRINT='maybe'"):
        run_ranks(mw.pid, 2, env={"DDPLITE_FINGERPRINT": "maybe"}, timeout_s=60)
