#!/usr/bin/env python3
"""CPU time per small all_reduce and rank, on one host, for ddplite, gloo and Open MPI's
MPI_Allreduce (a small C program), in one interleaved run.

When a job has more ranks than cores (the namespace hosts of scripts/crosshost_bench.py put 4 or 8
ranks on this machine's 2), a small all_reduce is CPU-bound: its time is about the CPU every rank
spends on one op, times the ranks, divided by the cores. This script measures that CPU (user and
system, all threads of the rank's process, from os.times() or getrusage) next to the time, so the
gap to Open MPI's C program splits into what each side spends.

    python3 scripts/cpu_per_op.py                                  # 1, 2 and 4 ranks, 8 B
    python3 scripts/cpu_per_op.py --ranks 4 --rounds 3 --markdown /tmp/cpu.md
    python3 scripts/cpu_per_op.py --ranks 4 --perf-stat     # and syscalls, switches per op (perf)

Configurations (each run by its own launcher, in turn, --rounds times; medians printed):
  ddplite-tcp    DDPLITE_CPU_TRANSPORT=tcp (the path between hosts), torchrun
  ddplite-shm    DDPLITE_CPU_TRANSPORT=shm (the default on one host), torchrun
  gloo           torchrun
  openmpi-tcp    mpirun --mca btl tcp,self (Open MPI's path between hosts), the C program
  openmpi-vader  mpirun --mca btl vader,self (Open MPI's shared memory), the C program
Open MPI runs as scripts/crosshost_bench.py sets it up for shared cores: --bind-to none,
mpi_yield_when_idle 1. Per configuration: a warm-up, then as many all_reduce calls as fill
--seconds (the ranks agree on the count), timed on every rank; the time is the slowest rank's,
the CPU the mean of the ranks' (the launcher's own, torchrun's agent or mpirun, is not counted).
"floor" = ranks x CPU / cores: the time the op cannot beat when the ranks share the cores and
each one needs that CPU. A launch that outlives --timeout is killed with its ranks.
"""

import argparse
import functools
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

WARMUP_CALLS = 500       # untimed, before anything is measured
CALIBRATION_CALLS = 200  # timed to size the measured loop to --seconds

C_PROGRAM = r"""
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/resource.h>

static double cpu_us(int system) {
  struct rusage usage;
  getrusage(RUSAGE_SELF, &usage);  /* every thread of the process, as Python's os.times() */
  struct timeval t = system ? usage.ru_stime : usage.ru_utime;
  return t.tv_sec * 1e6 + t.tv_usec;
}

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  int count = atoi(argv[1]);
  double seconds = atof(argv[2]);
  float* data = calloc(count > 0 ? count : 1, sizeof(float));
  for (int i = 0; i < WARMUP_CALLS; i++) MPI_Allreduce(MPI_IN_PLACE, data, count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
  double start = MPI_Wtime();
  for (int i = 0; i < CALIBRATION_CALLS; i++)
    MPI_Allreduce(MPI_IN_PLACE, data, count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
  double iterations = seconds / ((MPI_Wtime() - start) / CALIBRATION_CALLS);
  MPI_Allreduce(MPI_IN_PLACE, &iterations, 1, MPI_DOUBLE, MPI_MIN, MPI_COMM_WORLD);
  long n = iterations < 100 ? 100 : (long)iterations;
  MPI_Barrier(MPI_COMM_WORLD);
  double user0 = cpu_us(0), sys0 = cpu_us(1);
  start = MPI_Wtime();
  for (long i = 0; i < n; i++) MPI_Allreduce(MPI_IN_PLACE, data, count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
  double wall = (MPI_Wtime() - start) * 1e6 / n;
  printf("RESULT {\"rank\": %d, \"wall_us\": %.3f, \"user_us\": %.3f, \"sys_us\": %.3f, \"iterations\": %ld}\n",
         rank, wall, (cpu_us(0) - user0) / n, (cpu_us(1) - sys0) / n, n);
  free(data);
  MPI_Finalize();
  return 0;
}
"""


