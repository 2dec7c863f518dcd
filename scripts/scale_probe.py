"""Per-rank costs as the group grows: start-up, a small all_reduce, threads and
open descriptors per rank, ddplite against gloo, in one run with the backends interleaved.

    python scripts/scale_probe.py --ranks 8,16,32,64 [--backends ddplite,ddplite-tcp,gloo] [--json out.json]

Each cell is the worst rank's: init_process_group over tcp:// plus a first all_reduce of 4 floats
("init + first"), the median of 20 more ("small all_reduce"), the process's threads and open fds
right after them (and "fds 1..": the worst of ranks 1 to N-1, since rank 0 also hosts the
tcp:// store, with one socket per peer), destroy_process_group's own time ("destroy") and the time from its call to the
end of the process ("exit", interpreter shutdown included); and the mean over ranks of the
voluntary context switches per small all_reduce ("switches/op", every thread of the process).
"init + first" starts when the rank itself calls init_process_group, so at 32-64 ranks on 2 cores it
is mostly the wait for the last rank to finish importing torch (the ranks' arrival "spread", 2.5-6 s
at 64 ranks, varies from job to job and backend to backend by chance). Two columns take that out:
"after last" is the time from the last rank's call of init_process_group to the end of the last
rank's first all_reduce (the set-up the backend itself costs once everyone is there), and "setup CPU"
the CPU seconds that init and the first all_reduce took, summed over the ranks (busy waits while the
others import would show here).
All ranks run on this host, one process each (a fresh interpreter per rank: nothing is shared
between them but the machine).
"""

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import threading
import time

RANK_CODE = r"""
import os, sys, time, json, resource
import torch, torch.distributed as dist
backend, url, rank, size = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
if backend.startswith("ddplite"):
    import torch_ddp_lite  # noqa: F401
def cpu_seconds():
    own = resource.getrusage(resource.RUSAGE_SELF)
    return own.ru_utime + own.ru_stime
start_at, start, cpu_at_start = time.time(), time.perf_counter(), cpu_seconds()
dist.init_process_group(backend.split("-")[0], init_method=url, rank=rank, world_size=size)
tensor = torch.ones(4)
dist.all_reduce(tensor)
first = time.perf_counter() - start
setup_cpu = cpu_seconds() - cpu_at_start
first_done_at = start_at + first
times = []
usage = resource.getrusage(resource.RUSAGE_SELF)
for _ in range(20):
    t0 = time.perf_counter()
    dist.all_reduce(tensor)
    times.append(time.perf_counter() - t0)
after = resource.getrusage(resource.RUSAGE_SELF)
switches = (after.ru_nvcsw - usage.ru_nvcsw) / 20  # voluntary context switches per all_reduce, all threads
threads = len(os.listdir("/proc/self/task"))
fds = len(os.listdir("/proc/self/fd"))
dist.barrier()
destroy_at = time.time()
dist.destroy_process_group()
print(json.dumps({"rank": rank, "first_s": first, "start_at": start_at, "first_done_at": first_done_at,
                  "setup_cpu_s": setup_cpu, "small_ms": sorted(times)[len(times) // 2] * 1e3,
                  "switches": switches, "threads": threads, "fds": fds, "destroy_at": destroy_at,
                  "destroy_s": time.time() - destroy_at}), flush=True)
"""


