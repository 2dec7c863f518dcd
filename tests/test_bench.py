"""The benchmark tool's own logic: sizes, bandwidth factors, JSON schema, plot, unsupported ops.

Sweeps are tiny (8 B to 1 KB, two ranks, a few iterations); no performance is asserted.
"""

import importlib
import json
import math
import os
import re
import subprocess
import sys

import pytest

import torch_ddp_lite
from harness import run_ranks
from torch_ddp_lite.bench import ddp, report
from torch_ddp_lite.bench.__main__ import main as bench_main
from torch_ddp_lite.bench.control import run_everywhere
from torch_ddp_lite.bench.fit import fit_rows
from torch_ddp_lite.bench.sweep import (OPS, OpShape, bandwidths, bus_bandwidth_factor, format_size, op_shape,
                                        parse_size, plan_iterations, rotated, size_sweep, split_evenly)

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
TINY_SWEEP = ["--world-size", "2", "--backends", "ddplite,gloo", "-b", "8", "-e", "1K", "-f", "4",
              "--min-iters", "2", "--max-iters", "4", "--time-per-point", "0.01", "--rounds", "2"]
TINY_SIZES = [8, 32, 128, 512]


def run_module(module, *args, timeout=180):
    result = subprocess.run([sys.executable, "-m", module, *args], cwd=REPO, capture_output=True, text=True,
                            timeout=timeout)
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout


@pytest.mark.parametrize("text, expected", [("8", 8), ("1K", 1024), ("64k", 65536), ("2KB", 2048),
                                            ("256M", 256 << 20), ("1G", 1 << 30), ("4MiB", 4 << 20)])
def test_parse_size(text, expected):
    assert parse_size(text) == expected


@pytest.mark.parametrize("text", ["", "M", "1.5M", "-8", "8T"])
def test_parse_size_rejects_garbage(text):
    with pytest.raises(ValueError, match="bad size"):
        parse_size(text)


def test_format_size():
    assert [format_size(n) for n in (8, 1000, 1024, 65536, 256 << 20, 1 << 30)] == \
        ["8 B", "1000 B", "1 KB", "64 KB", "256 MB", "1 GB"]


def test_size_sweep():
    assert size_sweep(8, 1024, 2) == [8, 16, 32, 64, 128, 256, 512, 1024]
    assert size_sweep(8, 1024, 4) == TINY_SIZES
    assert size_sweep(8, parse_size("256M"), 2)[-1] == 256 << 20
    assert len(size_sweep(8, parse_size("256M"), 2)) == 26
    assert size_sweep(8, 8, 2) == [8]
    for bad in [(0, 8, 2), (16, 8, 2), (8, 16, 1)]:
        with pytest.raises(ValueError):
            size_sweep(*bad)


@pytest.mark.parametrize("world_size, all_reduce, split_ops", [(1, 0.0, 0.0), (2, 1.0, 0.5), (3, 4 / 3, 2 / 3),
                                                               (8, 1.75, 0.875)])
def test_bus_bandwidth_factors_match_nccl_tests(world_size, all_reduce, split_ops):
    assert bus_bandwidth_factor("all_reduce", world_size) == pytest.approx(all_reduce)
    for op in ("all_gather_into_tensor", "reduce_scatter_tensor", "all_to_all_single"):
        assert bus_bandwidth_factor(op, world_size) == pytest.approx(split_ops)
    assert bus_bandwidth_factor("broadcast", world_size) == 1.0
    assert bus_bandwidth_factor("sendrecv", world_size) == 1.0
    assert bus_bandwidth_factor("barrier", world_size) is None


def test_bus_bandwidth_factor_rejects_unknown_op():
    with pytest.raises(ValueError, match="unknown op"):
        bus_bandwidth_factor("all_reduce_coalesced", 2)


def test_bandwidths():
    # 1 GB all_reduce in 0.5 s on 4 ranks: algbw 2 GB/s, busbw 2 * 2 * 3/4 = 3 GB/s.
    assert bandwidths("all_reduce", 10 ** 9, 0.5, 4) == pytest.approx((2.0, 3.0))
    assert bandwidths("broadcast", 10 ** 9, 0.5, 4) == pytest.approx((2.0, 2.0))
    assert bandwidths("barrier", 0, 1e-4, 4) == (None, None)