def worker(backend, count, seconds):
    """One rank under torchrun: the C program's loop, through torch.distributed (the same
    warm-up, calibration, agreed count and barrier; os.times() counts every thread)."""
    import time

    import torch
    import torch.distributed as dist

    if backend == "ddplite":
        sys.path.insert(0, REPO)
        import torch_ddp_lite  # noqa: F401  (registers the backend where torch's autoload is off)
    dist.init_process_group(backend)
    data = torch.zeros(count)
    for _ in range(WARMUP_CALLS):
        dist.all_reduce(data)
    start = time.perf_counter()
    for _ in range(CALIBRATION_CALLS):
        dist.all_reduce(data)
    iterations = torch.tensor([seconds / ((time.perf_counter() - start) / CALIBRATION_CALLS)], dtype=torch.float64)
    dist.all_reduce(iterations, op=dist.ReduceOp.MIN)
    n = max(100, int(iterations.item()))
    dist.barrier()
    before = os.times()
    start = time.perf_counter()
    for _ in range(n):
        dist.all_reduce(data)
    wall = (time.perf_counter() - start) * 1e6 / n
    after = os.times()
    print("RESULT " + json.dumps({"rank": dist.get_rank(), "wall_us": wall, "iterations": n,
                                  "user_us": (after.user - before.user) * 1e6 / n,
                                  "sys_us": (after.system - before.system) * 1e6 / n}), flush=True)
    dist.destroy_process_group()


def parse_results(output, ranks, label):
    """{wall_us: the slowest rank's, user_us and sys_us: the ranks' mean, iterations} from the
    ranks' RESULT reports; RuntimeError naming ``label`` when a rank's is missing or garbled."""
    # the ranks share one pipe: a line may hold another rank's report too
    reports = re.findall(r"RESULT (\{[^{}]*\})", output)
    try:
        found = [json.loads(text) for text in reports]
    except json.JSONDecodeError as error:
        raise RuntimeError(f"{label}: a garbled report ({error})\n{output[-3000:]}") from None
    if len(found) != ranks:
        raise RuntimeError(f"{label}: {len(found)} of {ranks} ranks reported\n{output[-3000:]}")
    return {"wall_us": max(r["wall_us"] for r in found),
            "user_us": statistics.mean(r["user_us"] for r in found),
            "sys_us": statistics.mean(r["sys_us"] for r in found),
            "iterations": found[0]["iterations"]}


def run_launcher(command, env, timeout, label):
    """Runs a launcher (torchrun, mpirun) in a session of its own and returns its output; past
    ``timeout`` the whole session is killed (the ranks too, not only the launcher) and
    RuntimeError names ``label``."""
    proc = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    try:
        output, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        output, _ = proc.communicate()
        raise RuntimeError(f"{label}: no result within {timeout:.0f} s\n{output[-3000:]}") from None
    return output


# --perf-stat: what a launch does in the kernel, counted machine-wide over the whole launch
# (set-up included; with a few seconds of loop, the loop is nearly all of these events).
PERF_EVENTS = ("context-switches", "syscalls:sys_enter_sched_yield", "syscalls:sys_enter_poll",
               "syscalls:sys_enter_futex", "syscalls:sys_enter_readv", "syscalls:sys_enter_writev",
               "syscalls:sys_enter_sendto", "syscalls:sys_enter_recvfrom")


def counted(command, perf_file):
    """``command`` under `perf stat -a` writing CSV to ``perf_file``; unchanged without one."""
    if not perf_file:
        return command
    return ["perf", "stat", "-a", "-x", ",", "-o", perf_file, "-e", ",".join(PERF_EVENTS), "--"] + command


def per_op_and_rank(perf_file, figures, ranks):
    """perf's counts of one launch divided by its calls (warm-up, calibration and loop) of every rank."""
    calls = ranks * (WARMUP_CALLS + CALIBRATION_CALLS + figures["iterations"])
    counts = {}
    with open(perf_file) as f:
        for line in f:
            fields = line.strip().split(",")
            if len(fields) > 2 and not line.startswith("#") and fields[0].replace(".", "").isdigit():
                counts[fields[2].replace("syscalls:sys_enter_", "")] = float(fields[0]) / calls
    return counts