def free_port():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def run_job(backend, size, timeout_s):
    url = f"tcp://127.0.0.1:{free_port()}"
    env = dict(os.environ, OMP_NUM_THREADS="1")
    env.pop("DDPLITE_CPU_TRANSPORT", None)
    if backend == "ddplite-tcp":
        env["DDPLITE_CPU_TRANSPORT"] = "tcp"
    if backend == "ddplite-flat":
        env["DDPLITE_SHM_SYNC"] = "flat"
    if backend.startswith("ddplite-tree"):  # ddplite-tree, or ddplite-tree4: fan-in 4
        env["DDPLITE_SHM_SYNC"] = "tree"
        if backend != "ddplite-tree":
            env["DDPLITE_SHM_TREE_FANIN"] = backend[len("ddplite-tree"):]
    procs = [subprocess.Popen([sys.executable, "-c", RANK_CODE, backend, url, str(rank), str(size)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
             for rank in range(size)]
    rows, errors = [], []
    exited_at = {}

    def stamp_exit(proc):
        proc.wait()
        exited_at[proc.pid] = time.time()

    stampers = [threading.Thread(target=stamp_exit, args=(proc,), daemon=True) for proc in procs]
    for stamper in stampers:
        stamper.start()
    deadline = time.monotonic() + timeout_s
    for proc in procs:
        try:
            out, err = proc.communicate(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            for other in procs:
                other.kill()
            return None, f"timed out after {timeout_s} s"
        lines = [line for line in out.splitlines() if line.startswith("{")]
        if proc.returncode != 0 or not lines:
            errors.append(err.strip().splitlines()[-1] if err.strip() else f"exit {proc.returncode}")
        else:
            rows.append(json.loads(lines[-1]))
            rows[-1]["pid"] = proc.pid
    if errors:
        return None, errors[0]
    for stamper in stampers:
        stamper.join()
    return {
        # from the call of destroy_process_group to the end of the process (interpreter exit included)
        "exit_after_destroy_s": max(exited_at[r["pid"]] - r["destroy_at"] for r in rows),
        "destroy_s": max(r["destroy_s"] for r in rows),
        "first_s": max(r["first_s"] for r in rows),
        # the backend's own set-up: from the last rank's arrival to the last first all_reduce's end
        "start_spread_s": max(r["start_at"] for r in rows) - min(r["start_at"] for r in rows),
        "after_last_start_s": max(r["first_done_at"] for r in rows) - max(r["start_at"] for r in rows),
        "setup_cpu_s": sum(r["setup_cpu_s"] for r in rows),
        "small_ms": max(r["small_ms"] for r in rows),
        "small_ms_median_rank": statistics.median(r["small_ms"] for r in rows),
        "switches_per_op": statistics.mean(r["switches"] for r in rows),
        "threads": max(r["threads"] for r in rows),
        "fds": max(r["fds"] for r in rows),
        # rank 0 hosts the tcp:// store: one more socket per peer than the others, for any backend
        "fds_other_ranks": max((r["fds"] for r in rows if r["rank"] != 0), default=None),
    }, None


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ranks", default="8,16,32,64", help="comma-separated world sizes")
    parser.add_argument("--backends", default="ddplite,ddplite-tcp,gloo",
                        help="ddplite (default path), ddplite-tcp (DDPLITE_CPU_TRANSPORT=tcp), ddplite-flat "
                             "(DDPLITE_SHM_SYNC=flat), ddplite-tree[K] (DDPLITE_SHM_SYNC=tree, fan-in K), gloo")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds per job")
    parser.add_argument("--json", help="write the rows here")
    args = parser.parse_args()
    sizes = [int(s) for s in args.ranks.split(",")]
    backends = args.backends.split(",")
    results = []
    header = (f"{'ranks':>5} {'backend':<14} {'init+first (s)':>14} {'after last':>10} {'setup CPU':>9} {'small AR (ms)':>13} {'threads':>7} {'fds':>5} {'fds 1..':>7} "
              f"{'destroy (s)':>11} {'exit (s)':>8} {'switches/op':>11}")
    print(header)
    for size in sizes:
        for backend in backends:  # interleaved: every backend at one size before the next size
            row, error = run_job(backend, size, args.timeout)
            results.append({"ranks": size, "backend": backend, **(row or {}), "error": error})
            if row is None:
                print(f"{size:>5} {backend:<14} failed: {error}", flush=True)
            else:
                print(f"{size:>5} {backend:<14} {row['first_s']:>14.2f} {row['after_last_start_s']:>10.2f} "
                      f"{row['setup_cpu_s']:>9.2f} {row['small_ms']:>13.3f} "
                      f"{row['threads']:>7} {row['fds']:>5} {str(row['fds_other_ranks']):>7} {row['destroy_s']:>11.2f} "
                      f"{row['exit_after_destroy_s']:>8.2f} {row['switches_per_op']:>11.1f}", flush=True)
    if args.json:
        with open(args.json, "w") as handle:
            json.dump({"date": time.strftime("%Y-%m-%d"), "cores": os.cpu_count(), "rows": results}, handle, indent=1)


if __name__ == "__main__":
    main()
