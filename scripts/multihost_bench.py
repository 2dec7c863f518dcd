#!/usr/bin/env python3
"""The benchmark across "hosts" on one machine: Linux network namespaces joined by veth pairs to
a bridge (the same set-up as tests/test_multihost.py), one `python -m torch_ddp_lite.bench`
process per rank, started inside its host's namespace with torchrun's variables.

    sudo python3 scripts/multihost_bench.py --layout 2,2 -- --backends ddplite,ddplite-tcp,gloo \\
        --ops all_reduce -b 8 -e 16M -f 8 --json docs/data/hierarchical_2x2.json

`--layout 2,2` puts ranks 0-1 on host 0 and ranks 2-3 on host 1. Everything after `--` goes to
the benchmark (rank 0 prints the tables and writes the JSON). Needs root and `ip netns`. The
namespaces share this machine's memory and CPUs: the "network" between hosts is a veth pair, so
the figures show what the hierarchy saves in copies and steps, not a real network's latency.
"""

import argparse
import os
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "tests"))

import test_multihost  # noqa: E402  (Hosts: the namespaces, deleted with everything inside on exit)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--layout", default="2,2", help="ranks per host, comma-separated (default 2,2)")
    parser.add_argument("--timeout", type=float, default=1800, help="seconds before every rank is killed")
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
                command = network.run(host, [sys.executable, "-m", "torch_ddp_lite.bench", *bench_args])
                jobs.append(subprocess.Popen(command, env=env, cwd=REPO,
                                             stdout=None if rank == 0 else subprocess.DEVNULL))
                rank += 1
        codes = [job.wait(timeout=options.timeout) for job in jobs]
    finally:
        network.destroy()
    sys.exit(max(abs(code) for code in codes))


if __name__ == "__main__":
    main()