def run_torch(ranks, count, seconds, timeout, backend, transport=None, perf_file=None):
    """One configuration through torchrun; ``transport`` sets DDPLITE_CPU_TRANSPORT for ddplite."""
    env = dict(os.environ, OMP_NUM_THREADS="1")
    env.pop("DDPLITE_CPU_TRANSPORT", None)
    if transport:
        env["DDPLITE_CPU_TRANSPORT"] = transport
    label = f"{backend}{'-' + transport if transport else ''} at {ranks} ranks"
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(ranks),
               os.path.abspath(__file__), "--worker", backend, "--count", str(count), "--seconds", str(seconds)]
    return with_counts(parse_results(run_launcher(counted(command, perf_file), env, timeout, label), ranks, label),
                       perf_file, ranks)


def with_counts(figures, perf_file, ranks):
    if perf_file:
        figures["per_op_and_rank"] = per_op_and_rank(perf_file, figures, ranks)
    return figures


def run_mpi(ranks, count, seconds, timeout, program, btl, folder, perf_file=None):
    """One configuration of the C program through mpirun, set up as crosshost_bench.py does."""
    label = f"Open MPI ({btl}) at {ranks} ranks"
    command = ["mpirun", "--allow-run-as-root", "--oversubscribe", "-np", str(ranks), "--bind-to", "none",
               # its session files and vader's segments in the run's folder: removed even after a kill
               "--mca", "orte_tmpdir_base", folder, "--mca", "btl_vader_backing_directory", folder,
               "--mca", "btl", btl, "--mca", "mpi_yield_when_idle", "1",
               program, str(count), str(seconds)]
    output = run_launcher(counted(command, perf_file), dict(os.environ), timeout, label)
    return with_counts(parse_results(output, ranks, label), perf_file, ranks)


CONFIGURATIONS = ("ddplite-tcp", "ddplite-shm", "gloo", "openmpi-tcp", "openmpi-vader")


def configurations(program, folder, perf_file=None):
    """name -> callable(ranks, count, seconds, timeout) -> parse_results()'s figures (and, with
    ``perf_file``, perf's counts per op and rank)."""
    found = {
        "ddplite-tcp": functools.partial(run_torch, backend="ddplite", transport="tcp", perf_file=perf_file),
        "ddplite-shm": functools.partial(run_torch, backend="ddplite", transport="shm", perf_file=perf_file),
        "gloo": functools.partial(run_torch, backend="gloo", perf_file=perf_file),
    }
    if program:
        for name, btl in (("openmpi-tcp", "tcp,self"), ("openmpi-vader", "vader,self")):
            found[name] = functools.partial(run_mpi, program=program, btl=btl, folder=folder, perf_file=perf_file)
    return found


def build_c_program(folder):
    """Compiles C_PROGRAM into ``folder`` with mpicc; None (and a note) where Open MPI is missing."""
    if not (shutil.which("mpicc") and shutil.which("mpirun")):
        print("no mpicc/mpirun (Debian: openmpi-bin libopenmpi-dev): the Open MPI rows are left out", flush=True)
        return None
    source = os.path.join(folder, "allreduce_cpu.c")
    with open(source, "w") as f:
        f.write(C_PROGRAM)
    program = os.path.join(folder, "allreduce_cpu")
    subprocess.run(["mpicc", "-O2", f"-DWARMUP_CALLS={WARMUP_CALLS}", f"-DCALIBRATION_CALLS={CALIBRATION_CALLS}",
                    "-o", program, source], check=True)
    return program


def medians(results):
    """{ranks: {name: {wall_us, user_us, sys_us}}}: each figure's median over the rounds."""
    return {ranks: {name: {key: statistics.median(r[key] for r in rounds) for key in ("wall_us", "user_us", "sys_us")}
                    for name, rounds in rows.items()}
            for ranks, rows in results.items()}


def table(summary, cores, count):
    """The markdown table of medians() (ddplite's paths against Open MPI's on the same path)."""
    lines = [f"all_reduce of {count * 4} B (float32 sum), one host, {cores} cores; median of the rounds. "
             "time: us per op, the slowest rank; CPU: us per op and rank (user + system, every thread of a "
             "rank's process; the launcher's own, torchrun's agent or mpirun, is not counted); "
             "floor = ranks x CPU / cores.", "",
             "| ranks | configuration | time | CPU per rank | user | system | floor | time vs Open MPI (same path) |",
             "|---:|---|---:|---:|---:|---:|---:|---:|"]
    for ranks, rows in summary.items():
        for name, row in rows.items():
            cpu = row["user_us"] + row["sys_us"]
            anchor = {"ddplite-tcp": "openmpi-tcp", "ddplite-shm": "openmpi-vader"}.get(name)
            versus = ""
            if anchor in rows and ranks > 1:  # one rank: MPI_Allreduce copies nothing (0.0 us)
                versus = f"{rows[anchor]['wall_us'] / row['wall_us']:.2f}x"
            lines.append(f"| {ranks} | {name} | {row['wall_us']:.2f} | {cpu:.2f} | {row['user_us']:.2f} | "
                         f"{row['sys_us']:.2f} | {ranks * cpu / cores:.1f} | {versus} |")
    return "\n".join(lines)


