"""The torch.distributed calls gloo serves and ddplite used to refuse (issue: parity with gloo),
each against gloo on the same calls, or the closed form where gloo lacks the call.

Every test runs on both of ddplite's CPU paths: shared memory between the ranks of this host
(the default) and TCP (DDPLITE_CPU_TRANSPORT=tcp); tests/test_mpi.py runs them under mpirun with
MPI as the transport.
"""

import pytest
import torch
import torch.distributed as dist

import parity_workers as pw
import torch_ddp_lite
from harness import run_ranks

TIMEOUT_S = 1.0
TRANSPORTS = {"shm": {}, "tcp": {"DDPLITE_CPU_TRANSPORT": "tcp"}}


def expected_paths(env, world_size):
    """(CPU collective transport, send/recv path) the default group must report."""
    if env.get("DDPLITE_CPU_TRANSPORT") == "tcp" or world_size == 1:  # one rank has no peers to share memory with
        return ["tcp", "TCP"]
    return ["shm", "shared-memory channels"]


@pytest.fixture(params=list(TRANSPORTS))
def env(request):
    """The environment that picks the CPU transport (the same for the gloo runs, which ignore it)."""
    return TRANSPORTS[request.param]


def first_line(message):
    return message.split("\n")[0]


def run_monitored(backend, world_size, missing, wait_all, env):
    idle_s = TIMEOUT_S + (4 if backend == "gloo" else 2)  # past the arrived ranks' errors
    return run_ranks(pw.monitored_barrier, world_size, backend, set(missing), wait_all, TIMEOUT_S, idle_s,
                     pg_timeout_s=30, env=env)


@pytest.mark.parametrize("world_size,missing,wait_all", [(3, [1], False), (4, [1, 3], True)],
                         ids=["first-missing", "wait-all-ranks"])
def test_monitored_barrier_raises_where_gloo_raises_with_gloo_phrases(world_size, missing, wait_all, env):
    gloo = run_monitored("gloo", world_size, missing, wait_all, env)
    ours = run_monitored("ddplite", world_size, missing, wait_all, env)
    expected_sum = [float(sum(range(1, world_size + 1)))] * 2
    for rank in range(world_size):
        assert [o[0] for o in ours[rank]["passed"]] == [o[0] for o in gloo[rank]["passed"]] == ["ok", "ok"]
        assert ours[rank]["sum"] == expected_sum, "the group is not usable after a failed monitored_barrier"
        if rank in missing:
            assert ours[rank]["failed"] is None and gloo[rank]["failed"] is None
            continue
        ours_kind, ours_runtime, ours_message, ours_seconds = ours[rank]["failed"]
        gloo_kind, gloo_runtime, gloo_message, _ = gloo[rank]["failed"]
        assert gloo_kind == "RuntimeError" and ours_kind == "DistBackendError" and ours_runtime, ours[rank]
        # gloo's first line ("[Rank 0]: Rank 1 failed to pass monitoredBarrier in 1000 ms",
        # "Rank 2 successfully reached monitoredBarrier, but ...") is in ours, after our context
        assert first_line(gloo_message) in ours_message, (gloo_message, ours_message)
        assert f"ddplite rank {rank}/{world_size}, monitored_barrier #3" in ours_message
        assert ours_seconds < TIMEOUT_S + 2, ours[rank]  # arrived ranks hear rank 0's verdict at once
    failed = ", ".join(str(r) for r in missing)
    assert ("Ranks " if len(missing) > 1 else "Rank ") + f"{failed} failed to pass monitoredBarrier" \
        in first_line(ours[0]["failed"][2])
    for rank in set(range(1, world_size)) - set(missing):
        assert f"rank 0 reports that rank(s) {failed} failed to pass monitoredBarrier" in ours[rank]["failed"][2]


@pytest.mark.parametrize("world_size", [1, 2, 3, 4])
def test_monitored_barrier_names_the_rank_that_never_arrives(world_size, env):
    missing = [world_size - 1] if world_size > 1 else []
    results = run_monitored("ddplite", world_size, missing, False, env)
    for rank, result in enumerate(results):
        assert [o[0] for o in result["passed"]] == ["ok", "ok"]
        if world_size == 1:
            assert result["failed"][0] == "ok"
        elif rank == 0:
            assert f"[Rank 0]: Rank {world_size - 1} failed to pass monitoredBarrier in 1000 ms" in result["failed"][2]
            assert TIMEOUT_S - 0.1 < result["failed"][3] < TIMEOUT_S + 2, result["failed"]
        elif rank not in missing:
            assert f"Rank {rank} successfully reached monitoredBarrier" in result["failed"][2]


