#!/usr/bin/env python3
"""all_reduce across "hosts" (network namespaces on this machine) against its anchors, in one run:
the link (iperf3), ddplite and gloo (interleaved, `python -m torch_ddp_lite.bench`) and Open MPI's
MPI_Allreduce timed the same way by a small C program, all under one mpirun set-up.

    sudo python3 scripts/crosshost_bench.py                        # 2x1 and 4x2, 8 B to 64 MB
    sudo python3 scripts/crosshost_bench.py --layouts 2x1 --sizes 8,64K,1M --markdown /tmp/x.md
    sudo python3 scripts/crosshost_bench.py --layouts 2x2,4x2 --backends ddplite,ddplite-leaders,gloo
    sudo python3 scripts/crosshost_bench.py --backends ddplite,ddplite-mpi   # + Open MPI called through torch

A layout HxL is H namespace hosts of L ranks each (the bridge and veth pairs of
tests/test_multihost.py: host i has eth0 = 10.231.0.(i+1)). For each layout, in this order:
  1. Open MPI: `mpirun` across the namespaces runs the C program (MPI_Allreduce, coll/tuned,
     float32 sum in place), timed as the bench times: per size, iterations in rounds that start
     on a barrier, each iteration's time the slowest rank's, the median printed;
  2. the same mpirun set-up runs `python -m torch_ddp_lite.bench --backends
     ddplite,ddplite-handoff,gloo --breakdown` (interleaved in that one run; ddplite-handoff is
     ddplite with every op handed to its worker thread and TCP waits sleeping at once, as before
     2026-11-28; --backends picks other columns, e.g. ddplite-leaders, every all_reduce through the
     hosts' leaders instead of on rails), then its per-stage breakdown of a synchronous all_reduce;
  3. the C program again: Open MPI's column is the faster of the two runs around the bench (the
     bar ddplite is held to; both are kept in the JSON: the machine's load drifts).
mpirun's launch agent enters each host's namespace under a host name of its own (Open MPI names
its shared-memory files after the host name), and Open MPI is set up fairly for 2 shared cores:
`--bind-to none` (each namespace sees the whole machine), `mpi_yield_when_idle 1` (it would busy
poll otherwise), TCP between hosts and shared memory (vader) inside one.
orted starts each host's ranks in a session of its own (`plm_rsh_no_tree_spawn 1` starts orted
with --daemonize, which calls setsid(); host 0's ranks share mpirun's session), and where the
kernel's scheduler autogroups are on (kernel.sched_autogroup_enabled=1, as on the VM of
docs/benchmarks.md, whose ranks sit in the root cpu cgroup) every session is a group that gets a
fair share of the cores against the others: the hosts take turns on the 2 cores as if each had a
slice of its own. multihost_bench.py starts every rank in one session. The header says which
held; `--autogroup on|off` sets them for the run and restores them after it, however it ends
short of SIGKILL (docs/benchmarks.md, "Hosts that share cores").
The link: iperf3 from host 0 to host 1, one stream, then both ways at once (what a 2-rank
all_reduce does), before the first layout.

Prints one markdown table per layout (time = median us of the slowest rank; busbw per nccl-tests;
`vs X` = X's time / ddplite's, above 1: ddplite faster) and writes them to --markdown, the raw
figures to --json. Needs root, `ip netns`, iperf3, mpirun and mpicc (Debian: iperf3 openmpi-bin
libopenmpi-dev); every namespace and process it starts is gone when it returns.
"""

import argparse
import contextlib
import datetime
import json
import os
import platform
import shlex
import shutil
import subprocess
import sys
import tempfile

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "tests"))

import test_multihost  # noqa: E402  (Hosts: the namespaces, deleted with everything inside on exit)
from torch_ddp_lite.bench.sweep import bandwidths, format_size, parse_size_list  # noqa: E402