def test_op_shapes_follow_nccl_tests_size_semantics():
    # 40 B of float32 on 3 ranks: 10 elements, rounded down to 9 for the ops that split by rank.
    assert op_shape("all_reduce", 40, 4, 3) == OpShape(count=10, nbytes=40, input_numel=10, output_numel=10)
    assert op_shape("broadcast", 40, 4, 3) == OpShape(10, 40, 10, 10)
    assert op_shape("all_gather_into_tensor", 40, 4, 3) == OpShape(9, 36, 3, 9)
    assert op_shape("reduce_scatter_tensor", 40, 4, 3) == OpShape(9, 36, 9, 3)
    assert op_shape("all_to_all_single", 40, 4, 3) == OpShape(9, 36, 9, 9)
    assert op_shape("barrier", 40, 4, 3) == OpShape(0, 0, 0, 0)
    # gather and scatter (--ops only): the gathered output, the scattered input, as nccl-tests
    assert op_shape("gather", 40, 4, 3) == OpShape(9, 36, 3, 9)
    assert op_shape("scatter", 40, 4, 3) == OpShape(9, 36, 9, 3)
    assert bus_bandwidth_factor("gather", 4) == bus_bandwidth_factor("scatter", 4) == 0.75
    assert "gather" not in OPS and "scatter" not in OPS  # not in the default run


def test_op_shape_too_small_is_none():
    assert op_shape("all_reduce", 2, 4, 2) is None
    assert op_shape("all_gather_into_tensor", 8, 4, 3) is None


def test_iteration_planning():
    assert plan_iterations(0.001, 0.25, 5, 1000) == 250
    assert plan_iterations(1.0, 0.25, 5, 1000) == 5
    assert plan_iterations(1e-7, 0.25, 5, 1000) == 1000
    assert plan_iterations(0.3, math.inf, 20, 20) == 20
    assert split_evenly(5, 4) == [2, 1, 1, 1]
    assert split_evenly(8, 2) == [4, 4]
    assert rotated(["a", "b", "c"], 4) == ["b", "c", "a"]


def test_table_line_ratios_and_missing_backend():
    shape = OpShape(256, 1024, 256, 256)

    def row(backend, seconds):
        return report.make_row("all_reduce", backend, 2, "cpu", "float32", shape, seconds,
                               bandwidths("all_reduce", shape.nbytes, seconds, 2))

    line = report.table_line({"ddplite": row("ddplite", 1e-4), "gloo": row("gloo", 2e-4)}, ["ddplite", "gloo", "nccl"])
    assert line.split() == ["1024", "256", "float32", "100.0", "0.010", "0.010", "200.0", "0.005", "0.005",
                            "-", "-", "-", "0.50", "2.00", "-", "-"]


def test_alpha_beta_fit_recovers_a_known_line():
    # Ring allreduce on 2 ranks: 2 steps of 25 us, and 1 ns per byte (1/R = 1e-9 s/B, busbw 1 GB/s).
    rows = [{"op": "all_reduce", "backend": "ddplite", "world_size": 2, "bytes": size, "time_us": 50 + size * 1e-3}
            for size in (8, 1024, 1 << 20, 1 << 26)]
    fit = fit_rows(rows, min_bytes=1, max_bytes=1 << 30)[("all_reduce", "ddplite", 2)]
    assert fit["alpha_us"] == pytest.approx(25.0)
    assert fit["busbw_inf"] == pytest.approx(1.0)
    assert fit["max_residual"] < 1e-9


def _probe_failing_on_rank_1(rank, world_size):
    def attempt():
        if rank == 1:
            raise RuntimeError("Backend fake does not support this_op\nmore detail")
        return "ran"

    return run_everywhere(attempt), run_everywhere(lambda: "ran")


def test_unsupported_op_is_agreed_by_all_ranks():
    results = run_ranks(_probe_failing_on_rank_1, 2, backend="gloo", timeout_s=60)
    for failed, succeeded in results:
        assert failed == (None, "rank 1: RuntimeError: Backend fake does not support this_op")
        assert succeeded == ("ran", None)


