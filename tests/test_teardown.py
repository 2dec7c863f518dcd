"""Teardown never hangs and never aborts (issue 30): the quick slice of scripts/teardown_soak.py.

Every layout the soak rotates through, once (2-4 ranks; shared memory and TCP; destroy and no
destroy; ranks forked from the preloaded forkserver), plus two runs of fresh interpreters that
exit through interpreter shutdown: each rank must be gone within 2 s of finishing its ops (fresh
ones: 2 s beyond a bare interpreter's exit, measured beside them), with
exit code 0 and no "terminate called" on stderr, its ops' results right. A rank still alive 10 s
after its ops is a hang: the failure carries its native stacks (gdb)."""

import pytest

import teardown_workers

SLOW_EXIT_S = 2.0


def check(outcome):
    assert outcome["hung"] == {}, "\n\n".join(f"rank {rank} hung:\n{stacks}" for rank, stacks in outcome["hung"].items())
    assert outcome["aborts"] == [], outcome["errors"]
    assert outcome["errors"] == [], outcome["errors"]
    assert outcome["checks_failed"] == [], outcome["checks_failed"]
    limit = SLOW_EXIT_S + outcome["baseline"]  # fresh interpreters: beyond a bare one's own exit
    assert all(seconds is not None and seconds < limit for seconds in outcome["exits"]), (outcome["exits"], limit)
    assert outcome["codes"] == [0] * len(outcome["codes"]), outcome["codes"]


@pytest.mark.parametrize("teardown", ["destroy", "none"])
@pytest.mark.parametrize("transport", ["shm", "tcp"])
@pytest.mark.parametrize("world_size", [2, 3, 4])
def test_forked_ranks_exit_promptly(world_size, transport, teardown):
    check(teardown_workers.run_once(world_size, transport, teardown, "forked"))


# (4, tcp, none) aborted in about one run of three before the atexit hook (torch_ddp_lite's
# stop_all_for_exit): the worker freed a Work's tensor during finalization; hence three tries.
@pytest.mark.parametrize("world_size,transport,teardown,attempt",
                         [(3, "shm", "destroy", 0), (2, "tcp", "none", 0),
                          (4, "tcp", "none", 0), (4, "tcp", "none", 1), (4, "tcp", "none", 2)])
def test_fresh_interpreters_exit_promptly(world_size, transport, teardown, attempt):
    check(teardown_workers.run_once(world_size, transport, teardown, "fresh"))
