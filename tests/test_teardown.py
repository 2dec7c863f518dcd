"""Teardown never hangs and never aborts: the quick slice of scripts/teardown_soak.py.

Every layout the soak rotates through, once (2-4 ranks; shared memory and TCP; destroy and no
destroy; ranks forked from the preloaded forkserver), plus two runs of fresh interpreters that
exit through interpreter shutdown: each rank must be gone within 2 s of finishing its ops (fresh
ones: 2 s beyond a bare interpreter's exit, measured beside them), with
exit code 0 and no "terminate called" on stderr, its ops' results right. A rank still alive 10 s
after its ops is a hang: the failure carries its native stacks (gdb). After destroy_process_group
on every rank, every rank's ~FileStore ran to its end on a thread the exit did not cut short, as
the store file's counters show (the file itself can stay: torch's own race, as with gloo) (one cut
short leaves half an entry, on which the other ranks' FileStore reads spin for ever: a hang CI
has seen)."""

import os

import pytest

import teardown_workers

SLOW_EXIT_S = 2.0


def check(outcome, teardown="none"):
    assert outcome["hung"] == {}, "\n\n".join(f"rank {rank} hung:\n{stacks}" for rank, stacks in outcome["hung"].items())
    assert outcome["aborts"] == [], outcome["errors"]
    assert outcome["errors"] == [], outcome["errors"]
    assert outcome["checks_failed"] == [], outcome["checks_failed"]
    limit = SLOW_EXIT_S + outcome["baseline"]  # fresh interpreters: beyond a bare one's own exit
    assert all(seconds is not None and seconds < limit for seconds in outcome["exits"]), (outcome["exits"], limit)
    assert outcome["codes"] == [0] * len(outcome["codes"]), outcome["codes"]
    if teardown == "destroy":
        assert not outcome["store_destructor_incomplete"], "a rank's FileStore was not destroyed before its process ended"


@pytest.mark.parametrize("teardown", ["destroy", "none"])
@pytest.mark.parametrize("transport", ["shm", "tcp"])
@pytest.mark.parametrize("world_size", [2, 3, 4])
def test_forked_ranks_exit_promptly(world_size, transport, teardown):
    check(teardown_workers.run_once(world_size, transport, teardown, "forked"), teardown)


# (4, tcp, none) aborted in about one run of three before the atexit hook (torch_ddp_lite's
# stop_all_for_exit): the worker freed a Work's tensor during finalization; hence three tries.
@pytest.mark.parametrize("world_size,transport,teardown,attempt",
                         [(3, "shm", "destroy", 0), (2, "tcp", "none", 0),
                          (4, "tcp", "none", 0), (4, "tcp", "none", 1), (4, "tcp", "none", 2)])
def test_fresh_interpreters_exit_promptly(world_size, transport, teardown, attempt):
    check(teardown_workers.run_once(world_size, transport, teardown, "fresh"), teardown)


def test_every_ranks_file_store_is_destroyed_before_its_process_ends():
    """Twelve quick jobs, each rank exiting right after destroy_process_group. Before the arrival
    recorder joined its thread, that thread often held the last reference to the store and the
    exit cut its ~FileStore short: the file stayed in about 4 jobs of 5. A file whose counters show
    every destructor ran to its end is torch's own race (teardown_workers.store_destructor_incomplete)."""
    left, codes = teardown_workers.store_files_left(12)
    assert codes == [0] * 24, codes
    assert left == 0, f"a ~FileStore never ran to its end in {left} of 12 jobs"


def _entries(*pairs):
    out = b""
    for key, value in pairs:
        for item in (key, value):
            out += len(item).to_bytes(4, "little") + item
    return out


def test_a_left_store_file_tells_torchs_race_from_a_destructor_cut_short(tmp_path):
    """The store file is read, not just found: counters at their end mean every ~FileStore ran (torch's
    own race between its two updates left the file); a count short of the end, or a torn entry, means
    one never ran or was cut short. Checked on a real FileStore's file first."""
    import torch.distributed as dist

    path = str(tmp_path / "real")
    first, second = dist.FileStore(path, 2), dist.FileStore(path, 2)
    del first  # one of two destroyed: cleanup 1, refcount 1
    assert teardown_workers.store_destructor_incomplete(path, 2)
    del second  # the last one removes the file
    assert not os.path.exists(path) and not teardown_workers.store_destructor_incomplete(path, 2)
    race = tmp_path / "race"
    race.write_bytes(_entries((b"refcount/", b"1"), (b"refcount/", b"2"), (b"cleanup/", b"1"), (b"cleanup/", b"2"),
                              (b"refcount/", b"1"), (b"refcount/", b"0")))
    assert not teardown_workers.store_destructor_incomplete(str(race), 2)
    short = tmp_path / "short"
    short.write_bytes(_entries((b"refcount/", b"1"), (b"refcount/", b"2"), (b"cleanup/", b"1"), (b"refcount/", b"1")))
    assert teardown_workers.store_destructor_incomplete(str(short), 2)
    torn = tmp_path / "torn"
    torn.write_bytes(race.read_bytes()[:-1])
    assert teardown_workers.store_destructor_incomplete(str(torn), 2)
