#!/usr/bin/env python3
"""Today's headline numbers: every op and the DDP step, on every CPU path, at 2 and 4 ranks.

    python scripts/bench_today.py                  # the whole run (about 10 minutes on 2 cores)
    python scripts/bench_today.py --render-only    # the markdown again, from the JSON already written

One command runs ``python -m torch_ddp_lite.bench`` (the collectives) and ``python -m
torch_ddp_lite.bench ddp`` (the DDP step) once per world size. In each run every column is
measured together, interleaved (the tool's rounds), so the columns of one table are comparable
even on a loaded machine; numbers from different runs are not. The columns:

* ``ddplite``: the default, shared memory between ranks on one host;
* ``ddplite-tcp``: ``DDPLITE_CPU_TRANSPORT=tcp`` (loopback TCP);
* ``ddplite-mpi``: ``DDPLITE_CPU_TRANSPORT=mpi``, i.e. Open MPI's own collectives (its
  shared-memory BTL) behind ddplite's API. torch's pip wheel has no MPI backend, so this is how
  Open MPI is measured. It needs ddplite built with MPI and ``mpirun``: when both are there, the
  ranks are started by ``mpirun`` (for every column); otherwise by the tool itself, and the
  column is left out with a note;
* ``gloo``; and ``memcpy``, the yardstick: each rank copies the same bytes between two of its
  own buffers at once (no collective: the memory system's speed).

Outputs (``--data-dir``, ``--img-dir``): ``collectives_{N}ranks.json`` and ``ddp_{N}ranks.json``
(the tool's rows), ``*.txt`` (the tool's own nccl-tests-style tables and its header lines),
``collect_env.txt``, ``meta.json`` (date, command, duration, load averages, machine),
``table.md`` (the markdown below), and the plots ``today_collectives_{N}ranks.png`` (the tool's)
and ``today_ddp.png``. The markdown is printed, written to ``table.md`` and put into
``docs/benchmarks.md`` between the ``<!-- bench_today:begin -->`` and ``<!-- bench_today:end -->``
markers (``--no-doc`` leaves the page alone).

``DDPLITE_*`` variables set in the calling shell are dropped: the columns are ddplite's defaults
and the variants above. Run it with normal priority; the machine's load is recorded, not
controlled.
"""

import argparse
import datetime
import json
import os
import platform
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if REPO not in sys.path:
    sys.path.insert(0, REPO)

from torch_ddp_lite.bench.sweep import OPS, parse_size_list  # noqa: E402

# (column, label in the markdown), in table order
COLUMNS = (("ddplite", "ddplite (shm, default)"), ("ddplite-tcp", "ddplite TCP"), ("ddplite-mpi", "Open MPI"),
           ("gloo", "gloo"), ("memcpy", "memcpy"))
DDP_YARDSTICKS = (("no-comm", "no-comm"), ("ddp-alone", "ddp-alone"), ("allreduce-only", "allreduce-only"))
BUSBW_FROM = 64 * 1024  # below this the cells give the time only (busbw ~ 0: latency regime)
DEFAULT_SIZES = "16,64K,1M,16M"  # 16 B: the smallest float32 size that gives each of 4 ranks an element
MARK_BEGIN, MARK_END = "<!-- bench_today:begin -->", "<!-- bench_today:end -->"
MPI_ENV = {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
           "OMPI_MCA_rmaps_base_oversubscribe": "1",  # 4 ranks on 2 cores
           "OMPI_MCA_btl_vader_single_copy_mechanism": "none"}  # containers refuse cross-memory attach


