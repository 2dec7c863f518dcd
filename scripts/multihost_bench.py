#!/usr/bin/env python3
"""The benchmark across "hosts" on one machine: Linux network namespaces joined by veth pairs to
a bridge (the same set-up as tests/test_multihost.py), one `python -m torch_ddp_lite.bench`
process per rank, started inside its host's namespace with torchrun's variables.

    sudo python3 scripts/multihost_bench.py --layout 2,2 -- --backends ddplite,ddplite-tcp,gloo \\
        --ops all_reduce -b 8 -e 16M -f 8 --json docs/data/hierarchical_2x2.json

`--layout 2,2` puts ranks 0-1 on host 0 and ranks 2-3 on host 1. Everything after `--` goes to
the benchmark (rank 0 prints the tables and writes the JSON).

    sudo python3 scripts/multihost_bench.py --layout $(python3 -c 'print(",".join(["4"] * 16))') --check

`--check` runs a correctness pass instead of the benchmark: every rank checks all_reduce (1, 1001
and 3,000,001 floats; int64 MAX), broadcast and reduce from the last rank, all_gather,
reduce_scatter, an uneven all_to_all, a barrier that waits for a late rank and a send/recv ring against their closed
forms, and says which CPU path ran them; the script prints one line per rank and fails if any
check did. Needs root and `ip netns`. The
namespaces share this machine's memory and CPUs: the "network" between hosts is a veth pair, so
the figures show what the hierarchy saves in copies and steps, not a real network's latency.
"""

import argparse
import json
import os
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "tests"))

import test_multihost  # noqa: E402  (Hosts: the namespaces, deleted with everything inside on exit)

