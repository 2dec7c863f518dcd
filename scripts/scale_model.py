"""The α-β model of ddplite's all_reduce to thousands of ranks (docs/scale.md).

    python scripts/scale_model.py [--net-alpha-us 10] [--net-gbps 3] [--host-cores 64] \
        [--host-mem-gbps 100] [--shm-line-us 0.1] [--json out.json]

Runs no benchmark. It fits constants on rows already in docs/data (the 2-core VM; FIT_* below, the
commands in docs/scale.md), checks the model
against rows it did not fit on, predicts 1,024 (16 hosts x 64) and 8,192 (128 x 64) ranks, and
counts per-rank threads, descriptors, shared memory and start-up store calls from the code's
structure. The --net-* and --host-* values are assumptions: there is no network or big host here.

Per path (S bytes, P ranks; L per host, H hosts; x = processes per core):
  shared memory:  t = syncs(S) σ + bytes read and written x β_mem (per core; capped by the host)
                  σ = A_shm + w_shm (x - 1) when x > 1 (wake-ups; w_shm spinning up to 2 ranks per CPU
                  in the group, w_shm_sleep past it), else A_shm + lines t_line:
                  lines = L - 2 flat (2 ranks), k ceil(log_k L) through the arrival tree (3 ranks on)
  TCP (selector): butterfly up to 128 KiB at 2 ranks, 16 KiB at 3-7, 8 KiB x P (<= 512 KiB) from 8: log2 p2
                  steps of S (+2 folds);
                  ring above: 2(P-1) steps per round of P x 256 KiB, 2(P-1)/P S sent per rank
                  t = o + steps (α + w_tcp (x - 1)) + bytes sent β + bytes reduced γ
  hierarchical:   o + [reduce to the leader + its broadcast, in each host] + all_reduce of the H leaders
  rails (from DDPLITE_RAILS_BYTES): o + [reduce to every rank's part + gather the parts, in each host]
                  + all_reduce of S/L among H ranks, the L rails at once (every process busy: x = procs/cores)
"""

import argparse
import importlib.util
import json
import math
import os
import sys
import types

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
KIB, MIB = 1 << 10, 1 << 20
SHM_CHUNK = 512 * KIB     # DDPLITE_SHM_CHUNK_BYTES default (csrc/common/env.cpp)
SHM_SMALL = 16 * KIB      # shm allreduce reduces all P buffers up to here (csrc/cpu/shm/allreduce.cpp)
SHM_FLAT_UP_TO = 2        # DDPLITE_SHM_SYNC=auto: flat waits up to here, the arrival tree above (env.cpp)
SHM_TREE_FAN_IN = 8       # DDPLITE_SHM_TREE_FANIN default
SHM_SPIN_RANKS_PER_CPU = 2  # a group's steps spin up to this many ranks per CPU, sleep past it (shm_group.cpp)
RING_SEGMENT = 256 * KIB  # DDPLITE_RING_SEGMENT_BYTES default
RAILS_FROM = 2 * MIB      # DDPLITE_RAILS_BYTES default (env.cpp)
SIZES = (8, 64 * KIB, 16 * MIB)
LAYOUTS = ((16, 64), (128, 64))  # (hosts, ranks per host)
# the rows the constants are fitted on: one host, this build's paths (docs/scale.md names the commands)
FIT_TWO_RANKS = ("scale/fit_2ranks.json",)                        # 2 ranks, 8 B-64 MB
FIT_FEW_RANKS = ("scale/fit_3ranks.json", "scale/fit_4ranks.json")  # 8 B at 3 and 4 ranks (+ checks above)
FIT_SLEEPING = ("shm_auto_3ranks.json", "shm_auto_4ranks.json")    # the same, when those groups slept (11-23)
FIT_SLEEPING_TWO_RANKS = ("shm_auto_2ranks.json", "shm_auto_2ranks_large.json")  # that build at 2 ranks


def bench_module(name):
    """torch_ddp_lite/bench/<name>.py loaded by path (the package's __init__ imports torch)."""
    for package in ("torch_ddp_lite", "torch_ddp_lite.bench"):
        sys.modules.setdefault(package, types.ModuleType(package))
    path = os.path.join(ROOT, "torch_ddp_lite", "bench", f"{name}.py")
    spec = importlib.util.spec_from_file_location(f"torch_ddp_lite.bench.{name}", path)
    sys.modules[spec.name] = module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


format_size = bench_module("sweep").format_size
fit = bench_module("fit")