def build_parser():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--world-sizes", default="2,4", help="comma list of rank counts (default 2,4)")
    parser.add_argument("--sizes", default=DEFAULT_SIZES, help=f"bytes per op (default {DEFAULT_SIZES})")
    parser.add_argument("--ops", default=",".join(OPS), help="comma list of the tool's ops (default: all)")
    parser.add_argument("--time-per-point", type=float, default=0.5,
                        help="seconds of measured iterations per op, size and column (default 0.5)")
    parser.add_argument("--min-iters", type=int, default=5, help="fewest measured iterations per point (default 5)")
    parser.add_argument("--rounds", type=int, default=10, help="interleaved rounds per point (default 10)")
    parser.add_argument("--ddp-models", default="mlp,resnet18", help="models of the DDP step (default mlp,resnet18)")
    parser.add_argument("--ddp-batch-size", type=int, default=32, help="images per rank and step (default 32)")
    parser.add_argument("--ddp-steps", type=int, default=10, help="measured DDP steps per column (default 10)")
    parser.add_argument("--ddp-warmup-steps", type=int, default=2, help="DDP warm-up steps (default 2)")
    parser.add_argument("--ddp-rounds", type=int, default=5, help="interleaved rounds of DDP steps (default 5)")
    parser.add_argument("--no-ddp", action="store_true", help="collectives only")
    parser.add_argument("--no-mpi", action="store_true",
                        help="never use mpirun: the tool starts the ranks, no Open MPI column")
    parser.add_argument("--data-dir", default=os.path.join(REPO, "docs", "data", "today"))
    parser.add_argument("--img-dir", default=os.path.join(REPO, "docs", "img"))
    parser.add_argument("--doc", default=os.path.join(REPO, "docs", "benchmarks.md"),
                        help="page whose bench_today markers receive the markdown (default docs/benchmarks.md)")
    parser.add_argument("--no-doc", action="store_true", help="do not touch --doc")
    parser.add_argument("--timeout", type=float, default=1200, help="seconds allowed per tool run (default 1200)")
    parser.add_argument("--render-only", action="store_true",
                        help="measure nothing: render the markdown from --data-dir's JSON and meta.json")
    return parser


# ---------------------------------------------------------------------------------------------
# running the tool


def mpi_usable():
    """(True, how) when the Open MPI column can be measured here, else (False, why not)."""
    mpirun = shutil.which("mpirun")
    if mpirun is None:
        return False, "mpirun not found"
    import torch_ddp_lite

    info = torch_ddp_lite.build_info()
    if not info.get("mpi"):
        return False, "ddplite is built without MPI"
    return True, info.get("mpi_library") or "MPI"


