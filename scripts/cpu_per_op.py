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

Configurations (each run by its own launcher, in turn, --rounds times; medians printed):
  ddplite-tcp    DDPLITE_CPU_TRANSPORT=tcp (the path between hosts), torchrun
  ddplite-shm    the default on one host (shared memory), torchrun
  gloo           torchrun
  openmpi-tcp    mpirun --mca btl tcp,self (Open MPI's path between hosts), the C program
  openmpi-vader  mpirun --mca btl vader,self (Open MPI's shared memory), the C program
Open MPI runs as scripts/crosshost_bench.py sets it up for shared cores: --bind-to none,
mpi_yield_when_idle 1. Per configuration: a warm-up, then as many all_reduce calls as fill
--seconds (the ranks agree on the count), timed on every rank; the time is the slowest rank's,
the CPU the mean of the ranks'. "floor" = ranks x CPU / cores: the time the op cannot beat when
the ranks share the cores and each one needs that CPU.
"""

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

C_PROGRAM = r"""
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/resource.h>

static double cpu_us(int who_field) {
  struct rusage usage;
  getrusage(RUSAGE_SELF, &usage);
  struct timeval t = who_field == 0 ? usage.ru_utime : usage.ru_stime;
  return t.tv_sec * 1e6 + t.tv_usec;
}

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank, size;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  int count = atoi(argv[1]);
  double seconds = atof(argv[2]);
  float* data = calloc(count > 0 ? count : 1, sizeof(float));
  for (int i = 0; i < 500; i++) MPI_Allreduce(MPI_IN_PLACE, data, count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
  double start = MPI_Wtime();
  for (int i = 0; i < 200; i++) MPI_Allreduce(MPI_IN_PLACE, data, count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
  double iterations = seconds / ((MPI_Wtime() - start) / 200);
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


def worker(count, seconds):
    """One rank under torchrun: the same loop as the C program, through torch.distributed."""
    import time

    import torch
    import torch.distributed as dist

    if os.environ.get("CPU_PER_OP_BACKEND") == "ddplite":
        sys.path.insert(0, REPO)
        import torch_ddp_lite  # noqa: F401  (registers the backend where autoload is off)
    dist.init_process_group(os.environ["CPU_PER_OP_BACKEND"])
    data = torch.zeros(count)
    for _ in range(500):
        dist.all_reduce(data)
    start = time.perf_counter()
    for _ in range(200):
        dist.all_reduce(data)
    iterations = torch.tensor([seconds / ((time.perf_counter() - start) / 200)], dtype=torch.float64)
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


def parse_results(output, ranks, name):
    # the ranks share one pipe: a line may hold another rank's report too
    found = [json.loads(text) for text in re.findall(r"RESULT (\{[^{}]*\})", output)]
    if len(found) != ranks:
        raise RuntimeError(f"{name}: {len(found)} of {ranks} ranks reported\n{output[-3000:]}")
    return {"wall_us": max(r["wall_us"] for r in found),
            "user_us": statistics.mean(r["user_us"] for r in found),
            "sys_us": statistics.mean(r["sys_us"] for r in found)}


def run_torch(backend, ranks, count, seconds, extra_env, timeout):
    env = dict(os.environ, CPU_PER_OP_BACKEND=backend, OMP_NUM_THREADS="1", **extra_env)
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(ranks),
               os.path.abspath(__file__), "--worker", "--count", str(count), "--seconds", str(seconds)]
    proc = subprocess.run(command, env=env, capture_output=True, text=True, timeout=timeout)
    return parse_results(proc.stdout + proc.stderr, ranks, backend)


def run_mpi(program, btl, ranks, count, seconds, timeout):
    command = ["mpirun", "--allow-run-as-root", "--oversubscribe", "-np", str(ranks), "--bind-to", "none",
               "--mca", "btl", btl, "--mca", "mpi_yield_when_idle", "1", program, str(count), str(seconds)]
    proc = subprocess.run(command, capture_output=True, text=True, timeout=timeout)
    return parse_results(proc.stdout + proc.stderr, ranks, f"Open MPI ({btl})")


def configurations(program):
    """name -> callable(ranks, count, seconds, timeout) -> {wall_us, user_us, sys_us}."""
    found = {
        "ddplite-tcp": lambda *a: run_torch("ddplite", *a[:3], {"DDPLITE_CPU_TRANSPORT": "tcp"}, a[3]),
        "ddplite-shm": lambda *a: run_torch("ddplite", *a[:3], {}, a[3]),
        "gloo": lambda *a: run_torch("gloo", *a[:3], {}, a[3]),
    }
    if program:
        found["openmpi-tcp"] = lambda *a: run_mpi(program, "tcp,self", *a)
        found["openmpi-vader"] = lambda *a: run_mpi(program, "vader,self", *a)
    return found


def build_c_program(folder):
    if not (shutil.which("mpicc") and shutil.which("mpirun")):
        print("no mpicc/mpirun (Debian: openmpi-bin libopenmpi-dev): the Open MPI rows are left out", flush=True)
        return None
    source = os.path.join(folder, "allreduce_cpu.c")
    with open(source, "w") as f:
        f.write(C_PROGRAM)
    program = os.path.join(folder, "allreduce_cpu")
    subprocess.run(["mpicc", "-O2", "-o", program, source], check=True)
    return program


def table(results, cores, count):
    lines = [f"all_reduce of {count * 4} B (float32 sum), one host, {cores} cores; median of the rounds. "
             "time: us per op, the slowest rank; CPU: us per op and rank (user + system, the process's "
             "threads); floor = ranks x CPU / cores.", "",
             "| ranks | configuration | time | CPU per rank | user | system | floor | time vs Open MPI (same path) |",
             "|---:|---|---:|---:|---:|---:|---:|---:|"]
    for ranks, rows in results.items():
        for name, rounds in rows.items():
            wall = statistics.median(r["wall_us"] for r in rounds)
            user = statistics.median(r["user_us"] for r in rounds)
            system = statistics.median(r["sys_us"] for r in rounds)
            anchor = {"ddplite-tcp": "openmpi-tcp", "ddplite-shm": "openmpi-vader"}.get(name)
            versus = ""
            if anchor in rows and ranks > 1:  # one rank: MPI_Allreduce copies nothing (0.0 us)
                versus = f"{statistics.median(r['wall_us'] for r in rows[anchor]) / wall:.2f}x"
            lines.append(f"| {ranks} | {name} | {wall:.2f} | {user + system:.2f} | {user:.2f} | {system:.2f} | "
                         f"{ranks * (user + system) / cores:.1f} | {versus} |")
    return "\n".join(lines)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ranks", default="1,2,4", help="world sizes, comma-separated")
    parser.add_argument("--count", type=int, default=2, help="float32 elements (2: 8 B)")
    parser.add_argument("--seconds", type=float, default=2.0, help="timed seconds per configuration and round")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--configs", default="ddplite-tcp,ddplite-shm,gloo,openmpi-tcp,openmpi-vader")
    parser.add_argument("--timeout", type=float, default=300)
    parser.add_argument("--markdown")
    parser.add_argument("--json")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        return worker(args.count, args.seconds)
    cores = len(os.sched_getaffinity(0))
    with tempfile.TemporaryDirectory(prefix="ddplite-cpu-per-op-") as folder:
        available = configurations(build_c_program(folder))
        wanted = [name for name in args.configs.split(",") if name in available]
        results = {}
        for ranks in (int(r) for r in args.ranks.split(",")):
            results[ranks] = {name: [] for name in wanted}
            for _ in range(args.rounds):
                for name in wanted:
                    outcome = available[name](ranks, args.count, args.seconds, args.timeout)
                    results[ranks][name].append(outcome)
                    print(f"{ranks} ranks {name:<14} {outcome['wall_us']:8.1f} us/op, CPU "
                          f"{outcome['user_us']:.1f} user + {outcome['sys_us']:.1f} system us/op per rank", flush=True)
    text = table(results, cores, args.count)
    print("\n" + text)
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write(text + "\n")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"cores": cores, "count": args.count, "results": results}, f, indent=1)


if __name__ == "__main__":
    sys.exit(main())