def test_tiny_sweep_json_table_and_plot(tmp_path):
    json_path, plot_path = tmp_path / "rows.json", tmp_path / "plot.png"
    stdout = run_module("torch_ddp_lite.bench", *TINY_SWEEP, "--json", str(json_path), "--plot", str(plot_path))
    rows = json.loads(json_path.read_text())

    types = {"op": str, "backend": str, "world_size": int, "device": str, "dtype": str, "bytes": int, "count": int,
             "time_us": float}
    for row in rows:
        assert tuple(row) == report.ROW_KEYS
        assert all(isinstance(row[key], kind) for key, kind in types.items()), row
        assert (row["world_size"], row["device"], row["dtype"]) == (2, "cpu", "float32")
        assert row["time_us"] > 0
        bandwidth_type = type(None) if row["op"] == "barrier" else float
        assert isinstance(row["algbw"], bandwidth_type) and isinstance(row["busbw"], bandwidth_type)
    keys = [(row["op"], row["backend"], row["bytes"]) for row in rows]
    assert len(keys) == len(set(keys)), "one row per op x backend x size"

    for op in OPS:
        expected_sizes = [0] if op == "barrier" else TINY_SIZES
        assert f"# {op}\n" in stdout
        for backend in ("ddplite", "gloo"):  # both support every op the benchmark has: all measured
            sizes = [row["bytes"] for row in rows if (row["op"], row["backend"]) == (op, backend)]
            assert sizes == expected_sizes, (op, backend)
        assert "not measured" not in stdout.split(f"# {op}\n")[1].split("\n\n")[0], op
    assert "ddplite/gloo" in stdout
    assert plot_path.read_bytes()[:8] == PNG_MAGIC


def test_ddp_bench_tiny(tmp_path):
    json_path = tmp_path / "ddp.json"
    stdout = run_module("torch_ddp_lite.bench", "ddp", "--world-size", "2", "--models", "resnet18", "--batch-size",
                        "2", "--steps", "1", "--warmup-steps", "1", "--rounds", "1", "--json", str(json_path))
    rows = json.loads(json_path.read_text())
    assert [(row["model"], row["backend"]) for row in rows] == [("resnet18", "ddplite"), ("resnet18", "gloo"),
                                                                ("resnet18", "no-comm"), ("resnet18", "ddp-alone"),
                                                                ("resnet18", "allreduce-only")]
    for row in rows:
        assert tuple(row) == ddp.ROW_KEYS
        assert row["params"] == 11_181_642 and row["batch_per_rank"] == 2
        assert row["images_per_s"] == pytest.approx(2 * 2 / (row["step_ms"] / 1e3))
    assert "resnet18" in stdout and "step/no-comm" in stdout


def test_mlp_has_about_25m_parameters():
    assert sum(p.numel() for p in ddp.communication_heavy_mlp().parameters()) == 25_194_506


def test_bad_arguments_are_refused_before_launching(capsys):
    with pytest.raises(SystemExit) as exit_info:
        bench_main(["--ops", "all_reduce,allreduce"])
    assert exit_info.value.code == 2
    assert "unknown op(s) allreduce" in capsys.readouterr().err


def test_collect_env_names_versions_and_transports():
    import torch

    stdout = run_module("torch_ddp_lite.collect_env", timeout=60)
    assert f"torch: {torch.__version__}\n" in stdout
    # what the extension reports it has: MPI's data path exactly when MPI is compiled in
    expected = "tcp, mpi, shm" if torch_ddp_lite.build_info()["mpi"] else "tcp, shm"
    assert f"transports: {expected}\n" in stdout
    assert "DDPLITE_RING_SEGMENT_BYTES:" in stdout
    backends = next(line for line in stdout.splitlines() if line.startswith("torch.distributed backends:"))
    assert backends.startswith("torch.distributed backends: gloo") and "ddplite (third-party, registered)" in backends
    assert "extension build flags: -O3 -Wall -Wno-unused-parameter\n" in stdout
    assert "CPU algorithms: allreduce: naive, ring, butterfly, halving_doubling;" in stdout


@pytest.mark.parametrize("argv, message", [
    (["--backends", "ddplite,glo"], "--backends: glo not available here; choose from ddplite, gloo"),
    (["--backends", "nccl"], "--backends: nccl not available here"),
    (["--backends", "ddplite,ddplite"], "--backends: name at least one backend, each once"),
    (["--world-size", "0"], "--world-size 0: need at least 1 rank"),
    (["ddp", "--backends", "gloo,tcp"], "--backends: tcp not available here"),
    (["ddp", "--world-size", "-2"], "--world-size -2: need at least 1 rank"),
    (["ddp", "--models", "resnet50"], "unknown model(s) resnet50"),
])
def test_backends_and_world_size_are_checked_before_launching(argv, message, capsys):
    with pytest.raises(SystemExit) as exit_info:
        bench_main(argv)
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err