def free_port():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def clean_environment():
    """The caller's environment without launcher variables and without DDPLITE_* settings."""
    env = {name: value for name, value in os.environ.items()
           if not name.startswith("DDPLITE_") and name not in ("RANK", "WORLD_SIZE", "LOCAL_RANK",
                                                                 "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [REPO, env.get("PYTHONPATH")]))
    return env


def tool_command(world_size, tool_args, use_mpi):
    """(argv, env) running the benchmark tool on `world_size` ranks."""
    env = clean_environment()
    module = [sys.executable, "-m", "torch_ddp_lite.bench", *tool_args]
    if not use_mpi:
        return module + ["--world-size", str(world_size)], env
    env.update(MPI_ENV, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
    return ["mpirun", "-np", str(world_size), "--bind-to", "none", "-x", "MASTER_ADDR", "-x", "MASTER_PORT",
            "-x", "PYTHONPATH", *module], env


def run_logged(argv, env, log_path, timeout):
    """Runs `argv`, echoing its output and writing it to `log_path`; raises when it fails."""
    print("$ " + shlex.join(argv), flush=True)
    deadline = time.monotonic() + timeout
    with open(log_path, "w") as log:
        process = subprocess.Popen(argv, env=env, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                   text=True, start_new_session=True)
        try:
            for line in process.stdout:
                sys.stdout.write(line)
                log.write(line)
                if time.monotonic() > deadline:
                    raise subprocess.TimeoutExpired(argv, timeout)
            process.wait(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)  # the group this call started: the tool and its ranks
            process.wait()
            raise SystemExit(f"bench_today: {argv[0]} ran past {timeout:.0f} s; partial output in {log_path}")
    if process.returncode != 0:
        raise SystemExit(f"bench_today: exit code {process.returncode}; see {log_path}")


def collectives_args(options, world_size, columns):
    return ["collectives", "--backends", ",".join(columns), "--ops", options.ops,
            "--sizes", ",".join(str(size) for size in parse_size_list(options.sizes)),
            "--time-per-point", str(options.time_per_point), "--min-iters", str(options.min_iters),
            "--rounds", str(options.rounds),
            "--json", os.path.join(options.data_dir, f"collectives_{world_size}ranks.json"),
            "--plot", os.path.join(options.img_dir, f"today_collectives_{world_size}ranks.png")]


def ddp_args(options, world_size, columns):
    return ["ddp", "--backends", ",".join(column for column in columns if column != "memcpy"),
            "--models", options.ddp_models, "--batch-size", str(options.ddp_batch_size),
            "--steps", str(options.ddp_steps), "--warmup-steps", str(options.ddp_warmup_steps),
            "--rounds", str(options.ddp_rounds), "--json", os.path.join(options.data_dir, f"ddp_{world_size}ranks.json")]


def collect_env_text():
    result = subprocess.run([sys.executable, "-m", "torch_ddp_lite.collect_env"], env=clean_environment(), cwd=REPO,
                            capture_output=True, text=True, timeout=120)
    return result.stdout


def env_value(text, key):
    for line in text.splitlines():
        if line.startswith(key + ": "):
            return line[len(key) + 2:].strip()
    return None


def memory_gib():
    try:
        with open("/proc/meminfo") as handle:
            kib = int(next(line for line in handle if line.startswith("MemTotal")).split()[1])
        return round(kib / (1 << 20))
    except (OSError, StopIteration, ValueError):
        return None


def git_head():
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True,
                              timeout=20).stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


def measure(options, argv):
    os.makedirs(options.data_dir, exist_ok=True)
    os.makedirs(options.img_dir, exist_ok=True)
    world_sizes = [int(n) for n in options.world_sizes.split(",")]
    use_mpi, mpi_text = (False, "--no-mpi given") if options.no_mpi else mpi_usable()
    columns = [name for name, _ in COLUMNS if use_mpi or name != "ddplite-mpi"]
    started = datetime.datetime.now()
    load_start = os.getloadavg()
    env_text = collect_env_text()
    with open(os.path.join(options.data_dir, "collect_env.txt"), "w") as handle:
        handle.write(env_text)
    print(f"# bench_today: world sizes {world_sizes}, columns {','.join(columns)}, launcher "
          f"{'mpirun' if use_mpi else 'the tool (spawn)'} ({mpi_text}); load average {load_start[0]:.2f}", flush=True)
    for world_size in world_sizes:
        argv_tool, env = tool_command(world_size, collectives_args(options, world_size, columns), use_mpi)
        run_logged(argv_tool, env, os.path.join(options.data_dir, f"collectives_{world_size}ranks.txt"),
                   options.timeout)
        if not options.no_ddp:
            argv_tool, env = tool_command(world_size, ddp_args(options, world_size, columns), use_mpi)
            run_logged(argv_tool, env, os.path.join(options.data_dir, f"ddp_{world_size}ranks.txt"), options.timeout)
    finished = datetime.datetime.now()
    meta = {
        "command": "python scripts/bench_today.py" + (" " + shlex.join(argv) if argv else ""),
        "started": started.isoformat(timespec="seconds"),
        "finished": finished.isoformat(timespec="seconds"),
        "seconds": round((finished - started).total_seconds()),
        "load_average_start": [round(value, 2) for value in load_start],
        "load_average_end": [round(value, 2) for value in os.getloadavg()],
        "world_sizes": world_sizes,
        "columns": columns,
        "launcher": "mpirun" if use_mpi else "spawn",
        "mpi": mpi_text,
        "git_head": git_head(),
        "host": platform.node(),
        "cpus": os.cpu_count(),
        "memory_gib": memory_gib(),
        "cpu_model": env_value(env_text, "CPU"),
        "platform": env_value(env_text, "platform"),
        "torch": env_value(env_text, "torch"),
        "mpirun": env_value(env_text, "mpirun"),
        "kernels": env_value(env_text, "CPU reduction kernels"),
        "time_per_point": options.time_per_point,
        "ddp": None if options.no_ddp else {"models": options.ddp_models, "batch_per_rank": options.ddp_batch_size,
                                            "steps": options.ddp_steps, "rounds": options.ddp_rounds},
    }
    with open(os.path.join(options.data_dir, "meta.json"), "w") as handle:
        json.dump(meta, handle, indent=1)
        handle.write("\n")
    return meta


# ---------------------------------------------------------------------------------------------
# rendering (pure: rows and meta in, markdown out)


def size_label(nbytes):
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if nbytes >= scale and nbytes % scale == 0:
            return f"{nbytes // scale} {unit}"
    return f"{nbytes} B"


def time_text(microseconds):
    if microseconds >= 1000:
        return f"{microseconds / 1000:.2f} ms"
    return f"{microseconds:.1f} µs" if microseconds < 100 else f"{microseconds:.0f} µs"


def step_text(milliseconds):
    return f"{milliseconds:.1f} ms" if milliseconds < 100 else f"{milliseconds:.0f} ms"


def cell_text(row):
    """'48.2 µs' below BUSBW_FROM (and for barrier), '2.90 ms · 5.78' (busbw, GB/s) from there; '–' if absent."""
    if row is None:
        return "–"
    text = time_text(row["time_us"])
    if row["busbw"] is not None and row["bytes"] >= BUSBW_FROM:
        text += f" · {row['busbw']:.2f}"
    return text


def speedup_text(reference, other):
    """other's time / reference's time ('4.2×': the reference is 4.2 times faster), '–' if either is absent."""
    if reference is None or other is None or not reference["time_us"]:
        return "–"
    ratio = other["time_us"] / reference["time_us"]
    return f"{ratio:.1f}×" if ratio >= 10 else f"{ratio:.2f}×"


def collectives_table(rows, columns):
    """One markdown table: a line per op and size, a cell per column, then ddplite's speed-up over
    gloo and over Open MPI (their time / ddplite's)."""
    labels = dict(COLUMNS)
    index = {(row["op"], row["backend"], row["bytes"]): row for row in rows}
    ratio_columns = [name for name in ("gloo", "ddplite-mpi") if name in columns]
    head = ["op", "size", *(labels[name] for name in columns),
            *(f"ddplite vs {labels[name]}" for name in ratio_columns)]
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join([":---", "---:"] + ["---:"] * (len(head) - 2)) + "|"]
    ops = [op for op in OPS if any(row["op"] == op for row in rows)]
    for op in ops:
        for nbytes in sorted({row["bytes"] for row in rows if row["op"] == op}):
            cells = [index.get((op, name, nbytes)) for name in columns]
            reference = index.get((op, "ddplite", nbytes))
            size = "–" if op == "barrier" else size_label(nbytes)
            lines.append("| " + " | ".join([op, size, *(cell_text(cell) for cell in cells),
                                            *(speedup_text(reference, index.get((op, name, nbytes)))
                                              for name in ratio_columns)]) + " |")
    return "\n".join(lines)


def ddp_table(rows_by_world_size, columns):
    """A line per world size and model: each column's step time and, in brackets, step / no-comm."""
    labels = dict(COLUMNS)
    measured = [name for name in columns if name != "memcpy"]
    head = ["ranks", "model", *(labels[name] for name in measured), *(label for _, label in DDP_YARDSTICKS)]
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join(["---:", ":---"] + ["---:"] * (len(head) - 2)) + "|"]
    for world_size, rows in sorted(rows_by_world_size.items()):
        for model in dict.fromkeys(row["model"] for row in rows):
            by_backend = {row["backend"]: row for row in rows if row["model"] == model}
            compute = by_backend.get("no-comm")
            params = next(iter(by_backend.values()))["params"]
            cells = []
            for name in [*measured, *(name for name, _ in DDP_YARDSTICKS)]:
                row = by_backend.get(name)
                if row is None:
                    cells.append("–")
                elif compute is None or name in ("no-comm", "allreduce-only"):
                    cells.append(step_text(row["step_ms"]))
                else:
                    cells.append(f"{step_text(row['step_ms'])} ({row['step_ms'] / compute['step_ms']:.2f})")
            lines.append("| " + " | ".join([str(world_size), f"{model} ({params / 1e6:.1f}M)", *cells]) + " |")
    return "\n".join(lines)


