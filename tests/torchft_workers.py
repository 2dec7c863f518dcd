"""Rank bodies for tests/test_torchft.py: torch_ddp_lite.torchft.ProcessGroupDdplite driven as
torchft's Manager drives it (configure per quorum, every collective through the wrapper)."""

import os
import signal
import time
from datetime import timedelta

import torch
import torch.distributed as dist
from torch.distributed.distributed_c10d import (AllgatherOptions, AllreduceCoalescedOptions, AllreduceOptions, AllToAllOptions,
                               BarrierOptions, BroadcastOptions, ReduceOp, ReduceScatterOptions)

from torch_ddp_lite.torchft import ProcessGroupDdplite


def _store_address(quorum):
    """torchft's form: the replica's store, prefixed per quorum (the test process hosts the store)."""
    return f"127.0.0.1:{os.environ['TORCHFT_TEST_STORE_PORT']}/torchft/{quorum}/0"


def _done(pg, work):
    assert work.wait() is True
    assert pg.errored() is None, pg.errored()


def _collectives(pg, rank, size):
    """Every collective torchft's groups offer, on values whose results have closed forms."""
    out = {}
    odd = torch.full((1001,), float(rank + 1))
    opts = AllreduceOptions()
    opts.reduceOp = ReduceOp.SUM
    _done(pg, pg.allreduce([odd], opts))
    out["allreduce_sum"] = odd
    biggest = torch.tensor([float(rank), -float(rank)])
    opts = AllreduceOptions()
    opts.reduceOp = ReduceOp.MAX
    _done(pg, pg.allreduce([biggest], opts))
    out["allreduce_max"] = biggest
    pair = [torch.full((3,), float(rank)), torch.full((2,), 2.0 * rank)]
    _done(pg, pg.allreduce_coalesced(pair, AllreduceCoalescedOptions()))
    out["allreduce_coalesced"] = pair
    gathered = [[torch.zeros(3) for _ in range(size)]]
    _done(pg, pg.allgather(gathered, [torch.full((3,), float(rank))], AllgatherOptions()))
    out["allgather"] = gathered[0]
    flat = torch.zeros(3 * size)
    _done(pg, pg.allgather_into_tensor_coalesced([flat], [torch.full((3,), float(rank))], AllgatherOptions()))
    out["allgather_into_tensor_coalesced"] = flat
    root = torch.arange(5.0) * (rank + 1)
    opts = BroadcastOptions()
    opts.rootRank = size - 1
    _done(pg, pg.broadcast([root], opts))
    out["broadcast"] = root
    scattered = torch.zeros(4)
    _done(pg, pg.reduce_scatter([scattered], [[torch.full((4,), float(rank + 1 + i)) for i in range(size)]],
                                ReduceScatterOptions()))
    out["reduce_scatter"] = scattered
    chunk = torch.zeros(2)
    _done(pg, pg.reduce_scatter_tensor_coalesced([chunk], [torch.arange(2.0 * size) + rank], ReduceScatterOptions()))
    out["reduce_scatter_tensor_coalesced"] = chunk
    received = torch.zeros(size)
    sent = torch.tensor([rank * 10.0 + peer for peer in range(size)])
    _done(pg, pg.alltoall_base(received, sent, [], [], AllToAllOptions()))
    out["alltoall_base"] = received
    _done(pg, pg.barrier(BarrierOptions()))
    if size > 1:
        message = torch.arange(6.0) + 100 if rank == 0 else torch.zeros(6)
        if rank == 0:
            _done(pg, pg.send([message], size - 1, 7))
        elif rank == size - 1:
            _done(pg, pg.recv([message], 0, 7))
        out["p2p"] = message
    out["size"] = pg.size()
    return out


def reconfigured_rounds(rank, world_size, victim):
    """Two quorums of every rank (configure twice: a new backend each time), then ``victim`` dies
    inside a third: the others' all_reduce records the error instead of raising; they configure a
    quorum without it and run the collectives again. Returns what each round produced."""
    pg = ProcessGroupDdplite(timeout=timedelta(seconds=30))
    assert pg.getBackendName() == "torchft-ddplite"
    rounds = []
    for quorum in (1, 2):
        pg.configure(_store_address(quorum), f"replica_{rank}", rank, world_size, quorum_id=quorum)
        rounds.append(_collectives(pg, rank, world_size))
    pg.configure(_store_address(3), f"replica_{rank}", rank, world_size, quorum_id=3)
    _done(pg, pg.barrier(BarrierOptions()))
    if rank == victim:
        os.kill(os.getpid(), signal.SIGKILL)
    started = time.monotonic()
    opts = AllreduceOptions()
    opts.reduceOp = ReduceOp.SUM
    work = pg.allreduce([torch.ones(1 << 16)], opts)
    waited = work.wait()
    error = pg.errored()
    failure = {"waited": waited, "noticed": time.monotonic() - started,
               "error": (type(error).__name__, str(error)) if error is not None else None,
               "cause": (type(error.__cause__).__name__, str(error.__cause__)) if error is not None else None}
    # the future path: completes with None, the error kept (the first one, not replaced)
    failure["future_value"] = work.get_future().wait()
    failure["same_error_after_future"] = pg.errored() is error
    pg.abort()  # an abort keeps the collective's error, the cause
    failure["same_error_after_abort"] = pg.errored() is error
    survivors = [r for r in range(world_size) if r != victim]
    pg.configure(_store_address(4), f"replica_{rank}", survivors.index(rank), len(survivors), quorum_id=4)
    failure["errored_after_configure"] = pg.errored()
    # the old quorum's failed work, waited on again, must not mark the new quorum failed
    work.wait()
    work.get_future().wait()
    failure["errored_after_stale_work"] = pg.errored()
    rounds.append(_collectives(pg, survivors.index(rank), len(survivors)))
    pg.abort()  # errored=True: the group reports the abort
    aborted = pg.errored()
    failure["errored_after_abort"] = (type(aborted).__name__, str(aborted)) if aborted is not None else None
    pg.shutdown()
    return {"rounds": rounds, "failure": failure}