CHECK_RANK = r"""
import json, time
from datetime import timedelta
import torch, torch.distributed as dist
import torch_ddp_lite
dist.init_process_group("ddplite", timeout=timedelta(seconds=600))  # env://, as torchrun sets it
rank, size = dist.get_rank(), dist.get_world_size()
total = size * (size + 1) / 2
failures, checked = [], 0

def expect(name, got, want):
    global checked
    checked += 1
    if not torch.equal(got, want):
        failures.append(name)

for count in (1, 1001, 3_000_001):
    tensor = torch.full((count,), float(rank + 1))
    dist.all_reduce(tensor)
    expect(f"all_reduce {count}", tensor, torch.full((count,), total))
    root = torch.arange(count, dtype=torch.float32) * (rank + 1)
    dist.broadcast(root, src=size - 1)
    expect(f"broadcast {count}", root, torch.arange(count, dtype=torch.float32) * size)
    reduced = torch.full((count,), float(rank + 1))
    dist.reduce(reduced, dst=size - 1)
    if rank == size - 1:
        expect(f"reduce {count}", reduced, torch.full((count,), total))
highest = torch.tensor([rank], dtype=torch.int64)
dist.all_reduce(highest, op=dist.ReduceOp.MAX)
expect("all_reduce int64 max", highest, torch.tensor([size - 1]))
gathered = torch.empty(3 * size)
dist.all_gather_into_tensor(gathered, torch.full((3,), float(rank + 1)))
expect("all_gather", gathered, torch.arange(1, size + 1, dtype=torch.float32).repeat_interleave(3))
scattered = torch.empty(5)
dist.reduce_scatter_tensor(scattered, torch.full((5 * size,), float(rank + 1)))
expect("reduce_scatter", scattered, torch.full((5,), total))
# uneven all_to_all: rank r sends rank j (r + j) % 3 elements, all of value 1000 r + j
send = [(rank + j) % 3 for j in range(size)]
recv = [(j + rank) % 3 for j in range(size)]
exchanged = torch.empty(sum(recv))
dist.all_to_all_single(exchanged, torch.cat([torch.full((n,), float(1000 * rank + j)) for j, n in enumerate(send)]),
                       recv, send)
expect("all_to_all", exchanged, torch.cat([torch.full((n,), float(1000 * j + rank)) for j, n in enumerate(recv)]))
dist.barrier()  # everyone starts the timed barrier together
started = time.monotonic()
if rank == size - 1:
    time.sleep(1.0)
dist.barrier()
checked += 1
if time.monotonic() - started < 0.5:
    failures.append("barrier did not wait for the late rank")
received = torch.empty(7)
ops = [dist.P2POp(dist.isend, torch.full((7,), float(rank)), (rank + 1) % size),
       dist.P2POp(dist.irecv, received, (rank - 1) % size)]
for work in dist.batch_isend_irecv(ops):
    work.wait()
expect("send/recv ring", received, torch.full((7,), float((rank - 1) % size)))
path = list(torch_ddp_lite.cpu_path())
dist.destroy_process_group()
print("CHECK " + json.dumps({"rank": rank, "path": path, "checked": checked, "failures": failures}), flush=True)
"""


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--layout", default="2,2", help="ranks per host, comma-separated (default 2,2)")
    parser.add_argument("--timeout", type=float, default=1800, help="seconds before every rank is killed")
    parser.add_argument("--check", action="store_true", help="run the correctness pass instead of the benchmark")
    parser.add_argument("bench", nargs=argparse.REMAINDER, help="-- then the benchmark's own arguments")
    options = parser.parse_args()
    per_host = [int(n) for n in options.layout.split(",")]
    bench_args = options.bench[1:] if options.bench[:1] == ["--"] else options.bench
    if test_multihost._UNAVAILABLE is not None:
        sys.exit(f"needs network namespaces: {test_multihost._UNAVAILABLE}")
    network = test_multihost.Hosts(len(per_host))
    try:
        world_size = sum(per_host)
        jobs = []
        rank = 0
        for host, count in enumerate(per_host):
            for local_rank in range(count):
                env = dict(os.environ, RANK=str(rank), WORLD_SIZE=str(world_size), LOCAL_RANK=str(local_rank),
                           LOCAL_WORLD_SIZE=str(count), MASTER_ADDR=network.addresses[0],
                           MASTER_PORT=str(test_multihost.STORE_PORT), DDPLITE_SOCKET_IFNAME="eth0",
                           GLOO_SOCKET_IFNAME="eth0", OMP_NUM_THREADS="1")
                program = ["-c", CHECK_RANK] if options.check else ["-m", "torch_ddp_lite.bench", *bench_args]
                command = network.run(host, [sys.executable, *program])
                output = subprocess.PIPE if options.check else (None if rank == 0 else subprocess.DEVNULL)
                jobs.append(subprocess.Popen(command, env=env, cwd=REPO, stdout=output, text=True))
                rank += 1
        if options.check:
            outputs = [job.communicate(timeout=options.timeout)[0] for job in jobs]
        codes = [job.wait(timeout=options.timeout) for job in jobs]
    finally:
        network.destroy()
    if options.check:
        codes.append(report_checks(per_host, outputs))
    sys.exit(max(abs(code) for code in codes))


def report_checks(per_host, outputs):
    """One line per rank; 1 if any rank failed a check or reported nothing."""
    failed = 0
    hosts = [host for host, count in enumerate(per_host) for _ in range(count)]
    for rank, output in enumerate(outputs):
        lines = [line for line in (output or "").splitlines() if line.startswith("CHECK ")]
        if not lines:
            print(f"rank {rank} (host {hosts[rank]}): no result")
            failed = 1
            continue
        outcome = json.loads(lines[-1][len("CHECK "):])
        failed |= bool(outcome["failures"])
        verdict = "ok" if not outcome["failures"] else "FAILED " + ", ".join(outcome["failures"])
        print(f"rank {rank} (host {hosts[rank]}): {outcome['checked']} checks {verdict}; path {outcome['path'][0]}"
              + (f" ({outcome['path'][1]})" if rank == 0 else ""))
    return failed


if __name__ == "__main__":
    main()
