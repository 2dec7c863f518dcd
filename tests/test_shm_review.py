"""The shared-memory path under a review's cases: each test drives the state in which a
defect showed, and failed before its fix.

* a rank that leaves a collective part-way (an exception between two steps) breaks the group on
  every rank, at once; no peer reads its unreduced slice as reduced;
* the step counter wraps past 2^32 without losing a broadcast's deferred check;
* a broadcast that is a rank's last op still has its check settled, at shutdown;
* a non-root checks the other non-roots too (a second "root" is found by every rank);
* reduce_scatter never writes past a chunk when P elements do not fit one (it goes over TCP);
* rank 0 waits for its peers to attach the segment at most 30 s of its own, then unlinks it;
* a name left by a group killed in that window goes with the next group set up on the host.
"""

import os
import signal
import subprocess
import sys
import tempfile
import time

import pytest

import review_workers as rw
import torch_ddp_lite
from harness import run_ranks

EXT = torch_ddp_lite._load_extension()
SHM = {"DDPLITE_CPU_TRANSPORT": "shm"}


@pytest.mark.parametrize("world_size", [2, 3])
def test_rank_that_leaves_a_step_breaks_the_group_on_every_rank(world_size):
    env = dict(SHM, DDPLITE_TEST_HOOKS="shm_fault=1:2")
    results = run_ranks(rw.abandoned_step, world_size, env=env, pg_timeout_s=60)
    kind, message = results[1]["first"]
    assert kind == "MemoryError", results[1]
    for rank, result in enumerate(results):
        assert not result["wrong_sum"], (rank, result)
        if rank != 1:
            kind, message = result["first"]
            assert kind == "DistBackendError" and "rank 1" in message, (rank, result["first"])
            assert result["seconds"] < 10, (rank, result["seconds"])  # not the 60 s timeout
        kind, message = result["after"]
        assert kind == "DistBackendError" and "unusable" in message, (rank, result["after"])


@pytest.mark.parametrize("world_size", [2, 3])
def test_steps_wrap_past_two_to_the_32(world_size):
    env = dict(SHM, DDPLITE_TEST_HOOKS="shm_first_step=4294967290")
    results = run_ranks(rw.broadcasts_across_the_wrap, world_size, env=env, pg_timeout_s=20, timeout_s=120)
    assert results == [[]] * world_size


def test_broadcast_as_last_op_is_checked_at_shutdown():
    results = run_ranks(rw.broadcast_as_last_op, 2, env=SHM, pg_timeout_s=30)
    kind, message = results[0]["result"]
    assert kind == "DistBackendError" and "mismatch" in message, results[0]["result"]
    assert results[1]["result"] == ("ok", "")  # its check was deferred: nothing to see yet
    stderr = results[1]["stderr"]
    assert "at shutdown, the check of this rank's last broadcast found" in stderr, stderr
    assert "rank 0" in stderr and "allreduce" in stderr, stderr


def test_a_second_root_is_found_by_the_non_roots_too():
    results = run_ranks(rw.second_root, 3, env=SHM, pg_timeout_s=30)
    kind, message = results[1]["second"] if results[1]["first"][0] == "ok" else results[1]["first"]
    assert kind == "DistBackendError" and "mismatch" in message and "rank 2" in message, results[1]


def test_reduce_scatter_pieces_fit_the_chunk_or_go_over_tcp():
    piece = EXT.shm_reduce_scatter_piece_count
    assert piece(chunk_bytes=524288, world_size=4, element_size=4) == 32768
    assert piece(chunk_bytes=4096, world_size=256, element_size=16) == 1
    # 257 ranks of complex128 in 4 KiB chunks: not one element per rank fits; before, a piece of
    # one element each made 257 * 16 bytes go into a 4096-byte buffer
    assert piece(chunk_bytes=4096, world_size=257, element_size=16) == 0
    assert piece(chunk_bytes=4096, world_size=513, element_size=8) == 0


STALLED_ATTACH = """
import sys, torch.distributed as dist
from datetime import timedelta
import torch_ddp_lite
rank = int(sys.argv[2])
dist.init_process_group("ddplite", init_method="file://" + sys.argv[1], rank=rank, world_size=2,
                        timeout=timedelta(seconds=300))
print("INIT DONE " + " ".join(torch_ddp_lite.cpu_path()), flush=True)
import time
time.sleep(600)
"""


