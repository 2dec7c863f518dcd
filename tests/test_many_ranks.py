"""Correctness with many ranks on one host: at 24 ranks in CI (float32), at 24, 32, 48
and 64 under `bash scripts/test.sh -m exhaustive -k many_ranks` (int32, float64), on shared memory and on TCP, every collective (each algorithm pinned, then the automatic
choice) against the closed form and gloo on the same inputs, counts 0, 1, an odd count and one
past a few chunks; a barrier that waits for a late first or last rank; send/recv between every
pair both ways, and any-source receives. More ranks than cores is the harshest case for the
waits (2 cores here)."""

import pytest
import torch

import scale_workers
from harness import run_ranks

COUNTS = [0, 1, 3, 1001]
P2P_SIZES = [0, 1, 1000]
# Past about 32 ranks the sums of the sweeps' inputs leave the range where bfloat16 and float32
# hold every integer (a partial sum can pass 2^24 on the way), and gloo (rounding at each step, in
# its order) and the closed form (rounding once) part ways: the full set keeps to dtypes whose
# sums stay exact in any order.
QUICK, FULL = [torch.float32], [torch.int32, torch.float64]
# Past 16 ranks the TCP pairs connect on demand (DDPLITE_CONNECT=auto); the 5-rank cases make a
# small group do so too, with and without authentication: the butterfly's exchanges connect pairs
# from both ends at once (one connection refused, the other kept).
CASES = [pytest.param(24, "auto", QUICK, {}, id="24-shm"), pytest.param(24, "tcp", QUICK, {}, id="24-tcp"),
         pytest.param(5, "tcp", QUICK, {"DDPLITE_CONNECT": "on_demand"}, id="5-tcp-on-demand"),
         pytest.param(5, "tcp", QUICK, {"DDPLITE_CONNECT": "on_demand", "DDPLITE_AUTH": "0"},
                      id="5-tcp-on-demand-no-auth")] + [
    pytest.param(size, transport, FULL, {}, id=f"{size}-{'shm' if transport == 'auto' else 'tcp'}-all-dtypes",
                 marks=[pytest.mark.slow, pytest.mark.exhaustive])
    for size in (24, 32, 48, 64) for transport in ("auto", "tcp")]


@pytest.mark.parametrize("world_size,transport,dtypes,env", CASES)
def test_every_collective_and_send_recv_at_many_ranks(world_size, transport, dtypes, env):
    results = run_ranks(scale_workers.many_ranks_round, world_size, COUNTS, dtypes, P2P_SIZES,
                        pg_timeout_s=300, timeout_s=1500, env={"DDPLITE_CPU_TRANSPORT": transport, **env})
    # A barrier: no rank leaves before the last rank entered (on the host's one monotonic clock). The
    # late rank (0, then the last) slept 0.3 s first, so some rank entered before it: the check bites.
    for round_, late in enumerate((0, world_size - 1)):
        entries = [outcome["barriers"][round_][0] for outcome in results]
        assert min(entries) < entries[late], (round_, late, entries)
        for rank, outcome in enumerate(results):
            left = outcome["barriers"][round_][1]
            assert left >= max(entries), (rank, round_, left - max(entries))  # nobody left before the last came
    for rank, outcome in enumerate(results):
        outcome.pop("barriers")
        assert outcome.pop("path") == ("shm" if transport == "auto" else "tcp"), rank
        why = outcome.pop("why")
        if transport == "auto":  # from 3 ranks on a host the steps go through the arrival tree
            levels = 2 if world_size <= 64 else 3
            assert f"steps synchronise through an arrival tree (fan-in 8, {levels} levels)" in why, (rank, why)
        failures, path = outcome.pop("p2p")
        assert failures == [], (rank, path, failures)
        for name, (failures, checked) in outcome.items():
            assert failures == [] and checked > 0, (rank, name, failures, checked)