def unsupported_notes(log_text):
    """'op: backend: why' for each column the tool could not run (the memcpy barrier excepted)."""
    notes, op = [], None
    for line in log_text.splitlines():
        if line.startswith("# ") and line[2:].strip() in OPS:
            op = line[2:].strip()
        match = re.match(r"# (\S+): not measured, unsupported here \((.*)\)$", line)
        if match and not (match.group(1) == "memcpy" and op == "barrier"):
            notes.append(f"{op}: {match.group(1)}: {match.group(2)}")
    return notes


def duration_text(seconds):
    minutes, seconds = divmod(int(seconds), 60)
    return f"{minutes} min {seconds} s" if minutes else f"{seconds} s"


def render_markdown(meta, collective_rows, ddp_rows, notes=(), img_prefix="img/"):
    """The headline: a paragraph on the run, one collectives table per world size, the DDP table,
    the plots. `collective_rows` and `ddp_rows` map world size to the tool's JSON rows."""
    columns = meta["columns"]
    started = datetime.datetime.fromisoformat(meta["started"])
    finished = datetime.datetime.fromisoformat(meta["finished"])
    load_start, load_end = meta["load_average_start"][0], meta["load_average_end"][0]
    mpi_note = ("Open MPI = `ddplite-mpi` (`DDPLITE_CPU_TRANSPORT=mpi`: Open MPI's own collectives, its "
                f"shared-memory BTL, behind ddplite's API; {meta['mpi']})" if "ddplite-mpi" in columns
                else f"no Open MPI column ({meta['mpi']})")
    machine = ", ".join(filter(None, [
        f"`{meta['host']}`", f"{meta['cpus']} CPUs ({meta['cpu_model']})" if meta.get("cpu_model") else
        f"{meta['cpus']} CPUs", f"{meta['memory_gib']} GiB" if meta.get("memory_gib") else None,
        meta.get("platform"), f"torch {meta['torch']}" if meta.get("torch") else None,
        meta.get("mpirun"), f"ddplite kernels {meta['kernels']}" if meta.get("kernels") else None,
        f"tree at `{meta['git_head']}`" if meta.get("git_head") else None]))
    out = [
        f"**{started:%Y-%m-%d}**, `{meta['command']}`: {started:%H:%M}-{finished:%H:%M}, "
        f"{duration_text(meta['seconds'])}, ranks started by "
        f"{'`mpirun` (every column)' if meta['launcher'] == 'mpirun' else 'the tool'}, 1 torch thread per rank, "
        f"float32, {meta['time_per_point']} s of iterations per point and column.",
        "",
        f"Machine: {machine}. **Shared and noisy**: other jobs ran on the same 2 cores "
        f"(load average {load_start:.1f} at the start, {load_end:.1f} at the end, the run's own ranks included); "
        f"read the ratios "
        f"within one table (measured in the same run, interleaved), not absolute numbers across runs. "
        f"Raw rows, the tool's own tables and `collect_env`: `docs/data/today/`.",
        "",
        f"Cells: median time per op of the slowest rank; from {size_label(BUSBW_FROM)} also "
        "` · busbw` in GB/s (nccl-tests' bus bandwidth). `ddplite vs X` = X's time / ddplite's "
        f"(above 1×: ddplite is faster). {mpi_note}. memcpy: each rank copies the same bytes "
        "between two of its own buffers at once, the memory system's yardstick (no collective).",
    ]
    for world_size in sorted(collective_rows):
        out += ["", f"#### {world_size} ranks", "", collectives_table(collective_rows[world_size], columns)]
    if notes:
        out += ["", "Not measured: " + "; ".join(notes) + "."]
    if ddp_rows:
        ddp = meta.get("ddp") or {}
        out += ["", "#### DDP step", "",
                f"`python -m torch_ddp_lite.bench ddp`: median step time (forward, backward with DDP's bucketed "
                f"all-reduce, SGD step) of the slowest rank, batch {ddp.get('batch_per_rank', '?')} per rank, "
                f"{ddp.get('steps', '?')} steps per column in {ddp.get('rounds', '?')} interleaved rounds; in "
                "brackets, step / no-comm (1.00: communication costs nothing that backward does not hide). "
                "no-comm: the same step under `no_sync()`; ddp-alone: DDP on a group of one rank (its hooks "
                "and bucket copies, no exchange); allreduce-only: the gradients' all_reduce in 25 MB buckets, "
                "no compute. images/s = batch × ranks / step time.",
                "", ddp_table(ddp_rows, columns)]
    out += ["", *(f"![collectives, {n} ranks]({img_prefix}today_collectives_{n}ranks.png)"
                  for n in sorted(collective_rows))]
    if ddp_rows:
        out.append(f"![DDP step]({img_prefix}today_ddp.png)")
    return "\n".join(out) + "\n"


