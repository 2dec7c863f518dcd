"""The flight recorder: what it records, its bounds and knobs, its dumps, and torch's own analyzer
(python -m torch.distributed.flight_recorder.fr_trace) run on the dumps of real failures."""

import os
import subprocess
import sys

import pytest

import torch_ddp_lite
import trace_workers as tw
from harness import run_ranks

PG_TIMEOUT_S = 60


def entries_named(trace, name, pg="0"):
    return [e for e in trace["entries"] if e["profiling_name"] == f"nccl:{name}" and e["process_group"][0] == pg]


def only(entries):
    assert len(entries) == 1, entries
    return entries[0]


@pytest.mark.parametrize("world_size", [1, 2, 4])
def test_records_every_op_in_torch_format(world_size):
    traces = run_ranks(tw.every_op, world_size, pg_timeout_s=PG_TIMEOUT_S)
    for rank, trace in enumerate(traces):
        assert trace["version"] == "2.10"
        world = trace["pg_config"]["0"]
        assert world == {"name": "0", "desc": "default_pg", "ranks": str(list(range(world_size)))}
        ids = [e["record_id"] for e in trace["entries"]]
        assert ids == sorted(ids) and len(set(ids)) == len(ids)

        all_reduce = only(entries_named(trace, "all_reduce"))
        assert (all_reduce["input_sizes"], all_reduce["input_dtypes"]) == ([[5]], ["Float"])
        assert (all_reduce["output_sizes"], all_reduce["output_dtypes"]) == ([[5]], ["Float"])
        assert all_reduce["collective_seq_id"] == 1 and not all_reduce["is_p2p"]
        broadcast = only(entries_named(trace, "broadcast"))
        assert (broadcast["input_sizes"], broadcast["input_dtypes"]) == ([[3]], ["Long"])
        assert broadcast["collective_seq_id"] == 2
        # The analyzer compares an all_gather's input numel x group size with its output numel:
        # the output list is recorded as one flat tensor.
        all_gather = only(entries_named(trace, "all_gather"))
        assert (all_gather["input_sizes"], all_gather["output_sizes"]) == ([[2]], [[2 * world_size]])
        gather_base = only(entries_named(trace, "_all_gather_base"))
        assert (gather_base["input_sizes"], gather_base["output_sizes"]) == ([[2]], [[2 * world_size]])
        assert gather_base["output_dtypes"] == ["Double"]
        reduce_scatter = only(entries_named(trace, "reduce_scatter"))
        assert (reduce_scatter["input_sizes"], reduce_scatter["output_sizes"]) == ([[2 * world_size]], [[2]])
        barriers = entries_named(trace, "all_reduce_barrier")
        assert [b["input_sizes"] for b in barriers] == [[], []]
        assert [e["collective_seq_id"] for e in trace["entries"] if not e["is_p2p"] and e["process_group"][0] == "0"] \
            == list(range(1, 8))

        for entry in trace["entries"]:
            assert entry["state"] == "completed" and entry["retired"], entry
            assert entry["time_created_ns"] <= entry["time_discovered_started_ns"] \
                <= entry["time_discovered_completed_ns"], entry
            assert "duration_ms" not in entry, entry  # only with collectives timing on
            if entry["process_group"][0] == "0":  # the subgroup has torch's default timeout
                assert entry["timeout_ms"] == PG_TIMEOUT_S * 1000
            assert entry["frames"] == []
            assert entry["ddplite_path"] in ("shm", "tcp", "mpi", "hierarchical", "shared-memory channels", "TCP")
            if world_size > 1:  # what ran, e.g. "shm" or "ring" (one rank runs nothing)
                assert entry["ddplite_algorithm"], entry

        pair_name = [name for name in trace["pg_config"] if name != "0"]
        if world_size == 1 or rank in (0, world_size - 1):
            (name,) = pair_name
            ranks = [0] if world_size == 1 else [0, world_size - 1]
            assert trace["pg_config"][name]["ranks"] == str(ranks)
            pair_reduce = only(entries_named(trace, "all_reduce", pg=name))
            assert pair_reduce["collective_seq_id"] == 1
            assert (pair_reduce["input_sizes"], pair_reduce["input_dtypes"]) == ([[6]], ["BFloat16"])
        else:
            assert pair_name == [], "a rank outside the subgroup has no ddplite backend for it"

        sends, recvs = entries_named(trace, "send"), entries_named(trace, "recv")
        if world_size > 1 and rank == 0:
            send = only(sends)
            assert send["is_p2p"] and send["p2p_seq_id"] == 1 and send["input_sizes"] == [[4]]
            assert send["input_dtypes"] == ["Int"] and send["output_sizes"] == []
        elif world_size > 1 and rank == world_size - 1:
            recv = only(recvs)
            assert recv["is_p2p"] and recv["p2p_seq_id"] == 1 and recv["output_sizes"] == [[4]]
        else:
            assert sends == recvs == []


@pytest.mark.parametrize("world_size", [1, 2])
def test_each_op_is_recorded_once_whatever_torch_attaches(world_size):
    """torch 2.15 attaches its own FlightRecorderHook to every group whose backends it does not
    know to record themselves; ddplite records its ops itself, so the hook must stay off its groups
    (else every op is in two recorders). On older torches there is no hook to keep off."""
    traces = run_ranks(tw.recorded_once, world_size, False, pg_timeout_s=PG_TIMEOUT_S)
    for trace in traces:
        assert trace["ours"] == 4, trace  # 3 on the default group, 1 on the new group
        if torch_ddp_lite.torch_has("torch_flight_recorder_hook"):
            assert trace["hooks"] == 0 and trace["torch"] == 0, trace
    if torch_ddp_lite.torch_has("torch_flight_recorder_hook"):
        # The check can fail: with ddplite out of torch's set (taken out after the default group was
        # made), torch hooks the new group and records its all_reduce a second time.
        unguarded = run_ranks(tw.recorded_once, world_size, True, pg_timeout_s=PG_TIMEOUT_S)
        assert all(t["hooks"] == 1 and t["torch"] == 1 for t in unguarded), unguarded