def test_monitored_barrier_with_no_time_left_matches_gloo(env):
    gloo = run_ranks(pw.monitored_barrier_rank0_alone, 3, "gloo", env=env)
    ours = run_ranks(pw.monitored_barrier_rank0_alone, 3, "ddplite", env=env)
    assert gloo[1:] == ours[1:] == [None, None]
    assert gloo[0][0] == "RuntimeError" and ours[0][0] == "DistBackendError"
    # gloo's rule, which ddplite follows: rank 0 is out of time before it looks for rank 1 once the
    # whole milliseconds elapsed reach the timeout, so always with a timeout of 0; rank 1 is named
    # as failed with that as the cause (torch's test_monitored_barrier_gloo_rank_0_timeout
    # matches "Rank 0 timed out in monitoredBarrier").
    expected = ["[Rank 0]: Rank 1 failed to pass monitoredBarrier in 0 ms", " Original exception: ",
                "Rank 0 timed out in monitoredBarrier after 0 ms.",
                "No ranks successfully processed in monitoredBarrier."]
    assert gloo[0][2].splitlines()[:4] == expected, gloo[0][2][:500]
    ours_lines = ours[0][2].splitlines()
    assert ours_lines[0].endswith(": " + expected[0]) and ours_lines[1:4] == expected[1:], ours[0][2][:500]


@pytest.mark.parametrize("world_size", [1, 2, 3, 4])
def test_all_gather_coalesced_matches_gloo_and_closed_form(world_size, env):
    results = run_ranks(pw.all_gather_coalesced, world_size, env=env)
    cases = sum(len(shapes) for shapes in pw.ALLGATHER_COALESCED_SHAPES) * len(pw.ALLGATHER_COALESCED_DTYPES)
    for result in results:
        assert result["failures"] == [], result["failures"][:10]
        assert result["checked"] == cases * world_size


@pytest.mark.parametrize("world_size", [2, 3])
def test_all_gather_coalesced_refuses_what_gloo_refuses(world_size, env):
    results = run_ranks(pw.all_gather_coalesced_refusals, world_size, env=env)
    for rank, result in enumerate(results):
        for name, outcome in result["outcomes"].items():
            assert outcome["gloo"][0] == "RuntimeError", (name, outcome)
            assert outcome["ddplite"][0] == "ValueError", (name, outcome)
            assert f"ddplite rank {rank}/{world_size}, allgather_coalesced" in outcome["ddplite"][2], outcome
        assert result["sum"] == [float(sum(range(1, world_size + 1)))] * 2


@pytest.mark.parametrize("world_size", [1, 2, 3, 4])
def test_coalescing_groups_ops_into_one_work(world_size, env):
    for rank, out in enumerate(run_ranks(pw.coalescing, world_size, env=env)):
        assert out["paths"] == expected_paths(env, world_size), out["paths"]
        assert out["supports"] is True and out["gloo_supports"] is False
        if world_size > 1:
            # one Work for the group (gloo, which cannot coalesce, returns one per op); right values
            assert out["ring 5"] == out["ring 300000"] == (1, 2, True, True), out
            assert out["ring work"] == ("Work", True, True, 0, 2), out  # SUCCESS; both ops' tensors
        assert out["fast path"][0] == 1 and out["fast path ok"], out
        assert out["one by one"] == (1, True, True), out
        assert out["sync"] is True
        kind, message = out["end without start"]
        assert kind == "ValueError" and "endCoalescing without startCoalescing" in message, message


def test_a_failed_part_fails_the_coalesced_work_with_its_result(env):
    results = run_ranks(pw.coalesced_failure, 2, pg_timeout_s=2, env=env)
    kind, is_runtime, message = results[1]["failed"]
    assert kind == "DistBackendError" and "Timed out waiting for a message from rank 0" in message, message
    assert results[1]["result"] == 1  # WorkResult.TIMEOUT
    assert results[0]["sum"] == results[1]["sum"] == [3.0, 3.0]


SPLITS = {1: [[[0]]], 2: [[[0, 1]], [[1], [0]]], 3: [[[0, 2]], [[2, 1, 0]]], 4: [[[0, 1], [2, 3]], [[3, 1, 0], [2]]]}


def _torch_numbering(members):
    """The new group's ranks in group-rank order, as the running torch numbers them: up to 2.13
    torch sorts a split's ranks; from 2.14 the position in the caller's list is the group rank."""
    return list(members) if torch_ddp_lite.torch_has("split_keeps_order") else sorted(members)


def _assert_split_closed_form(rank, splits_list, made):
    for splits, result in zip(splits_list, made):
        if isinstance(result, tuple):  # refused: the same refusal as gloo's is checked by the caller
            continue
        mine = next((_torch_numbering(s) for s in splits if rank in s), None)
        if mine is None:
            # torch returns None to a rank left out up to 2.13, NON_GROUP_MEMBER from 2.14 (gloo's
            # result is the oracle of which; the caller compares them)
            assert result in ("None", repr(dist.GroupMember.NON_GROUP_MEMBER)), (rank, result)
            continue
        assert result == {"rank": mine.index(rank), "size": len(mine), "ranks": mine,
                          "sum": float(sum(r + 1 for r in mine)), "broadcast": mine[0] * 10,
                          "gathered": mine}, (rank, result)


