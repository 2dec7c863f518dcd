"""What DDPLITE_AUTH costs: the time to build one TCP mesh (connect every pair, swap a number
over each connection) with and without authentication, interleaved in one run.

    python scripts/auth_cost.py [--world-size 4] [--rounds 30]

The ranks are threads of this process (the set-up code releases the GIL), each building its mesh
through a store this script hosts; every round builds one mesh with DDPLITE_AUTH=1 and one with
=0, in alternating order. Prints the median and the 90th percentile of each, in ms.
"""

import argparse
import os
import statistics
import threading
import time
from datetime import timedelta

import torch.distributed as dist

import torch_ddp_lite


def build_mesh(stores, prefix, world_size):
    """Seconds until every rank's mesh is up and every pair has swapped a number. `stores`: a
    client of the store per rank (a client is not shared between threads)."""
    ext = torch_ddp_lite._load_extension()
    results, errors = [None] * world_size, []

    def rank_thread(rank):
        try:
            store = dist.PrefixStore(prefix, stores[rank])
            results[rank] = ext.exchange_ranks_over_new_mesh(store, rank, world_size, timedelta(seconds=30))
        except Exception as error:  # noqa: BLE001
            errors.append(error)

    threads = [threading.Thread(target=rank_thread, args=(rank,)) for rank in range(world_size)]
    start = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    seconds = time.perf_counter() - start
    if errors:
        raise errors[0]
    assert all(result == list(range(world_size)) for result in results), results
    return seconds


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--world-size", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=30)
    options = parser.parse_args()
    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=60))
    clients = [dist.TCPStore("127.0.0.1", store.port, is_master=False, timeout=timedelta(seconds=60))
               for _ in range(options.world_size)]
    times = {"1": [], "0": []}
    for round_index in range(options.rounds):
        for auth in ("1", "0") if round_index % 2 == 0 else ("0", "1"):
            os.environ["DDPLITE_AUTH"] = auth
            times[auth].append(build_mesh(clients, f"round{round_index}-auth{auth}", options.world_size))
    print(f"# mesh set-up, {options.world_size} ranks (threads), {options.rounds} rounds, interleaved")
    for auth, label in (("1", "DDPLITE_AUTH=1"), ("0", "DDPLITE_AUTH=0")):
        samples = sorted(times[auth])
        p90 = samples[int(0.9 * (len(samples) - 1))]
        print(f"{label}: median {statistics.median(samples) * 1e3:.2f} ms, p90 {p90 * 1e3:.2f} ms")
    ratio = statistics.median(times["1"]) / statistics.median(times["0"])
    print(f"authenticated / plain (medians): {ratio:.2f}")


if __name__ == "__main__":
    main()