def write_ddp_plot(path, ddp_rows, columns, title):
    """Step time per column, grouped by (world size, model); the no-comm yardstick as a dashed line."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = dict(COLUMNS)
    measured = [name for name in columns if name != "memcpy"] + ["ddp-alone"]
    groups = [(n, model) for n in sorted(ddp_rows) for model in dict.fromkeys(row["model"] for row in ddp_rows[n])]
    figure, axes = plt.subplots(1, len(groups), figsize=(3.2 * len(groups) + 1, 3.6), squeeze=False,
                                layout="constrained")
    for axis, (world_size, model) in zip(axes[0], groups):
        by_backend = {row["backend"]: row for row in ddp_rows[world_size] if row["model"] == model}
        names = [name for name in measured if name in by_backend]
        axis.bar(range(len(names)), [by_backend[name]["step_ms"] for name in names],
                 color=[f"C{measured.index(name)}" for name in names])
        axis.set_xticks(range(len(names)), [labels.get(name, name).replace(" (shm, default)", "") for name in names],
                        rotation=40, ha="right")
        if "no-comm" in by_backend:
            axis.axhline(by_backend["no-comm"]["step_ms"], color="black", linestyle="--", linewidth=1,
                         label="no-comm")
            axis.legend(loc="lower right", fontsize="small")
        axis.set(title=f"{model}, {world_size} ranks", ylabel="step (ms)")
        axis.grid(True, axis="y", alpha=0.4)
    figure.suptitle(title)
    figure.savefig(path, dpi=110)
    plt.close(figure)


def load_results(data_dir, world_sizes):
    collective_rows, ddp_rows, notes = {}, {}, []
    for world_size in world_sizes:
        path = os.path.join(data_dir, f"collectives_{world_size}ranks.json")
        if os.path.exists(path):
            with open(path) as handle:
                collective_rows[world_size] = json.load(handle)
        log = os.path.join(data_dir, f"collectives_{world_size}ranks.txt")
        if os.path.exists(log):
            with open(log) as handle:
                notes += [f"{world_size} ranks, {note}" for note in unsupported_notes(handle.read())]
        path = os.path.join(data_dir, f"ddp_{world_size}ranks.json")
        if os.path.exists(path):
            with open(path) as handle:
                ddp_rows[world_size] = json.load(handle)
    return collective_rows, ddp_rows, notes


def update_doc(path, markdown):
    """Replaces what lies between the bench_today markers in `path`; False when they are missing."""
    with open(path) as handle:
        text = handle.read()
    begin, end = text.find(MARK_BEGIN), text.find(MARK_END)
    if begin < 0 or end < begin:
        return False
    with open(path, "w") as handle:
        handle.write(text[:begin + len(MARK_BEGIN)] + "\n" + markdown + text[end:])
    return True


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    options = build_parser().parse_args(argv)
    options.data_dir, options.img_dir = os.path.abspath(options.data_dir), os.path.abspath(options.img_dir)
    parse_size_list(options.sizes)  # refuse a bad list before measuring
    if options.render_only:
        with open(os.path.join(options.data_dir, "meta.json")) as handle:
            meta = json.load(handle)
    else:
        meta = measure(options, argv)
    collective_rows, ddp_rows, notes = load_results(options.data_dir, meta["world_sizes"])
    if ddp_rows:
        write_ddp_plot(os.path.join(options.img_dir, "today_ddp.png"), ddp_rows, meta["columns"],
                       f"DDP step, {meta['started'][:10]} (same-run columns)")
    img_prefix = os.path.relpath(options.img_dir, os.path.dirname(os.path.abspath(options.doc))) + "/"
    markdown = render_markdown(meta, collective_rows, ddp_rows, notes, img_prefix=img_prefix)
    with open(os.path.join(options.data_dir, "table.md"), "w") as handle:
        handle.write(markdown)
    print("\n" + markdown, flush=True)
    if not options.no_doc:
        if update_doc(options.doc, markdown):
            print(f"# bench_today: updated {os.path.relpath(options.doc, REPO)}", flush=True)
        else:
            print(f"# bench_today: no {MARK_BEGIN} ... {MARK_END} in {options.doc}; not updated", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