def test_subcommands_and_default(capsys):
    """'collectives' is the default subcommand: an option list alone goes to it."""
    with pytest.raises(SystemExit) as exit_info:
        bench_main(["-h"])
    assert exit_info.value.code == 0
    assert "{collectives,ddp}" in capsys.readouterr().out
    for argv in (["--help"], ["collectives", "--help"]):
        with pytest.raises(SystemExit):
            bench_main(argv[-1:] if argv[0] == "--help" else argv)
    assert "--ops" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        bench_main(["ddp", "--help"])
    assert "--models" in capsys.readouterr().out


def test_memcpy_reference_and_shared_memory_columns(tmp_path):
    """--backends ddplite-shm,ddplite-tcp,memcpy: the memcpy reference gets its own JSON rows
    (algbw == busbw == bytes / time) and column for every op with a size, none for barrier."""
    json_path = tmp_path / "rows.json"
    stdout = run_module("torch_ddp_lite.bench", "--ops", "all_reduce,broadcast,barrier", "-b", "1K", "-e", "4K",
                        "-f", "4", "--world-size", "2", "--backends", "ddplite-shm,ddplite-tcp,memcpy",
                        "--time-per-point", "0.02", "--min-iters", "2", "--rounds", "2", "--json", str(json_path))
    rows = json.loads(json_path.read_text())
    memcpy = [row for row in rows if row["backend"] == "memcpy"]
    assert sorted((row["op"], row["bytes"]) for row in memcpy) == \
        [("all_reduce", 1024), ("all_reduce", 4096), ("broadcast", 1024), ("broadcast", 4096)]
    for row in memcpy:
        assert row["algbw"] == row["busbw"] == pytest.approx(row["bytes"] / 1e9 / (row["time_us"] / 1e6))
    assert {row["backend"] for row in rows if row["op"] == "barrier"} == {"ddplite-shm", "ddplite-tcp"}
    assert "ddplite-shm/memcpy" in stdout and "a barrier moves no bytes" in stdout


def test_ddp_bench_refuses_the_memcpy_reference(capsys):
    with pytest.raises(SystemExit):
        bench_main(["ddp", "--backends", "ddplite,memcpy"])
    assert "--backends: memcpy not available here" in capsys.readouterr().err


def test_size_list_and_its_description():
    from torch_ddp_lite.bench.sweep import describe_sizes, parse_size_list

    assert parse_size_list("1M,16,64K,16") == [16, 65536, 1 << 20]
    assert describe_sizes([16, 65536, 1 << 20]) == "16 B, 64 KB, 1 MB"
    assert describe_sizes([8, 32, 128], 4) == "8 B .. 128 B (x4)"
    for bad in ("", ",", "8,x"):
        with pytest.raises(ValueError):
            parse_size_list(bad)


# scripts/bench_today.py: the headline run of docs/benchmarks.md

def _script(name):
    """The module of scripts/<name>.py."""
    scripts = os.path.join(REPO, "scripts")
    sys.path.insert(0, scripts)
    try:
        return importlib.import_module(name)
    finally:
        sys.path.remove(scripts)  # the module may have put paths of its own in front


def _bench_today():
    return _script("bench_today")


