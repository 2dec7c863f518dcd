"""One rank of a 2-rank job for tests/test_auth.py, started by the test with env:// variables.

Prints "RESULT ok <checks>" when every collective and send/recv gave the closed-form value.
"""

import sys
from datetime import timedelta

import torch
import torch.distributed as dist

import torch_ddp_lite  # noqa: F401  (registers the backend)


def main():
    dist.init_process_group("ddplite", timeout=timedelta(seconds=60))
    rank, size = dist.get_rank(), dist.get_world_size()
    checks = 0
    for count in (1, 1000, 300_001):
        values = torch.full((count,), float(rank + 1))
        dist.all_reduce(values)
        assert torch.equal(values, torch.full((count,), float(size * (size + 1) // 2))), values[:4]
        checks += 1
    data = torch.arange(7, dtype=torch.int64) if rank == 0 else torch.zeros(7, dtype=torch.int64)
    dist.broadcast(data, src=0)
    assert torch.equal(data, torch.arange(7, dtype=torch.int64)), data
    checks += 1
    message = torch.full((5,), 40.0 + rank)
    received = torch.zeros(5)
    peer = 1 - rank
    requests = dist.batch_isend_irecv([dist.P2POp(dist.isend, message, peer), dist.P2POp(dist.irecv, received, peer)])
    for request in requests:
        request.wait()
    assert torch.equal(received, torch.full((5,), 40.0 + peer)), received
    checks += 1
    dist.barrier()
    dist.destroy_process_group()
    print(f"RESULT ok {checks}", flush=True)


if __name__ == "__main__":
    sys.exit(main())