@pytest.mark.parametrize("knob,value,kept", [
    ("DDPLITE_TRACE_BUFFER_SIZE", "4", 4),
    ("TORCH_FR_BUFFER_SIZE", "3", 3),
    ("DDPLITE_TRACE_BUFFER_SIZE", "0", 0),
])
def test_buffer_is_bounded_and_keeps_the_last_ops(knob, value, kept, tmp_path):
    results = run_ranks(tw.many_allreduces, 2, 10, pg_timeout_s=PG_TIMEOUT_S,
                        env={knob: value, "DDPLITE_TRACE_DIR": str(tmp_path)})
    for rank, (trace, path) in enumerate(results):
        assert [e["collective_seq_id"] for e in trace["entries"]] == list(range(11 - kept, 11))
        if kept:
            assert path == str(tmp_path / f"ddplite_trace_rank_{rank}")
        else:
            assert path is None and trace["pg_config"] == {}


def test_python_stacks_when_asked():
    (trace,) = run_ranks(tw.with_stacks, 1, env={"DDPLITE_TRACE_STACKS": "1"})
    frames = only(entries_named(trace, "all_reduce"))["frames"]
    names = [(frame["name"], os.path.basename(frame["filename"])) for frame in frames]
    assert ("with_stacks", "trace_workers.py") in names, names
    assert all(frame["line"] > 0 for frame in frames)


def test_dump_goes_to_trace_dir_and_torch_prefix(tmp_path):
    paths = run_ranks(tw.explicit_dump, 2, str(tmp_path), env={"DDPLITE_TRACE_DIR": str(tmp_path)})
    assert sorted(os.listdir(tmp_path)) == ["ddplite_trace_rank_0", "ddplite_trace_rank_1"]
    prefix = tmp_path / "torch" / "nccl_trace_rank_"
    run_ranks(tw.many_allreduces, 2, 1, env={"TORCH_FR_DUMP_TEMP_FILE": str(prefix), "DDPLITE_TRACE_DIR": ""})
    assert sorted(os.listdir(tmp_path / "torch")) == ["nccl_trace_rank_0", "nccl_trace_rank_1"]
    assert paths == [str(tmp_path / f"ddplite_trace_rank_{rank}") for rank in range(2)]


def analyze(folder):
    """torch's analyzer on a dump directory: its report (stderr + stdout)."""
    result = subprocess.run([sys.executable, "-m", "torch.distributed.flight_recorder.fr_trace", str(folder)],
                            capture_output=True, text=True, timeout=120,
                            env={**os.environ, "TORCH_DEVICE_BACKEND_AUTOLOAD": "0"})
    assert result.returncode == 0, result.stderr
    return result.stderr + result.stdout


def test_analyzer_names_the_rank_that_never_arrived(tmp_path):
    """A real hang: rank 2 stops calling collectives; ranks 0 and 1 time out in all_reduce #3 and
    dump on their own, rank 2 dumps on request. torch's analyzer names rank 2 and collective #3."""
    results = run_ranks(tw.rank_stops_arriving, 3, str(tmp_path), 2, pg_timeout_s=5,
                        env={"DDPLITE_TRACE_DIR": str(tmp_path)})
    for rank in (0, 1):
        assert "DistBackendError" in results[rank] and "Timed out" in results[rank], results[rank]
        assert f"Flight recorder dump: {tmp_path}/ddplite_trace_rank_{rank}" in results[rank]
    assert results[2] == str(tmp_path / "ddplite_trace_rank_2")
    report = analyze(tmp_path)
    assert "Not all ranks joining collective, sequence number: 3" in report, report
    assert "missing ranks: {2}" in report, report


@pytest.mark.parametrize("kind,verdict", [
    ("op", "COLLECTIVE_TYPE_MISMATCH"),
    ("size", "SIZE_OR_SYNTAX_MISMATCH"),
    ("dtype", "COLLECTIVE_DTYPE_MISMATCH"),
])
def test_analyzer_names_the_mismatched_collective(kind, verdict, tmp_path):
    results = run_ranks(tw.ranks_disagree, 2, kind, pg_timeout_s=PG_TIMEOUT_S,
                        env={"DDPLITE_TRACE_DIR": str(tmp_path)})
    for rank, outcome in enumerate(results):
        assert "DistBackendError" in outcome and "collective mismatch" in outcome, outcome
        assert f"Flight recorder dump: {tmp_path}/ddplite_trace_rank_{rank}" in outcome
    report = analyze(tmp_path)
    assert "Collective sequence number: 3 has errors" in report, report
    assert verdict in report, report


def test_sigusr1_dumps_when_asked(tmp_path):
    names = run_ranks(tw.dump_on_signal, 2, str(tmp_path),
                      env={"DDPLITE_TRACE_SIGNAL": "1", "DDPLITE_TRACE_DIR": str(tmp_path)})
    assert names == [["nccl:all_reduce"], ["nccl:all_reduce"]]