@pytest.mark.parametrize("world_size", [1, 2, 3, 4])
def test_split_group_follows_gloo_on_the_running_torch(world_size, env):
    """Unsorted ranks ([2, 1, 0], [3, 1, 0]) included: on torch 2.14+ the group rank is the
    position in the list (a broadcast from group rank 0 delivers global rank 2's value)."""
    gloo = run_ranks(pw.split_group, world_size, "gloo", SPLITS[world_size], env=env)
    ours = run_ranks(pw.split_group, world_size, "ddplite", SPLITS[world_size], env=env)
    for rank in range(world_size):
        if torch_ddp_lite.torch_has("split"):
            assert ours[rank]["unbound"] == gloo[rank]["unbound"], rank
            assert ours[rank]["bound"] == gloo[rank]["bound"], rank
        else:  # torch 2.8: gloo cannot split either; ddplite says which torch can
            assert gloo[rank]["bound"][0][0] == "raised" and ours[rank]["bound"][0][:2] == ("raised", "RuntimeError")
            assert "torch 2.9" in ours[rank]["bound"][0][2], ours[rank]["bound"]
        for phase in ("unbound", "bound"):
            _assert_split_closed_form(rank, SPLITS[world_size][: len(ours[rank][phase])], ours[rank][phase])
        assert ours[rank]["options_copy"] == "DdpliteOptions"
        made = [m for m in ours[rank]["bound"] if isinstance(m, dict)]
        assert ours[rank]["one_group_for_cpu_and_cuda"] == [True] * len(made), ours[rank]
        if "refused" in ours[rank]:
            assert ours[rank]["refused"][0] == ("ok" if rank == 0 else "ValueError"), ours[rank]["refused"]
            assert ours[rank]["after_refused"] == ours[rank]["bound"][:1], rank
        assert ours[rank]["after"] == world_size


@pytest.mark.parametrize("world_size", [1, 2, 3, 4])
def test_sparse_all_reduce_matches_gloo_and_closed_form(world_size, env):
    gloo = run_ranks(pw.sparse_all_reduce, world_size, "gloo", env=env)
    ours = run_ranks(pw.sparse_all_reduce, world_size, "ddplite", env=env)
    for rank in range(world_size):
        assert ours[rank]["paths"] == expected_paths(env, world_size), ours[rank]["paths"]
        assert ours[rank]["results"] == gloo[rank]["results"], rank
        assert [dense for _, _, dense in ours[rank]["results"]] == ours[rank]["expected"]
        assert ours[rank]["after"] == [world_size] * 2
        # gloo refuses MAX on sparse tensors too; ddplite says why in a ValueError
        assert gloo[rank]["max"][0] != "ok" and ours[rank]["max"][0] == "ValueError", (gloo[rank]["max"], ours[rank]["max"])
        assert "ReduceOp.SUM only" in ours[rank]["max"][2]
        if world_size > 1:
            assert ours[rank]["sizes_differ"][0] == "ValueError", ours[rank]["sizes_differ"]
            assert "same size and sparse dims" in ours[rank]["sizes_differ"][2]


class RecordingWork(dist.Work):
    """A Work of another kind than ddplite's CPU Work (as an NCCL Work is): its wait() is
    recorded, its future completes when the test says."""

    def __init__(self, name, log):
        super().__init__()
        self.name, self.log = name, log
        self.future = torch.futures.Future()

    def wait(self, timeout=None):
        self.log.append(self.name)
        return True

    def get_future(self):
        return self.future


def test_coalesced_work_of_other_works_asks_each_part():
    """The group Work endCoalescing returns when its parts are not ddplite's CPU Works (on CUDA:
    NCCL Works): wait() waits on every part in issue order (on CUDA this orders the caller's
    stream after every kernel), the future completes only with the last part's, and a part
    without a WorkResult leaves the group's to the future (SUCCESS here)."""
    log = []
    first, second = RecordingWork("first", log), RecordingWork("second", log)
    group = torch_ddp_lite._load_extension().coalesced_work([first, second])
    future = group.get_future()
    assert not future.done()
    second.future.set_result([torch.ones(1)])
    assert not future.done()  # the parts complete in any order
    first.future.set_result([torch.ones(1)])
    assert future.done()
    assert group.wait() and log == ["first", "second"]
    assert int(group.get_future_result().wait()) == 0  # WorkResult.SUCCESS


def test_barrier_with_device_ids_on_a_cpu_group_is_a_cpu_barrier_as_on_gloo(env):
    """barrier(device_ids=[rank]) and (device_ids=[0]) on a CPU group (Accelerate's
    wait_for_everyone() on CPU): a CPU barrier that waits for the late rank, as gloo's; it used to
    go to CUDA whenever the CUDA part was built, and fail without a GPU."""
    gloo = run_ranks(pw.barrier_with_device_ids, 2, backend="gloo", env=env)
    ours = run_ranks(pw.barrier_with_device_ids, 2, backend="ddplite", env=env)
    for rank in range(2):
        for call, (theirs, mine) in enumerate(zip(gloo[rank], ours[rank])):
            assert theirs[0] == "ok" and mine[0] == "ok", (rank, call, theirs, mine)
    for call in range(2):  # rank 0 waited for the late rank 1 on both
        assert gloo[0][call][1] > 0.4 and ours[0][call][1] > 0.4, (call, gloo[0], ours[0])
