"""Rank bodies for tests/test_stragglers.py: a DDP job in which one rank is slower per step."""

import time

import torch
import torch.distributed as dist

# Each step's sleep (the slow rank's times the slowdown) in the jobs below and in the tests' other
# straggler jobs. At 20 ms a rank 1.3x slower scored 0.92-0.93 in 3 of 28 runs on the 2-core
# machine, above the tests' bound of 0.92: the score is the least time outside collectives over
# the rank's own, and the three others compute at once after their common sleep while the slow
# rank still sleeps (besides their sleeps they spent 8.7 ms per step outside, the slow rank 4.8,
# in one failed run). At 50 ms the sleeps dominate: 0.86.
STEP_S = 0.05


def ddp_with_a_slow_rank(rank, world_size, slow, steps, step_s, slowdown):
    """A DDP step: `step_s` of work outside the collectives (a sleep, so that the 2-core machine's
    load does not decide who is slow), forward, backward (DDP's all_reduce), optimiser step. Rank
    `slow` sleeps `slowdown` times as long. Returns the table after 5, 10 and `steps` steps (each
    call is itself a collective; it counts in the next table) and the rows as plain tuples."""
    import torch_ddp_lite

    tables = {}

    def after(step):
        if step in (5, 10, steps):
            table = torch_ddp_lite.stragglers()
            tables[step] = {"rows": [tuple(row) for row in table], "text": str(table)}

    _train(rank, slow, steps, step_s, slowdown, after)
    return tables


def stragglers_refused(rank, world_size):
    """What stragglers() says to bad calls: (kind, message) per call."""
    import torch_ddp_lite

    outcomes = {}
    for name, call in {
        "window_1": lambda: torch_ddp_lite.stragglers(window=1),
        "window_str": lambda: torch_ddp_lite.stragglers(window="10"),
    }.items():
        try:
            call()
            outcomes[name] = ("returned", "")
        except Exception as error:  # noqa: BLE001 - the test checks the kind
            outcomes[name] = (type(error).__name__, str(error))
    dist.barrier()
    first = torch_ddp_lite.stragglers()
    return outcomes, [tuple(row) for row in first]


def gloo_group_refused(rank, world_size):
    import torch_ddp_lite

    try:
        torch_ddp_lite.stragglers()
    except ValueError as error:
        return str(error)
    return "returned"


def ddp_under_the_report(rank, world_size, slow, steps, step_s, slowdown):
    """DDPLITE_STRAGGLER_REPORT set: the DDP job of ddp_with_a_slow_rank, no stragglers() call;
    returns what the report thread wrote to stderr on this rank (global rank 0 reports)."""
    import io
    import sys

    captured = io.StringIO()  # the report thread prints to sys.stderr
    sys.stderr = captured
    try:
        _train(rank, slow, steps, step_s, slowdown)
        dist.barrier()
        time.sleep(1.5)  # one more report after the last step, before anyone leaves
    finally:
        sys.stderr = sys.__stderr__  # before the barrier: no rank has left while it was captured
    dist.barrier()
    return captured.getvalue()


def _train(rank, slow, steps, step_s, slowdown, after_step=lambda step: None):
    from torch.nn.parallel import DistributedDataParallel

    # One intra-op thread: four ranks of two threads each on a 2-core machine spend more time in
    # OpenMP's spin-waits than in the step, and that noise, not the sleep, would decide who is slow.
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = DistributedDataParallel(torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(),
                                                        torch.nn.Linear(64, 8)))
    optimiser = torch.optim.SGD(model.parameters(), lr=0.01)
    data = torch.randn(16, 32)
    for step in range(1, steps + 1):
        time.sleep(step_s * (slowdown if rank == slow else 1.0))
        optimiser.zero_grad()
        model(data).sum().backward()
        optimiser.step()
        after_step(step)