def _today_row(op, backend, nbytes, time_us, busbw):
    return {"op": op, "backend": backend, "world_size": 2, "device": "cpu", "dtype": "float32", "bytes": nbytes,
            "count": nbytes // 4, "time_us": time_us, "algbw": busbw, "busbw": busbw}


def test_bench_today_renders_the_headline_table():
    today = _bench_today()
    meta = {"command": "python scripts/bench_today.py", "started": "2026-11-25T17:40:00",
            "finished": "2026-11-25T17:52:30", "seconds": 750, "load_average_start": [1.5, 1, 1],
            "load_average_end": [3.25, 2, 2], "world_sizes": [2], "launcher": "mpirun", "mpi": "Open MPI v4.1.4",
            "columns": ["ddplite", "ddplite-tcp", "ddplite-mpi", "gloo", "memcpy"], "host": "vm", "cpus": 2,
            "time_per_point": 0.5, "ddp": {"batch_per_rank": 32, "steps": 10, "rounds": 5}}
    rows = [_today_row("all_reduce", "ddplite", 16, 21.84, 0.0), _today_row("all_reduce", "gloo", 16, 262.1, 0.0),
            _today_row("all_reduce", "ddplite-mpi", 16, 43.7, 0.0), _today_row("all_reduce", "memcpy", 16, 1.6, 0.01),
            _today_row("all_reduce", "ddplite", 1 << 24, 2900.5, 5.784),
            _today_row("all_reduce", "gloo", 1 << 24, 14271.2, 1.176),
            _today_row("barrier", "ddplite", 0, 13.9, None), _today_row("barrier", "gloo", 0, 346.1, None)]
    ddp_rows = [{"model": "mlp", "backend": backend, "world_size": 2, "device": "cpu", "params": 25_194_506,
                 "batch_per_rank": 32, "step_ms": step, "images_per_s": 64 / step * 1e3}
                for backend, step in (("ddplite", 134.5), ("gloo", 184.9), ("no-comm", 100.2),
                                      ("ddp-alone", 111.1), ("allreduce-only", 8.6))]
    text = today.render_markdown(meta, {2: rows}, {2: ddp_rows}, ["2 ranks, sendrecv: gloo: RuntimeError: no"])
    lines = text.splitlines()
    assert lines[0].startswith("**2026-11-25**, `python scripts/bench_today.py`: 17:40-17:52, 12 min 30 s")
    assert "load average 1.5 at the start, 3.2 at the end" in text
    assert ("| op | size | ddplite (shm, default) | ddplite TCP | Open MPI | gloo | memcpy | ddplite vs gloo "
            "| ddplite vs Open MPI |") in lines
    # a missing cell is a dash; small sizes give the time only, 64 KiB and up add busbw
    assert "| all_reduce | 16 B | 21.8 µs | – | 43.7 µs | 262 µs | 1.6 µs | 12.0× | 2.00× |" in lines
    assert "| all_reduce | 16 MiB | 2.90 ms · 5.78 | – | – | 14.27 ms · 1.18 | – | 4.92× | – |" in lines
    assert "| barrier | – | 13.9 µs | – | – | 346 µs | – | 24.9× | – |" in lines
    assert "Not measured: 2 ranks, sendrecv: gloo: RuntimeError: no." in lines
    assert ("| 2 | mlp (25.2M) | 134 ms (1.34) | – | – | 185 ms (1.85) | 100 ms | 111 ms (1.11) | 8.6 ms |"
            in lines)
    assert "![collectives, 2 ranks](img/today_collectives_2ranks.png)" in lines


def test_bench_today_fills_only_the_marked_part_of_the_page(tmp_path):
    today = _bench_today()
    page = tmp_path / "page.md"
    page.write_text(f"# Title\n{today.MARK_BEGIN}\nold table\n{today.MARK_END}\n## History\nkept\n")
    assert today.update_doc(str(page), "new table\n")
    assert page.read_text() == f"# Title\n{today.MARK_BEGIN}\nnew table\n{today.MARK_END}\n## History\nkept\n"
    bare = tmp_path / "bare.md"
    bare.write_text("no markers\n")
    assert not today.update_doc(str(bare), "new table\n") and bare.read_text() == "no markers\n"


def test_bench_today_tiny_run_measures_every_column(tmp_path):
    """The real command at 2 ranks, two sizes, almost no time per point: every op has a row for
    every column (Open MPI's where mpirun and an MPI build are there), the DDP rows, the plots."""
    today = _bench_today()
    data, img = tmp_path / "data", tmp_path / "img"
    result = subprocess.run(
        [sys.executable, os.path.join(REPO, "scripts", "bench_today.py"), "--world-sizes", "2", "--sizes", "16,1K",
         "--time-per-point", "0.01", "--min-iters", "2", "--rounds", "2", "--ddp-models", "resnet18",
         "--ddp-batch-size", "2", "--ddp-steps", "1", "--ddp-warmup-steps", "1", "--ddp-rounds", "1",
         "--data-dir", str(data), "--img-dir", str(img), "--no-doc", "--timeout", "300"],
        cwd=REPO, capture_output=True, text=True, timeout=420)
    assert result.returncode == 0, result.stdout + result.stderr
    meta = json.loads((data / "meta.json").read_text())
    expected = ["ddplite", "ddplite-tcp", "gloo", "memcpy"]
    if today.mpi_usable()[0]:
        expected.insert(2, "ddplite-mpi")
    assert meta["columns"] == expected and meta["world_sizes"] == [2]
    rows = json.loads((data / "collectives_2ranks.json").read_text())
    for op in OPS:
        columns = [column for column in expected if not (op == "barrier" and column == "memcpy")]
        sizes = [0] if op == "barrier" else [16, 1024]
        assert sorted((row["backend"], row["bytes"]) for row in rows if row["op"] == op) == \
            sorted((column, size) for column in columns for size in sizes), op
    ddp_rows = json.loads((data / "ddp_2ranks.json").read_text())
    assert [row["backend"] for row in ddp_rows] == [c for c in expected if c != "memcpy"] + \
        ["no-comm", "ddp-alone", "allreduce-only"]
    table = (data / "table.md").read_text()
    assert "| all_reduce | 16 B |" in table and "| sendrecv | 1 KiB |" in table and "| 2 | resnet18 (11.2M) |" in table
    assert table in result.stdout
    for name in ("today_collectives_2ranks.png", "today_ddp.png"):
        assert (img / name).read_bytes()[:8] == PNG_MAGIC
    assert (data / "collect_env.txt").read_text().startswith("## torch")


def test_every_ddplite_column_has_a_row_with_its_settings_in_the_docs():
    """docs/benchmarks.md's columns table names every ddplite variant the bench offers, with each of
    the DDPLITE_* settings the variant applies."""
    from torch_ddp_lite.bench.launch import BACKEND_VARIANTS

    docs = open(os.path.join(REPO, "docs", "benchmarks.md")).read()
    rows = {line.split("|")[1].strip().strip("`"): line.split("|")[2] for line in docs.splitlines()
            if line.strip().startswith("| `ddplite-")}
    assert BACKEND_VARIANTS
    for column, (_, settings) in BACKEND_VARIANTS.items():
        assert column in rows, f"{column} has no row in docs/benchmarks.md's columns table"
        written = set(re.findall(r"`([A-Z_]+=[^`]*)`", rows[column]))
        assert written == {f"{name}={value}" for name, value in settings.items()}, (column, written, settings)


# scripts/crosshost_bench.py: the scheduler's autogroups, set for a run and put back after it

@pytest.mark.parametrize("before", ["1", "0"])
@pytest.mark.parametrize("setting, inside", [("on", "1"), ("off", "0"), ("keep", None)])
def test_crosshost_autogroups_hold_inside_the_run_and_come_back_after_it(tmp_path, before, setting, inside):
    """--autogroup writes kernel.sched_autogroup_enabled for the run only: the setting holds inside
    the block, and the value before it is back afterwards, after a failure too."""
    autogroups = _script("crosshost_bench").autogroups
    knob = tmp_path / "sched_autogroup_enabled"
    knob.write_text(before + "\n")
    with autogroups(setting, path=str(knob)) as held:
        assert held == knob.read_text().strip() == (inside or before)
    assert knob.read_text().strip() == before
    with pytest.raises(KeyboardInterrupt):
        with autogroups(setting, path=str(knob)):
            raise KeyboardInterrupt  # what an interrupted run raises through the block
    assert knob.read_text().strip() == before


def test_crosshost_autogroups_kept_are_never_written(tmp_path, monkeypatch):
    """'keep' only reads the knob, whatever its value."""
    crosshost_bench = _script("crosshost_bench")
    knob = tmp_path / "sched_autogroup_enabled"
    knob.write_text("1\n")
    modes = []

    def spying_open(path, mode="r", *args, **kwargs):
        modes.append(mode)
        return open(path, mode, *args, **kwargs)

    monkeypatch.setattr(crosshost_bench, "open", spying_open, raising=False)
    with crosshost_bench.autogroups("keep", path=str(knob)) as held:
        assert held == "1"
    assert modes == ["r"]


@pytest.mark.parametrize("value, words", [("1", "scheduler autogroups on (each host's ranks"),
                                          ("0", "scheduler autogroups off"), (None, "no scheduler autogroups"),
                                          ("2", "sched_autogroup_enabled 2")])
def test_crosshost_header_names_the_autogroups(value, words):
    assert _script("crosshost_bench").describe_autogroup(value).startswith(words)


def test_crosshost_autogroups_without_the_knob(tmp_path):
    """A kernel without autogroups: 'keep' runs and says so (None), 'on' and 'off' refuse."""
    autogroups = _script("crosshost_bench").autogroups
    missing = str(tmp_path / "absent")
    with autogroups("keep", path=missing) as held:
        assert held is None
    for setting in ("on", "off"):
        with pytest.raises(RuntimeError, match=f"--autogroup {setting}: this kernel has no"):
            with autogroups(setting, path=missing):
                pass