STORE_PORT = 29620
# ddplite-handoff: every op through the worker thread and TCP waits sleeping at once (ddplite before
# 2026-11-28): what running on the caller and spinning first gain, in the same run
BACKENDS = "ddplite,ddplite-handoff,gloo"
TIME_PER_POINT = 0.3  # seconds per size and backend
IPERF_SECONDS = 5  # per iperf3 run
AUTOGROUP = "/proc/sys/kernel/sched_autogroup_enabled"
STAGES = ("call", "hand-off", "collective", "completion", "return")
C_PROGRAM = r"""
/* MPI_Allreduce (float32 sum, in place) timed like torch_ddp_lite.bench: per size, a warm-up sizes
 * the iteration count (the slowest rank's estimate; MIN..MAX iterations within the time per
 * point); the iterations run in ROUNDS rounds, each starting on a barrier; each iteration's time is
 * the slowest rank's; rank 0 prints "ROW bytes median_us iterations".
 * Usage: allreduce_timing TIME_PER_POINT BYTES... */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>

enum { ROUNDS = 10, MIN_ITERS = 5, MAX_ITERS = 1000 };

static int by_value(const void* a, const void* b) {
  const double x = *(const double*)a, y = *(const double*)b;
  return (x > y) - (x < y);
}

static double timed_allreduce(float* data, int count) {
  const double start = MPI_Wtime();
  MPI_Allreduce(MPI_IN_PLACE, data, count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
  return MPI_Wtime() - start;
}

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  const double budget = atof(argv[1]);
  for (int a = 2; a < argc; ++a) {
    const long bytes = atol(argv[a]);
    const int count = (int)(bytes / 4);
    float* data = malloc((size_t)count * 4 + 64);
    for (int i = 0; i < count; ++i) data[i] = 1.0f / (float)(rank + 1);
    double estimate = timed_allreduce(data, count);
    for (int w = 0; w < 3; ++w) {
      const double t = timed_allreduce(data, count);
      if (t < estimate) estimate = t;
    }
    MPI_Allreduce(MPI_IN_PLACE, &estimate, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    int iters = (int)(budget / estimate);
    iters = iters < MIN_ITERS ? MIN_ITERS : iters > MAX_ITERS ? MAX_ITERS : iters;
    double* times = malloc(sizeof(double) * iters);
    int done = 0;
    for (int r = 0; r < ROUNDS; ++r) {
      const int batch = iters / ROUNDS + (r < iters % ROUNDS);
      MPI_Barrier(MPI_COMM_WORLD);
      for (int i = 0; i < batch; ++i) times[done++] = timed_allreduce(data, count);
    }
    MPI_Allreduce(MPI_IN_PLACE, times, done, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    qsort(times, done, sizeof(double), by_value);
    const double median = done % 2 ? times[done / 2] : (times[done / 2 - 1] + times[done / 2]) / 2;
    if (rank == 0) printf("ROW %ld %.3f %d\n", bytes, median * 1e6, done);
    free(times);
    free(data);
  }
  MPI_Finalize();
  return 0;
}
"""


def write_agent(folder, network):
    """Open MPI's plm_rsh_agent: `agent HOST COMMAND` runs COMMAND in HOST's namespace, under a
    host name of its own (a UTS namespace)."""
    path = os.path.join(folder, "nsexec.sh")
    cases = "".join(f"  {address}) ns={name};;\n" for address, name in zip(network.addresses, network.names))
    with open(path, "w") as out:
        out.write("#!/bin/sh\nhost=$1; shift\ncase \"$host\" in\n" + cases
                  + "  *) echo \"nsexec.sh: no namespace host $host\" >&2; exit 1;;\nesac\n"
                  + "exec ip netns exec \"$ns\" unshare --uts /bin/sh -c \"hostname $ns; $*\"\n")
    os.chmod(path, 0o755)
    return path


def mpirun(network, folder, agent, hosts, per_host, command, timeout):
    """Runs `command` on hosts x per_host ranks across the namespaces; returns (rc, output)."""
    hostfile = os.path.join(folder, f"hostfile_{hosts}x{per_host}")
    with open(hostfile, "w") as out:
        out.writelines(f"{network.addresses[i]} slots={per_host}\n" for i in range(hosts))
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    launch = ["mpirun", "-np", str(hosts * per_host), "--hostfile", hostfile, "--wdir", REPO, "--bind-to", "none",
              "--mca", "orte_tmpdir_base", os.path.join(folder, "ompi"), "--mca", "plm_rsh_agent", agent,
              "--mca", "plm_rsh_no_tree_spawn", "1", "--mca", "btl", "tcp,self,vader",
              "--mca", "btl_tcp_if_include", "eth0", "--mca", "oob_tcp_if_include", "eth0",
              "--mca", "btl_vader_single_copy_mechanism", "none", "--mca", "mpi_yield_when_idle", "1",
              "-x", f"MASTER_ADDR={network.addresses[0]}", "-x", f"MASTER_PORT={STORE_PORT}",
              "-x", "DDPLITE_SOCKET_IFNAME=eth0", "-x", "GLOO_SOCKET_IFNAME=eth0", "-x", "OMP_NUM_THREADS=1",
              *command]
    # mpirun itself runs in host 0, under host 0's name
    wrapped = ["ip", "netns", "exec", network.names[0], "unshare", "--uts", "/bin/sh", "-c",
               f"hostname {network.names[0]}; exec {shlex.join(launch)}"]
    try:
        done = subprocess.run(wrapped, env=env, cwd=REPO, capture_output=True, text=True, timeout=timeout)
        return done.returncode, done.stdout + done.stderr
    except subprocess.TimeoutExpired as expired:
        return 124, f"timed out after {timeout} s\n{expired.stdout or ''}{expired.stderr or ''}"


