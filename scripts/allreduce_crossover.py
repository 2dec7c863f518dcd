"""Where butterfly stops beating the ring for all_reduce over TCP, as the group grows (the
selector's threshold, csrc/cpu/algorithms/selector.cpp; docs/algorithms.md).

    python scripts/allreduce_crossover.py [--ranks 8,16,32] [--rounds 2] [> out.txt]

For each world size, one job per algorithm (DDPLITE_ALGO=allreduce:<algo>, DDPLITE_CPU_TRANSPORT=tcp,
all ranks on this host), alternating in each round: the worst rank's median of 15 all_reduces of
4 KB to 1 MB (after a barrier each). Prints each job's row, then the best round per cell.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

SIZES = (4 << 10, 16 << 10, 64 << 10, 256 << 10, 1 << 20)


def rank_main(rank, size, store):
    import torch
    import torch.distributed as dist

    import torch_ddp_lite  # noqa: F401  (registers the backend)

    dist.init_process_group("ddplite", init_method=f"file://{store}", rank=rank, world_size=size)
    out = {}
    for nbytes in SIZES:
        tensor = torch.ones(nbytes // 4)
        for _ in range(3):
            dist.all_reduce(tensor)
        times = []
        for _ in range(15):
            dist.barrier()
            start = time.perf_counter()
            dist.all_reduce(tensor)
            times.append(time.perf_counter() - start)
        worst = torch.tensor([sorted(times)[len(times) // 2]])
        dist.all_reduce(worst, op=dist.ReduceOp.MAX)
        out[nbytes] = worst.item() * 1e3
    if rank == 0:
        print(json.dumps(out), flush=True)
    dist.destroy_process_group()


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", default="8,16,32")
    parser.add_argument("--rounds", type=int, default=2)
    options = parser.parse_args()
    results = {}
    with tempfile.TemporaryDirectory(prefix="ddplite-crossover-") as folder:
        for round_ in range(options.rounds):
            for size in (int(r) for r in options.ranks.split(",")):
                for algorithm in ("butterfly", "ring"):
                    store = os.path.join(folder, f"store_{size}_{algorithm}_{round_}")
                    env = dict(os.environ, DDPLITE_ALGO=f"allreduce:{algorithm}", DDPLITE_CPU_TRANSPORT="tcp")
                    ranks = [subprocess.Popen([sys.executable, __file__, "--rank", str(r), str(size), store], env=env,
                                              stdout=subprocess.PIPE, text=True) for r in range(size)]
                    outputs = [rank.communicate(timeout=600)[0] for rank in ranks]
                    row = json.loads(outputs[0].strip().splitlines()[-1])
                    print(f"round {round_}: {size} ranks, {algorithm}: "
                          + ", ".join(f"{int(n) >> 10} KB {ms:.3f} ms" for n, ms in row.items()), flush=True)
                    for nbytes, ms in row.items():
                        results.setdefault((size, int(nbytes)), {}).setdefault(algorithm, []).append(ms)
    print("\n| ranks | size | butterfly (ms) | ring (ms) | ring / butterfly |\n|---:|---:|---:|---:|---:|")
    for (size, nbytes), by in sorted(results.items()):
        butterfly, ring = min(by["butterfly"]), min(by["ring"])
        print(f"| {size} | {nbytes >> 10} KB | {butterfly:.3f} | {ring:.3f} | {ring / butterfly:.2f} |")


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--rank":
        rank_main(int(sys.argv[2]), int(sys.argv[3]), sys.argv[4])
    else:
        main()
