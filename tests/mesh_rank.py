"""One rank of a bare TCP mesh (tests/test_auth.py): connects through the test's store, swaps rank
numbers with every peer, prints "MESH <numbers>". argv: store port, rank, size."""

import sys
from datetime import timedelta

import torch.distributed as dist

import torch_ddp_lite


def main():
    port, rank, size = (int(value) for value in sys.argv[1:4])
    store = dist.TCPStore("127.0.0.1", port, is_master=False, timeout=timedelta(seconds=60))
    numbers = torch_ddp_lite._load_extension().exchange_ranks_over_new_mesh(store, rank, size, timedelta(seconds=60))
    print("MESH", *numbers, flush=True)


if __name__ == "__main__":
    main()