def rows(*names):
    out = []
    for name in names:
        with open(os.path.join(ROOT, "docs", "data", name)) as handle:
            data = json.load(handle)
        out += data if isinstance(data, list) else data["rows"]  # bench rows, or scale_probe's {"rows": ...}
    return out


def crosshost_rows(name, backend):
    """(hosts, ranks per host, bytes, seconds) of one backend in a crosshost_bench.py json."""
    with open(os.path.join(ROOT, "docs", "data", name)) as handle:
        layouts = json.load(handle)["layouts"]
    return [(*map(int, layout["layout"].split("x")), int(size), us / 1e6) for layout in layouts
            for size, us in sorted(layout["bench"].get(backend, {}).items(), key=lambda kv: int(kv[0]))]


def measured(table, backend, ranks, nbytes=8):
    """Median seconds of the all_reduce rows that match; scale_probe rows (16 B, worst rank) match any size."""
    found = [r["time_us"] / 1e6 for r in table if r.get("op") == "all_reduce" and r["backend"] == backend
             and r["world_size"] == ranks and r["bytes"] == nbytes]
    found += [r["small_ms"] / 1e3 for r in table if "small_ms" in r and r["backend"] == backend and r["ranks"] == ranks]
    return float(np.median(found))


# ---------------------------------------------------------------- what the code does (steps, bytes)

def butterfly_up_to(ranks):
    """The selector's allreduce threshold (selector.cpp butterflyUpTo)."""
    return 128 * KIB if ranks <= 2 else 16 * KIB if ranks < 8 else min(8 * KIB * ranks, 512 * KIB)


def tcp_plan(nbytes, ranks, algorithm=None):
    """(steps, bytes each rank sends, bytes it reduces) of the selector's allreduce (selector.cpp)."""
    if ranks < 2:
        return 0, 0, 0
    if algorithm == "butterfly" or not algorithm and nbytes <= butterfly_up_to(ranks):
        steps = int(math.log2(ranks)) + (2 if ranks & (ranks - 1) else 0)  # + fold, unfold (algorithm.hpp)
        return steps, steps * nbytes, steps * nbytes
    rounds = math.ceil(nbytes / (ranks * RING_SEGMENT))
    return rounds * 2 * (ranks - 1), 2 * (ranks - 1) / ranks * nbytes, (ranks - 1) / ranks * nbytes


