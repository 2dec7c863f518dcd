"""The dtypes gloo refuses that ddplite serves on CPU: int16 and uint16/32/64 in every collective
(reductions included), float8 e4m3fn/e5m2 in every collective that only moves data. Closed
form at world sizes 1-4 on shared memory and TCP (MPI: tests/test_mpi.py); gloo is checked to
refuse each case, so the closed form is the only oracle there is."""

import pytest
import torch

import sweeps
import workers
from harness import run_ranks

TCP = {"DDPLITE_CPU_TRANSPORT": "tcp"}


def assert_every_sweep_clean(results):
    for rank, by_collective in enumerate(results):
        for collective, result in by_collective.items():
            assert result["failures"] == [], (collective, "\n".join(result["failures"][:20]))
            dtypes = sweeps.extra_dtypes(collective)
            assert result["checked"] >= len(dtypes) * len(sweeps.QUICK_COUNTS), (rank, collective, result)
            if collective != "allreduce_coalesced":  # the one sweep that does not ask gloo
                assert result["gloo_refused"] > 0, (rank, collective, "gloo was not asked: the oracle guard is off")


@pytest.mark.parametrize("world_size", [1, 2, 3, 4])
def test_every_collective_on_wider_integers_and_float8(world_size):
    results = run_ranks(sweeps.sweep_extra_dtypes, world_size, sweeps.QUICK_COUNTS, timeout_s=600)
    assert_every_sweep_clean(results)


def test_every_collective_on_wider_integers_and_float8_over_tcp():
    results = run_ranks(sweeps.sweep_extra_dtypes, 3, [0, 1, 1000], env=TCP, timeout_s=600)
    assert_every_sweep_clean(results)


@pytest.mark.parametrize("env", [{}, TCP], ids=["shared-memory", "tcp"])
@pytest.mark.parametrize("world_size", [2, 3])
def test_uint64_compares_and_wraps_unsigned(world_size, env):
    results = run_ranks(workers.uint64_top_bit, world_size, env=env)
    top, wrap = 1 << 63, 1 << 64
    ranks = range(world_size)
    rows = [[top + r, top - 1 - r, wrap - 1 - r] for r in ranks]
    expected = {
        "MIN": [min(row[i] for row in rows) for i in range(3)],
        "MAX": [max(row[i] for row in rows) for i in range(3)],
        "SUM": [sum(row[i] for row in rows) % wrap for i in range(3)],
        "AVG": [(sum(row[i] for row in rows) % wrap) // world_size for i in range(3)],
    }
    bxor = [0, 0, 0]
    for row in rows:
        bxor = [a ^ b for a, b in zip(bxor, row)]
    expected["BXOR"] = bxor
    for result in results:
        assert result == expected


def test_float8_reductions_are_refused_and_the_group_stays_usable():
    results = run_ranks(workers.float8_reductions_refused, 2)
    for rank, result in enumerate(results):
        for name, outcome in result["refused"].items():
            assert outcome is not None, f"rank {rank}: {name} on float8 was not refused"
            kind, message = outcome
            assert kind == "ValueError", (name, outcome)
            assert f"ddplite rank {rank}/2" in message and "Float8_e4m3fn" in message, message
            assert "can be moved" in message and "not reduced" in message, message
        assert result["broadcast"] == [2.0, 2.0, 2.0]
        assert result["sum"] == [3.0, 3.0]


@pytest.mark.parametrize("dtype", [torch.float8_e4m3fnuz, torch.float8_e8m0fnu])
def test_dtypes_still_refused_name_the_supported_ones(dtype):
    results = run_ranks(workers.refused_dtype, 2, dtype)
    for rank, result in enumerate(results):
        kind, message = result
        assert kind == "ValueError", result
        assert f"ddplite rank {rank}/2" in message and "is not supported" in message, message
        assert "uint16, uint32, uint64" in message and "float8 e4m3fn/e5m2" in message, message
