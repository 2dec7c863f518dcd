"""Set-up store traffic per rank: `init_process_group` of N ranks on this host through a
store that counts every request and the bytes of its keys and values, sent and answered
(tests/scale_workers.py's CountingStore around a FileStore; torch's own requests included), with
connections on demand. Prints, per world size and backend, the requests and bytes of rank 0 and of
the busiest other rank.

    python scripts/store_traffic.py [--ranks 3,9,17,33] [--backends ddplite,gloo] [--json out.json]
"""

import argparse
import json
import multiprocessing
import os
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests"))


def rank_main(backend, rank, world_size, store_path, results):
    import datetime

    import torch
    import torch.distributed as dist

    import scale_workers
    import torch_ddp_lite  # noqa: F401  registers ddplite

    store = scale_workers.CountingStore(dist.FileStore(store_path, world_size))
    dist.init_process_group(backend, store=store, rank=rank, world_size=world_size,
                            timeout=datetime.timedelta(seconds=120))
    counted = (store.calls, store.bytes)
    total = torch.ones(2)
    dist.all_reduce(total)
    dist.destroy_process_group()
    results.put((rank, counted, total.tolist() == [float(world_size)] * 2))


def measure(backend, world_size):
    context = multiprocessing.get_context("spawn")
    results = context.Queue()
    with tempfile.TemporaryDirectory(prefix="ddplite-store-traffic-") as folder:
        processes = [context.Process(target=rank_main, args=(backend, rank, world_size, os.path.join(folder, "store"),
                                                              results)) for rank in range(world_size)]
        for process in processes:
            process.start()
        rows = sorted(results.get(timeout=600) for _ in processes)
        for process in processes:
            process.join(timeout=60)
    assert all(ok for _, _, ok in rows), rows
    others = [counted for rank, counted, _ in rows if rank != 0]
    return {"backend": backend, "ranks": world_size, "rank0_calls": rows[0][1][0], "rank0_bytes": rows[0][1][1],
            "other_max_calls": max(calls for calls, _ in others), "other_max_bytes": max(size for _, size in others)}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", default="3,9,17,33")
    parser.add_argument("--backends", default="ddplite,gloo")
    parser.add_argument("--json")
    options = parser.parse_args()
    os.environ.setdefault("DDPLITE_CONNECT", "on_demand")
    rows = []
    print("| ranks | backend | rank 0: requests | rank 0: bytes | other ranks, most: requests | other ranks, most: bytes |")
    print("|---:|---|---:|---:|---:|---:|")
    for world_size in (int(n) for n in options.ranks.split(",")):
        for backend in options.backends.split(","):
            row = measure(backend, world_size)
            rows.append(row)
            print(f"| {world_size} | {backend} | {row['rank0_calls']:,} | {row['rank0_bytes']:,} | "
                  f"{row['other_max_calls']:,} | {row['other_max_bytes']:,} |", flush=True)
    if options.json:
        with open(options.json, "w") as out:
            json.dump({"connect": os.environ["DDPLITE_CONNECT"], "rows": rows}, out, indent=1)


if __name__ == "__main__":
    main()