def tree_levels(ranks):
    """Levels of the arrival tree (arrival_tree.hpp); 0 when the group waits flat."""
    if ranks <= SHM_FLAT_UP_TO:
        return 0
    levels, count = 0, ranks
    while count > 1:
        count, levels = -(-count // SHM_TREE_FAN_IN), levels + 1
    return levels


def shm_allreduce_traffic(nbytes, ranks):
    """(syncs, bytes the busiest rank reads + writes, all ranks' bytes): allreduce.cpp's header."""
    if nbytes <= SHM_SMALL and tree_levels(ranks) > 0:  # combined on arrival: one rank reads all P
        return 1, (ranks + 3) * nbytes, (ranks + 3) * nbytes + (ranks - 1) * 3 * nbytes
    if nbytes <= SHM_SMALL:
        return 1, (ranks + 2) * nbytes, ranks * (ranks + 2) * nbytes
    per_rank = 5 * nbytes + nbytes / ranks
    return 2 * max(1, math.ceil(nbytes / SHM_CHUNK)), per_rank, ranks * per_rank


def shm_reduce_bcast_traffic(nbytes, ranks):
    """reduce to the leader, then its broadcast (reduce.cpp, broadcast.cpp): leader (L+5)S, others 4S."""
    leader = (ranks + 5) * nbytes
    return 2 * max(1, math.ceil(nbytes / SHM_CHUNK)), leader, leader + (ranks - 1) * 4 * nbytes


def shm_rails_traffic(nbytes, ranks):
    """reduceToParts + gatherParts (allreduce.cpp, allgather.cpp): every rank (5 + 3/L) S, 3 syncs per chunk."""
    per_rank = (5 + 3 / ranks) * nbytes
    return 3 * max(1, math.ceil(nbytes / SHM_CHUNK)), per_rank, ranks * per_rank


# ---------------------------------------------------------------- fitting

def fit_relative(design, seconds):
    """(coefficients, median relative residual): least squares on the relative error, as bench.fit."""
    scaled = np.asarray(design, dtype=np.float64) / np.asarray(seconds, dtype=np.float64)[:, None]
    coefficients = np.linalg.lstsq(scaled, np.ones(len(seconds)), rcond=None)[0]
    return [float(v) for v in coefficients], float(np.median(np.abs(scaled @ coefficients - 1)))


def fit_constants():
    two = rows(*FIT_TWO_RANKS)
    series = lambda backend: zip(*sorted((r["bytes"], r["time_us"] / 1e6) for r in two  # noqa: E731
                                         if r["op"] == "all_reduce" and r["backend"] == backend))
    few = rows(*FIT_FEW_RANKS)
    shm = fit.fit_series("all_reduce", 2, *series("ddplite"))  # busbw = algbw at 2 ranks
    c = {"A_shm_us": shm["A_us"], "beta_mem_ns": 1 / shm["busbw_inf"] / 5.5,  # 2 ranks move 5.5 S each
         "shm_fit_residual": shm["median_residual"]}
    sizes, seconds = series("ddplite-tcp")
    (o, alpha, beta), residual = fit_relative([[1, tcp_plan(s, 2)[0], s] for s in sizes], seconds)
    if alpha < 0:  # a step's latency not separable from o and β at 2 ranks (one butterfly step; ring steps ∝ S)
        (o, beta), residual = fit_relative([[1, s] for s in sizes], seconds)
        alpha = 0.0
    c.update(o_tcp_us=o * 1e6, alpha_tcp_us=alpha * 1e6, beta_tcp_ns=beta * 1e9, tcp_fit_residual=residual)
    # wake-ups: 8 B at 3 and 4 ranks on the 2 cores (x - 1 = 0.5 and 1); these groups spin today, and
    # slept per step in the build of FIT_SLEEPING (a group past SHM_SPIN_RANKS_PER_CPU still does)
    def wake_us(table, a_shm_us):
        wake = [(p / 2 - 1, measured(table, "ddplite", p) - a_shm_us * 1e-6) for p in (3, 4)]
        return fit_relative([[u] for u, _ in wake], [d for _, d in wake])[0][0] * 1e6
    then = rows(*FIT_SLEEPING_TWO_RANKS)  # that build's own A_shm
    then_shm = fit.fit_series("all_reduce", 2, *zip(*sorted((r["bytes"], r["time_us"] / 1e6) for r in then
                                                            if r["op"] == "all_reduce" and r["backend"] == "ddplite")))
    c["w_shm_us"] = wake_us(few, shm["A_us"])
    c["w_shm_sleep_us"] = wake_us(rows(*FIT_SLEEPING), then_shm["A_us"])
    # TCP from the 4-rank point only (2 swaps); at 3 ranks two of the 3 steps are one-way folds
    c["w_tcp_us"] = (measured(few, "ddplite-tcp", 4) - o - 2 * alpha) / 2 * 1e6
    return c


# ---------------------------------------------------------------- the model

def sync_s(c, host, ranks):
    x = host["procs"] / host["cores"]
    if x > 1:  # the group's size picks spinning or sleeping (shm_group.cpp); x, all processes per core, the cost
        spins = ranks <= host.get("spin_ranks_per_cpu", SHM_SPIN_RANKS_PER_CPU) * host["cores"]
        wake = c["w_shm_us"] if spins else c["w_shm_sleep_us"]
        return (c["A_shm_us"] + wake * (x - 1)) * 1e-6
    levels = tree_levels(ranks)
    lines = levels * min(SHM_TREE_FAN_IN, ranks) if levels else max(0, ranks - 2)  # k arrivals share a line
    return (c["A_shm_us"] + lines * host["line_us"]) * 1e-6


def memory_s(c, host, busiest, total):
    per_core = max(busiest, total / min(host["procs"], host["cores"])) * c["beta_mem_ns"] * 1e-9
    return max(per_core, total / (host["mem_gbps"] * 1e9)) if host["mem_gbps"] else per_core


def shm_allreduce_s(c, host, nbytes, ranks):
    syncs, busiest, total = shm_allreduce_traffic(nbytes, ranks)
    return syncs * sync_s(c, host, ranks) + memory_s(c, host, busiest, total)


def tcp_allreduce_s(c, net, nbytes, ranks, x=1.0, algorithm=None):
    """The selector's TCP allreduce among `ranks` (o not included)."""
    steps, sent, reduced = tcp_plan(nbytes, ranks, algorithm)
    step_us = net["alpha_us"] + c["w_tcp_us"] * max(0.0, x - 1)
    return steps * step_us * 1e-6 + (sent * net["beta_ns"] + reduced * net["gamma_ns"]) * max(1.0, x) * 1e-9


def hierarchical_s(c, host, net, nbytes, hosts, per_host):
    """(total, inside the hosts, among the leaders) of allreduce_hierarchical.cpp."""
    syncs, busiest, total = shm_reduce_bcast_traffic(nbytes, per_host)
    inside = syncs * sync_s(c, host, per_host) + memory_s(c, host, busiest, total)
    leaders = tcp_allreduce_s(c, net, nbytes, hosts, host["procs"] / host["cores"])
    return c["o_tcp_us"] * 1e-6 + inside + leaders, inside, leaders


def rails_s(c, host, net, nbytes, hosts, per_host):
    """(total, inside the hosts, the rails) of allreduce_hierarchical.cpp on rails."""
    syncs, busiest, total = shm_rails_traffic(nbytes, per_host)
    inside = syncs * sync_s(c, host, per_host) + memory_s(c, host, busiest, total)
    rails = tcp_allreduce_s(c, net, nbytes / per_host, hosts, host["procs"] / host["cores"])
    return c["o_tcp_us"] * 1e-6 + inside + rails, inside, rails


def flat_across_hosts_s(c, host, net, nbytes, hosts, per_host):
    """Every rank on TCP (DDPLITE_CPU_TRANSPORT=tcp); every step, loopback too, at the network's α."""
    steps, sent, reduced = tcp_plan(nbytes, hosts * per_host)
    if nbytes <= butterfly_up_to(hosts * per_host):  # butterfly: its log2(H) steps across hosts carry every local rank's S
        wire = math.log2(hosts) * per_host * nbytes * net["beta_ns"]
    else:  # ring: one segment crosses each host boundary per step
        wire = sent * net["beta_ns"]
    busiest = 4 * sent + 3 * reduced  # a kernel copy at each end (read + write), then the reduction
    step_us = net["alpha_us"] + c["w_tcp_us"] * max(0.0, host["procs"] / host["cores"] - 1)
    network = (c["o_tcp_us"] + steps * step_us) * 1e-6 + wire * 1e-9
    return network + memory_s(c, host, busiest, per_host * busiest)


# ---------------------------------------------------------------- checks and predictions

def vm(procs, spin_ranks_per_cpu=SHM_SPIN_RANKS_PER_CPU):
    """The 2-core VM; spin_ranks_per_cpu=1 for rows measured before 2026-11-30 (groups spun up to a rank per CPU)."""
    return {"cores": 2, "procs": procs, "mem_gbps": None, "line_us": 0.0, "spin_ranks_per_cpu": spin_ranks_per_cpu}


def fitted_net(c):  # β_tcp includes the reduction (γ)
    return {"alpha_us": c["alpha_tcp_us"], "beta_ns": c["beta_tcp_ns"], "gamma_ns": 0.0}


def checks(c):
    """(case, predicted s, measured s) for rows the fit did not use."""
    few, probe = rows(*FIT_FEW_RANKS), rows("scale/probe_after.json")
    two_by_two, net = rows("hierarchical_2x2.json"), fitted_net(c)
    flat = lambda s, p, x: c["o_tcp_us"] * 1e-6 + tcp_allreduce_s(c, net, s, p, x)  # noqa: E731
    out = [(f"shm, {p} ranks, {format_size(s)}", shm_allreduce_s(c, vm(p), s, p), measured(few, "ddplite", p, s))
           for p in (3, 4) for s in (256 * KIB, 2 * MIB, 16 * MIB)]
    out += [(f"shm, {p} ranks, 16 B (probe)", shm_allreduce_s(c, vm(p), 16, p), measured(probe, "ddplite", p))
            for p in (8, 16, 32, 64)]
    out.append(("shm, 64 ranks, 16 B (probe, 11-26)", shm_allreduce_s(c, vm(64), 16, 64),
                measured(rows("scale/probe_64_no_pidfds.json"), "ddplite", 64)))
    out.append(("shm, 64 ranks, 16 MB", shm_allreduce_s(c, vm(64), 16 * MIB, 64),
                measured(rows("scale/allreduce_16m_64ranks.json"), "ddplite", 64, 16 * MIB)))
    out += [(f"flat TCP, {p} ranks, 16 B (probe)", flat(16, p, p / 2), measured(probe, "ddplite-tcp", p))
            for p in (8, 16, 32, 64)]
    old = rows("allreduce_2ranks_after.json")  # TCP was the default then (2026-11-21, an older build)
    out += [(f"TCP, 2 ranks, {format_size(s)} (11-21 run)", flat(s, 2, 1), measured(old, "ddplite", 2, s))
            for s in SIZES]
    for s in (8, 4 * KIB, 256 * KIB, 2 * MIB, 16 * MIB):
        out.append((f"hierarchical 2x2, {format_size(s)}", hierarchical_s(c, vm(4), net, s, 2, 2)[0],
                    measured(two_by_two, "ddplite", 4, s)))
        out.append((f"flat TCP 2x2, {format_size(s)}", flat(s, 4, 2), measured(two_by_two, "ddplite-tcp", 4, s)))
    # 4 and 8 namespace hosts x 2 ranks (2026-11-26): 8 and 16 processes on the 2 cores
    for name, hosts in (("scale/hosts_4x2.json", 4), ("scale/hosts_8x2.json", 8)):
        if not os.path.exists(os.path.join(ROOT, "docs", "data", name)):
            continue
        timed, p = rows(name), 2 * hosts
        for s in (8, 4 * KIB, 256 * KIB, 2 * MIB, 16 * MIB):
            out.append((f"hierarchical {hosts}x2, {format_size(s)}", hierarchical_s(c, vm(p), net, s, hosts, 2)[0],
                        measured(timed, "ddplite", p, s)))
            out.append((f"flat TCP {hosts}x2, {format_size(s)}", flat(s, p, p / 2), measured(timed, "ddplite-tcp", p, s)))
    # rails against the leaders, 2 and 4 namespace hosts x 2 ranks (2026-11-29, one interleaved run each)
    for name, hosts in (("crosshost/rails_2x2.json", 2), ("crosshost/rails_4x2.json", 4)):
        if not os.path.exists(os.path.join(ROOT, "docs", "data", name)):
            continue
        timed, p = rows(name), 2 * hosts
        for s in (4 * MIB, 16 * MIB, 64 * MIB):
            out.append((f"rails {hosts}x2, {format_size(s)}", rails_s(c, vm(p), net, s, hosts, 2)[0],
                        measured(timed, "ddplite", p, s)))
            out.append((f"hierarchical (leaders) {hosts}x2, {format_size(s)}",
                        hierarchical_s(c, vm(p), net, s, hosts, 2)[0], measured(timed, "ddplite-leaders", p, s)))
    # across namespace hosts under mpirun with 32 KiB sends (crosshost_bench.py, 2026-11-30): 2x1 is flat
    # TCP between the two hosts; 4x2 and 8x2 take the leaders below DDPLITE_RAILS_BYTES, rails from it
    for name in ("crosshost/send_chunk.json", "crosshost/send_chunk_8x2.json"):
        if not os.path.exists(os.path.join(ROOT, "docs", "data", name)):
            continue
        for hosts, per_host, s, real in crosshost_rows(name, "ddplite"):
            p, path = hosts * per_host, "flat TCP" if per_host == 1 else "rails" if s >= RAILS_FROM else "hierarchical"
            model = (flat(s, p, p / 2) if per_host == 1 else rails_s(c, vm(p), net, s, hosts, per_host)[0]
                     if s >= RAILS_FROM else hierarchical_s(c, vm(p), net, s, hosts, per_host)[0])
            out.append((f"{path} {hosts}x{per_host}, {format_size(s)} (mpirun, 32 KiB sends)", model, real))
    # 64 on 2 cores; the run after the selector took butterfly up to 8 KiB x P (2026-11-26)
    if os.path.exists(os.path.join(ROOT, "docs", "data", "scale", "hosts_16x4_allreduce_on_demand.json")):
        sixteen = rows("scale/hosts_16x4_allreduce_on_demand.json")
        for s in (8, 64 * KIB, 4 * MIB):
            out.append((f"hierarchical 16x4, {format_size(s)} (4-rank groups slept then)",
                        hierarchical_s(c, vm(64, spin_ranks_per_cpu=1), net, s, 16, 4)[0],
                        measured(sixteen, "ddplite", 64, s)))
            out.append((f"flat TCP 16x4, {format_size(s)}", flat(s, 64, 32), measured(sixteen, "ddplite-tcp", 64, s)))
    return out


def predictions(c, options):
    assumed = {"alpha_us": options.net_alpha_us, "beta_ns": 1 / options.net_gbps, "gamma_ns": 3 * c["beta_mem_ns"]}
    out = []
    for hosts, per_host in LAYOUTS:
        host = {"cores": options.host_cores, "procs": per_host, "mem_gbps": options.host_mem_gbps,
                "line_us": options.shm_line_us}
        for s in SIZES:
            total, inside, leaders = hierarchical_s(c, host, assumed, s, hosts, per_host)
            out.append({"ranks": hosts * per_host, "hosts": hosts, "bytes": s, "hierarchical_s": total,
                        "inside_hosts_s": inside, "leaders_s": leaders,
                        "leader_bytes_alone_s": shm_reduce_bcast_traffic(s, per_host)[1] * c["beta_mem_ns"] * 1e-9,
                        "leaders_butterfly_s": tcp_allreduce_s(c, assumed, s, hosts, per_host / options.host_cores,
                                                              "butterfly"),
                        "hierarchical_veth_s": hierarchical_s(c, host, fitted_net(c), s, hosts, per_host)[0],
                        "rails_s": rails_s(c, host, assumed, s, hosts, per_host)[0],
                        "flat_tcp_s": flat_across_hosts_s(c, host, assumed, s, hosts, per_host),
                        "one_host_of_64_s": shm_allreduce_s(c, host, s, per_host)})
    return out


# ---------------------------------------------------------------- resources per rank

KNOBS = ("DDPLITE_CPU_TRANSPORT=auto\nDDPLITE_SHM_CHUNK_BYTES=524288\nDDPLITE_RING_SEGMENT_BYTES=262144\n"
         "DDPLITE_TREE_CHUNK_BYTES=262144\nDDPLITE_FINGERPRINT=1\nDDPLITE_AUTH=1\nDDPLITE_CUDA_STAGING=auto\n"
         "DDPLITE_RAILS_BYTES=2097152\n")
IDENTITY = len("h" * 16 + " boot " + "0" * 36 + " netns net:[4026531833] shm 25")  # a 16-character host name


CONNECT_AT_INIT_UP_TO = 16  # DDPLITE_CONNECT=auto: every pair at init up to here, on demand above (env.cpp)


def leader_partners(hosts):
    """The most TCP peers one of `hosts` leaders connects to on demand, with the default algorithms
    among the leaders: the ring's two neighbours, the butterfly's, doubling's and halving's r xor 2^k,
    the dissemination barrier's r + 2^k and r - 2^k, a binary tree's parent and children (root 0).
    Counted by enumeration (hosts a power of two)."""
    if hosts < 2:
        return 0
    most = 0
    for r in range(hosts):
        peers = {(r + 1) % hosts, (r - 1) % hosts}
        k = 1
        while k < hosts:
            peers |= {r ^ k, (r + k) % hosts, (r - k) % hosts}
            k *= 2
        peers |= {c for c in (2 * r + 1, 2 * r + 2) if c < hosts}
        if r > 0:
            peers.add((r - 1) // 2)
        peers.discard(r)
        most = max(most, len(peers))
    return most


def connected_peers(ranks, per_host):
    """Sockets of the busiest rank after the collectives (no all_to_all, gather or scatter: those
    connect the pairs they use, up to P - 1): every peer when the pairs connect at init; on
    demand, a leader's partners among the leaders (none on one host: shared memory, and liveness
    from the process identity in the segment)."""
    across = ranks > per_host
    if ranks <= CONNECT_AT_INIT_UP_TO:
        return (2 if across else 1) * (ranks - 1)
    return leader_partners(ranks // per_host) if across else 0


# bytes of an average set-up request's key, torch's and ddplite's prefixes included
# ("default_pg/0//ddplite/size64/run0/shm/ready/count"), and of one run of the host layout ("127x64,")
KEY = 50
LAYOUT_RUN = 7


def store_set_up(ranks, per_host, across):
    """(requests, bytes) of the set-up of a rank that is neither rank 0 nor a segment's first, and
    the bytes rank 0 reads on top (every rank's host identity: it compiles the layout).

    backend.cpp 6 (run counter; settings: rank 0's get, then a barrier of set, add, get;
    proc/<rank>); tcp.cpp per mesh 3, plus one address get per peer when every pair connects at
    init (on demand: one per peer it connects to, at first use, added by resources()); per
    segment 8 (segment.cpp: identity set, layout get, name get, report set, verdict get; then the
    readiness barrier). Across hosts the group's segment stops after 3 (identity set, layout get,
    one other host's identity for the message), and host_hierarchy.cpp adds 4 (layout get, the
    report barrier). Values are a few bytes but for the settings (rank 0's, read once) and the
    layout (a run per host, read once per segment and by the hierarchy)."""
    mesh = 3 + (ranks - 1 if ranks <= CONNECT_AT_INIT_UP_TO else 0)
    hosts = ranks // per_host
    if not across:
        requests = 6 + mesh + 2 * 8
        return requests, requests * KEY + len(KNOBS) + 2 * LAYOUT_RUN, 2 * ranks * (KEY + IDENTITY)
    requests = 6 + 2 * mesh + 3 + 4 + 2 * 8
    read = requests * KEY + len(KNOBS) + IDENTITY + 2 * hosts * LAYOUT_RUN + 2 * LAYOUT_RUN
    return requests, read, ranks * (KEY + IDENTITY)


def store_set_up_before(ranks, per_host, across):
    """The multiGet bytes every rank read before this change (each settings, identity, readiness and
    report round returned every rank's value): for the table's comparison."""
    group_wide = ranks * (len(KNOBS) + 2 * IDENTITY + 2)
    return group_wide + (per_host * (2 * IDENTITY + 2) if across else 0)


def resources(ranks, per_host):
    across = ranks > per_host
    # the tree's room for any NUMA layout (ArrivalTree::nodeCapacity)
    nodes, count = 0, per_host + (SHM_TREE_FAN_IN - 1) * (per_host - 1)
    while tree_levels(per_host) and count > 1:
        count = -(-count // SHM_TREE_FAN_IN)
        nodes += count
    # shm_group.cpp: wake lines, the tree's 3 lines per node, controls, buffers
    group = 3 * 64 + 3 * 64 * nodes + 256 * per_host + 2 * SHM_CHUNK * per_host
    ring = min(256 * KIB, max(16 * KIB, 16 * MIB // per_host ** 2 // 4096 * 4096))  # channels.cpp ringBytesFor
    channels = 128 * per_host + per_host ** 2 * (128 + ring)  # rank states, ring heads, rings
    sockets = connected_peers(ranks, per_host)
    on_demand = ranks > CONNECT_AT_INIT_UP_TO
    meshes = 2 if across else 1  # the collectives'; across hosts also send/recv's
    # worker, arrival recorder, one pump per kind of link, and on demand one acceptor per mesh
    threads = (4 if across else 3) + (meshes if on_demand else 0)
    # fixed: stdio, the store's socket, the segments' descriptors (5 measured with no socket at 64
    # ranks before on demand); on demand a listener and an eventfd per mesh
    fixed = 5 + (2 * meshes if on_demand else 0)
    calls, read, rank0 = store_set_up(ranks, per_host, across)
    if on_demand:
        calls += sockets  # the address of each peer it connects to, read at the first use
        read += sockets * (KEY + len("[fd00:0:0:0:0:0:a00:1]:65535"))
    segment_first = 4 * (per_host - 1)  # a has() and a get() per peer's attach report, both segments'
    job_bytes = ranks * read + rank0 + ranks // per_host * segment_first * KEY
    return {"ranks": ranks, "per_host": per_host, "threads_ddplite": threads,
            "threads_process": threads + 2, "sockets": sockets, "fds": sockets + fixed,
            "fds_extra_on_store_host": ranks - 1, "shm_per_host_bytes": group + channels, "ring_bytes": ring,
            "store_calls": calls, "store_calls_extra_segment_first": segment_first,
            "store_calls_all_ranks": ranks * calls + ranks // per_host * segment_first,
            "store_bytes": read, "store_bytes_rank0_extra": rank0, "store_bytes_all_ranks": job_bytes,
            "multiget_bytes_all_ranks_before": ranks * store_set_up_before(ranks, per_host, across)}


# ---------------------------------------------------------------- output

UNITS = {"A_shm_us": "us per op: 2-rank shm all_reduce, one sync, spinning (bench.fit intercept)",
         "beta_mem_ns": "ns per byte read or written, per core (2-rank shm slope / 5.5)",
         "w_shm_us": "us per sync per extra process per core, spinning (shm, 8 B, 3-4 ranks on 2 cores)",
         "w_shm_sleep_us": "the same, sleeping: past 2 ranks per CPU (3-4 ranks, the build before the spin)",
         "o_tcp_us": "us per op over TCP: torch's call and the op's set-up (2 ranks; small ops on the caller)",
         "alpha_tcp_us": "us per TCP step, loopback (2 ranks)",
         "beta_tcp_ns": "ns per byte sent over TCP, reduction included (2 ranks)",
         "w_tcp_us": "us per TCP step per extra process per core (TCP, 8 B, 4 ranks on 2 cores)",
         "shm_fit_residual": "median relative residual, 2-rank shm fit (9 sizes, 8 B-64 MB)",
         "tcp_fit_residual": "median relative residual, 2-rank TCP fit of o, α, β (of o, β when α is left out; 9 sizes)"}


def text(seconds):
    return f"{seconds * 1e6:,.{1 if seconds < 1e-5 else 0}f} us" if seconds < 1e-3 else f"{seconds * 1e3:,.2f} ms"


def table(header, lines):
    print("\n| " + " | ".join(header) + " |\n|" + "---|" * len(header))
    for line in lines:
        print("| " + " | ".join(str(cell) for cell in line) + " |")


def report(c, checked, predicted, resource_rows, options):
    table(["constant", "value", "unit, from"], [(k, f"{c[k]:.4g}", unit) for k, unit in UNITS.items()])
    print(f"\n1 / beta_mem = {1 / c['beta_mem_ns']:.1f} GB/s per core; 1 / beta_tcp = {1 / c['beta_tcp_ns']:.2f} GB/s; "
          f"store values: settings {len(KNOBS)} B, host identity {IDENTITY} B, key {KEY} B")
    table(["case (not fitted on)", "predicted", "measured", "predicted / measured"],
          [(what, text(model), text(real), f"{model / real:.2f}") for what, model, real in checked])
    print(f"\nASSUMED: network {options.net_alpha_us} us per step and {options.net_gbps} GB/s per host; hosts of "
          f"{options.host_cores} cores and {options.host_mem_gbps} GB/s of memory; {options.shm_line_us} us per "
          "cache line a sync touches (flat: each rank past 2; tree: k per level). 'veth' takes α_tcp, β_tcp fitted here for the network instead.")
    table(["ranks", "size", "hierarchical", "in hosts", "leader's bytes alone", "leaders' TCP", "leaders, butterfly",
           "rails", "hierarchical, veth", "flat TCP", "one host of 64"],
          [(f"{p['ranks']:,} ({p['hosts']}x64)", format_size(p["bytes"]), text(p["hierarchical_s"]),
            text(p["inside_hosts_s"]), text(p["leader_bytes_alone_s"]), text(p["leaders_s"]),
            text(p["leaders_butterfly_s"]), text(p["rails_s"]),
            text(p["hierarchical_veth_s"]), text(p["flat_tcp_s"]), text(p["one_host_of_64_s"])) for p in predicted])
    table(["ranks", "threads: ddplite / process", "sockets", "fds (+ on the store's host)", "/dev/shm per host",
           "channel ring", "store requests (+ segment's first rank)", "store requests, all ranks",
           "store bytes per rank (+ rank 0)", "store MB, all ranks", "before: multiGet MB, all ranks"],
          [(f"{r['ranks']:,} ({r['per_host']}/host)", f"{r['threads_ddplite']} / {r['threads_process']}",
            f"{r['sockets']:,}", f"{r['fds']:,} (+{r['fds_extra_on_store_host']:,})",
            f"{r['shm_per_host_bytes'] / MIB:.1f} MiB", f"{r['ring_bytes'] // KIB} KiB",
            f"{r['store_calls']:,} (+{r['store_calls_extra_segment_first']})", f"{r['store_calls_all_ranks']:,}",
            f"{r['store_bytes']:,} (+{r['store_bytes_rank0_extra']:,})", f"{r['store_bytes_all_ranks'] / 1e6:,.1f}",
            f"{r['multiget_bytes_all_ranks_before'] / 1e6:,.0f}") for r in resource_rows])


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--net-alpha-us", type=float, default=10.0, help="ASSUMED latency per TCP step (25 GbE)")
    parser.add_argument("--net-gbps", type=float, default=3.0, help="ASSUMED GB/s per host's NIC (25 GbE)")
    parser.add_argument("--host-cores", type=int, default=64, help="ASSUMED cores per host")
    parser.add_argument("--host-mem-gbps", type=float, default=100.0, help="ASSUMED memory bandwidth per host")
    parser.add_argument("--shm-line-us", type=float, default=0.1, help="ASSUMED sync cost per cache line a sync touches, x <= 1")
    parser.add_argument("--json", help="write constants, checks, predictions and resources here")
    options = parser.parse_args()
    c = fit_constants()
    checked, predicted = checks(c), predictions(c, options)
    resource_rows = [resources(64, 64)] + [resources(h * l, l) for h, l in LAYOUTS]
    report(c, checked, predicted, resource_rows, options)
    if options.json:
        with open(options.json, "w") as handle:
            json.dump({"constants": c, "assumed": vars(options), "predictions": predicted, "resources": resource_rows,
                       "checks": [{"case": w, "predicted_s": p, "measured_s": m} for w, p, m in checked]},
                      handle, indent=1)


if __name__ == "__main__":
    main()