def _segments():
    return {name for name in os.listdir("/dev/shm") if name.startswith("ddplite-")}


def test_rank_zero_unlinks_the_segment_when_a_peer_never_attaches():
    """Rank 1 gets the segment's name but never attaches (DDPLITE_TEST_HOOKS=shm_stall_attach=1);
    the store's timeout is 300 s. Rank 0 gives up after its own window (30 s; 3 s here, through
    the hook shm_attach_within=3), unlinks the name and goes over TCP; so a kill -9 of everything
    leaves nothing in /dev/shm (before, the name stayed for the store's timeout, and for ever after
    a kill -9 of rank 0)."""
    before = _segments()
    env = dict(os.environ, DDPLITE_TEST_HOOKS="shm_stall_attach=1,shm_attach_within=3")
    with tempfile.TemporaryDirectory(prefix="ddplite-test-") as folder:
        store = os.path.join(folder, "store")
        ranks = [subprocess.Popen([sys.executable, "-c", STALLED_ATTACH, store, str(rank)], env=env,
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for rank in (0, 1)]
        try:
            deadline = time.monotonic() + 10
            while not (_segments() - before) and time.monotonic() < deadline:
                time.sleep(0.05)
            made = _segments() - before
            assert made, "rank 0 never created the segment"
            time.sleep(7)  # rank 0's 3 s, and some
            left = _segments() & made
        finally:
            for process in ranks:
                process.kill()
            outputs = [process.communicate()[0] for process in ranks]
    assert left == set(), outputs[0][-3000:]
    assert "did not attach the segment within 3 s" in outputs[0], outputs[0][-3000:]
    assert _segments() & made == set()


def _pid_namespace():
    return os.readlink("/proc/self/ns/pid").split("[")[1].rstrip("]")


def _ended_pid():
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def test_a_segment_left_by_a_group_killed_in_its_set_up_goes_with_the_next_group_on_the_host():
    """Every rank of a group is killed (kill -9) while rank 0 waits for rank 1 to attach (the
    window segment.hpp names; a launcher ending a job during its set-up): the name stays in
    /dev/shm. The next group's rank 0 removes it before making its own, because the name carries
    its creator's pid and pid namespace; names whose creator lives, or from another pid namespace,
    stay."""
    before = _segments()
    namespace, ended = _pid_namespace(), _ended_pid()
    live_name = f"ddplite-{'a' * 16}-{os.getpid()}-{namespace}"   # its creator (this test) lives
    foreign_name = f"ddplite-{'b' * 16}-{ended}-1"                # another pid namespace
    for name in (live_name, foreign_name):
        open(os.path.join("/dev/shm", name), "wb").close()
    try:
        env = dict(os.environ, DDPLITE_TEST_HOOKS="shm_stall_attach=1")
        with tempfile.TemporaryDirectory(prefix="ddplite-test-") as folder:
            store = os.path.join(folder, "store")
            ranks = [subprocess.Popen([sys.executable, "-c", STALLED_ATTACH, store, str(rank)], env=env,
                                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) for rank in (0, 1)]
            try:
                deadline = time.monotonic() + 20
                while not (_segments() - before - {live_name, foreign_name}) and time.monotonic() < deadline:
                    time.sleep(0.05)
            finally:
                for process in ranks:
                    process.kill()
                    process.wait()
        left = _segments() - before - {live_name, foreign_name}
        assert len(left) == 1, left
        (left_name,) = left
        assert left_name.endswith(f"-{ranks[0].pid}-{namespace}"), (left_name, ranks[0].pid)
        results = run_ranks(rw.plain_allreduce, 2, env={**SHM, "DDPLITE_DEBUG": "INFO"})
        assert results == [("shm", 3.0), ("shm", 3.0)]
        assert left_name not in _segments()
        assert {live_name, foreign_name} <= _segments()
    finally:
        for name in (live_name, foreign_name):
            if os.path.exists(os.path.join("/dev/shm", name)):
                os.unlink(os.path.join("/dev/shm", name))
    assert _segments() <= before