def iperf(network, seconds, extra):
    """GB/s received from host 0 at host 1 (and back, with --bidir), or None."""
    server = subprocess.Popen(network.run(1, ["iperf3", "-s", "-1", "-B", network.addresses[1], "-p", "5201"]),
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(50):  # until the server listens
            probe = subprocess.run(network.run(1, ["ss", "-ltn", "sport = :5201"]), capture_output=True, text=True)
            if ":5201" in probe.stdout:
                break
            subprocess.run(["sleep", "0.1"])
        done = subprocess.run(network.run(0, ["iperf3", "-c", network.addresses[1], "-p", "5201", "-t", str(seconds),
                                              "-J", *extra]), capture_output=True, text=True, timeout=seconds + 30)
        result = json.loads(done.stdout)["end"]
        forward = result["sum_received"]["bits_per_second"] / 8e9
        backward = result.get("sum_received_bidir_reverse", {}).get("bits_per_second")
        return forward, backward / 8e9 if backward else None
    except (subprocess.TimeoutExpired, ValueError, KeyError):
        return None, None
    finally:
        server.kill()
        server.wait()


def read_autogroup(path=AUTOGROUP):
    """'1' or '0' (the kernel's scheduler autogroups on or off), or None where the kernel has none."""
    try:
        with open(path) as source:
            return source.read().strip()
    except OSError:
        return None


def describe_autogroup(value):
    """The header's words for read_autogroup()'s value. The value is the sysctl's; it only takes
    effect for tasks in the root cpu cgroup (as on the VM of docs/benchmarks.md)."""
    return {"1": "scheduler autogroups on (each host's ranks, in a session of their own, get a fair share of the "
                 "cores against the other hosts')",
            "0": "scheduler autogroups off (every rank competes for the cores alone)",
            None: "no scheduler autogroups in this kernel"}.get(value, f"sched_autogroup_enabled {value}")


@contextlib.contextmanager
def autogroups(setting, path=AUTOGROUP):
    """The scheduler's autogroups as `setting` says ('keep', 'on', 'off') inside the block, and as
    they were after it, however it ends. Yields what held inside."""
    before = read_autogroup(path)
    if setting == "keep":
        yield before
        return
    if before is None:
        raise RuntimeError(f"--autogroup {setting}: this kernel has no {path}")
    wanted = "1" if setting == "on" else "0"
    try:
        with open(path, "w") as out:
            out.write(wanted + "\n")
        yield read_autogroup(path)
    finally:
        if read_autogroup(path) != before:
            with open(path, "w") as out:
                out.write(before + "\n")


def c_rows(output):
    rows = {}
    for line in output.splitlines():
        if line.startswith("ROW "):
            _, nbytes, us, _ = line.split()
            rows[int(nbytes)] = float(us)
    return rows


def run_layout(network, folder, agent, program, layout, options):
    hosts, per_host = (int(x) for x in layout.split("x"))
    budget = str(options.time_per_point)
    sizes = [str(n) for n in parse_size_list(options.sizes)]
    figures = {"layout": layout, "ranks": hosts * per_host, "backends": options.backends.split(","),
               "open_mpi_runs": [], "bench": {}, "breakdown": {}}
    for attempt in ("before", "bench", "after"):
        if attempt == "bench":
            json_path = os.path.join(folder, f"bench_{layout}.json")
            rc, output = mpirun(network, folder, agent, hosts, per_host,
                                [sys.executable, "-m", "torch_ddp_lite.bench", "--backends", options.backends,
                                 "--ops", "all_reduce", "--sizes", options.sizes, "--time-per-point", budget,
                                 "--json", json_path, "--breakdown"], options.timeout)
            if rc != 0 or not os.path.exists(json_path):
                sys.exit(f"crosshost_bench: the bench failed at {layout} (rc {rc}):\n{output[-4000:]}")
            for row in json.load(open(json_path)):
                if row.get("op") != "all_reduce":
                    continue
                if row.get("kind") == "breakdown":
                    figures["breakdown"].setdefault(row["backend"], {})[row["bytes"]] = row
                else:
                    figures["bench"].setdefault(row["backend"], {})[row["bytes"]] = row["time_us"]
        else:
            rc, output = mpirun(network, folder, agent, hosts, per_host, [program, budget, *sizes], options.timeout)
            if rc != 0:
                sys.exit(f"crosshost_bench: Open MPI's run failed at {layout} (rc {rc}):\n{output[-4000:]}")
            figures["open_mpi_runs"].append(c_rows(output))
    return figures


def table(figures):
    ranks = figures["ranks"]
    bench = figures["bench"]
    names = [name for name in figures.get("backends", BACKENDS.split(",")) if name in bench]
    others = [name for name in names if name != "ddplite"]
    ddplite = bench.get("ddplite", {})
    runs = figures["open_mpi_runs"]
    lines = ["| size | " + " | ".join(names) + " | Open MPI (MPI_Allreduce) | ddplite busbw | "
             + " | ".join(f"vs {name.replace('ddplite-', '')}" for name in others) + " | vs Open MPI |",
             "|---:|" + "---:|" * (len(names) + 2 + len(others) + 1)]
    for nbytes in sorted(ddplite):
        d = ddplite[nbytes]
        mpi_values = [run[nbytes] for run in runs if nbytes in run]
        m = min(mpi_values) if mpi_values else None  # the faster of its runs: the bar ddplite is held to
        mpi_cell = f"**{m:.1f} us** ({' / '.join(f'{v:.1f}' for v in mpi_values)})" if m else "-"
        cell = lambda t: f"{t:.1f} us" if t else "-"  # noqa: E731
        ratio = lambda other: f"{other / d:.2f}x" if other else "-"  # noqa: E731
        lines.append(f"| {format_size(nbytes)} | " + " | ".join(cell(bench[name].get(nbytes)) for name in names)
                     + f" | {mpi_cell} | {bandwidths('all_reduce', nbytes, d * 1e-6, ranks)[1]:.3f} GB/s | "
                     + " | ".join(ratio(bench[name].get(nbytes)) for name in others) + f" | {ratio(m)} |")
    return "\n".join(lines)


def breakdown_table(figures):
    rows = figures["breakdown"]
    lines = ["| group | size | total | " + " | ".join(STAGES) + " |", "|---|---:|---:|" + "---:|" * len(STAGES)]
    for backend in sorted(rows):
        for nbytes in sorted(rows[backend]):
            row = rows[backend][nbytes]
            lines.append(f"| {backend} | {format_size(nbytes)} | {row['total_us']:.1f} | "
                         + " | ".join(f"{row[f'{name}_us']:.1f}" for name in STAGES) + " |")
    return "\n".join(lines)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--layouts", default="2x1,4x2", help="hosts x ranks per host, comma-separated")
    parser.add_argument("--sizes", default="8,64K,1M,16M,64M", help="all_reduce sizes (K/M suffixes)")
    parser.add_argument("--backends", default=BACKENDS,
                        help="the bench's columns, ddplite first (torch_ddp_lite.bench --backends; e.g. add "
                             "ddplite-leaders: every all_reduce across hosts through the hosts' leaders)")
    parser.add_argument("--time-per-point", type=float, default=TIME_PER_POINT, help="seconds per size and backend")
    parser.add_argument("--iperf-seconds", type=int, default=IPERF_SECONDS, help="seconds per iperf3 run (0: no link figures)")
    parser.add_argument("--timeout", type=float, default=600, help="seconds before one mpirun run is killed")
    parser.add_argument("--autogroup", choices=("keep", "on", "off"), default="keep",
                        help="the kernel's scheduler autogroups (kernel.sched_autogroup_enabled) during the run, "
                             "restored after it; keep: as they are (see the module's docstring)")
    parser.add_argument("--markdown", help="write the tables to this file")
    parser.add_argument("--json", help="write the raw figures to this file")
    options = parser.parse_args()
    layouts = [layout.strip() for layout in options.layouts.split(",") if layout.strip()]
    if os.geteuid() != 0:
        sys.exit("crosshost_bench: needs root (network namespaces)")
    if test_multihost._UNAVAILABLE is not None:
        sys.exit(f"crosshost_bench: needs network namespaces: {test_multihost._UNAVAILABLE}")
    for tool, package in (("mpirun", "openmpi-bin"), ("mpicc", "libopenmpi-dev"), ("iperf3", "iperf3")):
        if shutil.which(tool) is None:
            sys.exit(f"crosshost_bench: no {tool} (apt-get install -y {package})")
    max_hosts = max(int(layout.split("x")[0]) for layout in layouts)
    if options.autogroup != "keep" and (read_autogroup() is None or not os.access(AUTOGROUP, os.W_OK)):
        # before any namespace is made (autogroups() checks the file again)
        sys.exit(f"crosshost_bench: --autogroup {options.autogroup}: this kernel has no {AUTOGROUP}, or it is "
                 "read-only here (a container?)")
    folder = tempfile.mkdtemp(prefix="ddplite-crosshost-")
    network = test_multihost.Hosts(max(max_hosts, 2), dead_end=False)
    try:
        program = os.path.join(folder, "allreduce_timing")
        source = program + ".c"
        with open(source, "w") as out:
            out.write(C_PROGRAM)
        subprocess.run(["mpicc", "-O2", "-o", program, source], check=True)
        agent = write_agent(folder, network)
        with autogroups(options.autogroup) as autogroup:
            link = {}
            if options.iperf_seconds > 0:
                link["one_stream"], _ = iperf(network, options.iperf_seconds, [])
                link["both_ways"] = iperf(network, options.iperf_seconds, ["--bidir"])
            results = [run_layout(network, folder, agent, program, layout, options) for layout in layouts]
    finally:
        network.destroy()
        shutil.rmtree(folder, ignore_errors=True)
    report = render(options, link, results, autogroup)
    print(report)
    if options.markdown:
        with open(options.markdown, "w") as out:
            out.write(report + "\n")
    if options.json:
        with open(options.json, "w") as out:
            json.dump({"link": link, "autogroup": autogroup, "layouts": results}, out, indent=1)


def render(options, link, results, autogroup):
    import torch

    mpi_version = subprocess.run(["mpirun", "--version"], capture_output=True, text=True).stdout.splitlines()[0]
    load = os.getloadavg()[0]
    command = f"--layouts {options.layouts} --sizes {options.sizes}"
    if options.backends != BACKENDS:
        command += f" --backends {options.backends}"
    if options.time_per_point != TIME_PER_POINT:
        command += f" --time-per-point {options.time_per_point:g}"
    if options.iperf_seconds != IPERF_SECONDS:
        command += f" --iperf-seconds {options.iperf_seconds}"
    if options.autogroup != "keep":
        command += f" --autogroup {options.autogroup}"
    head = [f"Measured {datetime.date.today()} by `sudo python3 scripts/crosshost_bench.py "
            f"{command}` on `{platform.node()}` ({os.cpu_count()} CPUs, load "
            f"{load:.1f} at the end; {describe_autogroup(autogroup)}), torch {torch.__version__}, {mpi_version}. float32 sum; time = median of the "
            f"slowest rank per iteration; {', '.join(options.backends.split(','))} interleaved in one run; Open MPI's "
            "column is the faster of its two runs around that one (both in brackets); `vs X` = X's time / "
            "ddplite's (above 1x: ddplite faster)."]
    one, both = link.get("one_stream"), link.get("both_ways") or (None, None)
    if one:
        head.append(f"The link (iperf3, host 0 to host 1): one stream {one:.2f} GB/s; both ways at once "
                    f"{both[0]:.2f} + {both[1]:.2f} GB/s." if both[0] and both[1] else
                    f"The link (iperf3, host 0 to host 1): one stream {one:.2f} GB/s.")
    parts = ["\n".join(head)]
    for figures in results:
        hosts, per_host = figures["layout"].split("x")
        parts.append(f"**{hosts} hosts x {per_host} rank(s)**\n\n" + table(figures))
        if figures["breakdown"]:
            parts.append(f"Where a synchronous all_reduce's time goes at {figures['layout']} (`--breakdown`: median "
                         "us of the slowest rank per stage; call = Python to the backend, hand-off = to the thread "
                         "that runs it, collective = algorithm and wire, completion = to the Work completed, "
                         "return = back in Python):\n\n" + breakdown_table(figures))
    return "\n\n".join(parts)


if __name__ == "__main__":
    main()