def counts_table(results):
    """perf's counts per op and rank, the median of the rounds, one row per configuration."""
    names = [event.replace("syscalls:sys_enter_", "") for event in PERF_EVENTS]
    lines = ["Per op and rank, machine-wide over each launch (`perf stat -a`; set-up included):", "",
             "| ranks | configuration | " + " | ".join(names) + " |", "|---:|---|" + "---:|" * len(names)]
    for ranks, rows in results.items():
        for name, rounds in rows.items():
            cells = [statistics.median(r["per_op_and_rank"].get(event, 0.0) for r in rounds) for event in names]
            lines.append(f"| {ranks} | {name} | " + " | ".join(f"{c:.2f}" for c in cells) + " |")
    return "\n".join(lines)


def environment():
    """What the figures depend on: versions and the machine's load."""
    import torch

    mpirun = subprocess.run(["mpirun", "--version"], capture_output=True, text=True).stdout.splitlines() \
        if shutil.which("mpirun") else []
    return {"torch": torch.__version__, "mpirun": mpirun[0] if mpirun else None,
            "cores": len(os.sched_getaffinity(0)), "load": os.getloadavg()}


def measure(ranks_list, wanted, available, rounds, count, seconds, timeout):
    """{ranks: {name: [one figure set per round]}}: the configurations in turn, round after round."""
    results = {}
    for ranks in ranks_list:
        results[ranks] = {name: [] for name in wanted}
        for _ in range(rounds):
            for name in wanted:
                outcome = available[name](ranks, count, seconds, timeout)
                results[ranks][name].append(outcome)
                print(f"{ranks} ranks {name:<14} {outcome['wall_us']:8.1f} us/op, CPU "
                      f"{outcome['user_us']:.1f} user + {outcome['sys_us']:.1f} system us/op per rank", flush=True)
    return results


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ranks", default="1,2,4", help="world sizes, comma-separated")
    parser.add_argument("--count", type=int, default=2, help="float32 elements (2: 8 B)")
    parser.add_argument("--seconds", type=float, default=2.0, help="timed seconds per configuration and round")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--configs", default=",".join(CONFIGURATIONS))
    parser.add_argument("--timeout", type=float, default=300, help="seconds before one launch is killed")
    parser.add_argument("--markdown")
    parser.add_argument("--json")
    parser.add_argument("--perf-stat", action="store_true",
                        help="count context switches and syscalls per op and rank (perf stat -a around each launch)")
    parser.add_argument("--worker", metavar="BACKEND", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        return worker(args.worker, args.count, args.seconds)
    cores = len(os.sched_getaffinity(0))
    with tempfile.TemporaryDirectory(prefix="ddplite-cpu-per-op-") as folder:
        if args.perf_stat and not shutil.which("perf"):
            parser.error("--perf-stat needs perf (Debian: linux-perf)")
        perf_file = os.path.join(folder, "perf.csv") if args.perf_stat else None
        available = configurations(build_c_program(folder), folder, perf_file)
        wanted = args.configs.split(",")
        unknown = [name for name in wanted if name not in CONFIGURATIONS]
        if unknown:
            parser.error(f"--configs: unknown {', '.join(unknown)}")
        wanted = [name for name in wanted if name in available]
        results = measure([int(r) for r in args.ranks.split(",")], wanted, available, args.rounds,
                          args.count, args.seconds, args.timeout)
    text = table(medians(results), cores, args.count)
    if args.perf_stat:
        text += "\n\n" + counts_table(results)
    print("\n" + text)
    write_outputs(args, text, {"environment": environment(), "count": args.count, "results": results})


def write_outputs(args, text, figures):
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write(text + "\n")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(figures, f, indent=1)


if __name__ == "__main__":
    sys.exit(main())
