"""Every collective x dtype x reduce op x world size 1-4 x element count, against the closed
form and against gloo on identical inputs (see workers.py for the inputs and the oracle)."""

import pytest

import workers
from harness import run_ranks

WORLD_SIZES = [1, 2, 3, 4]
SWEEPS = {
    "allreduce": workers.sweep_allreduce,
    "reduce": workers.sweep_reduce,
    "broadcast": workers.sweep_broadcast,
    "allgather": workers.sweep_allgather,
}


def assert_clean(results, minimum_checks):
    for rank, result in enumerate(results):
        assert result["failures"] == [], "\n".join(result["failures"][:20])
        assert result["checked"] >= minimum_checks, f"rank {rank} checked only {result['checked']} cases"


@pytest.mark.parametrize("world_size", WORLD_SIZES)
@pytest.mark.parametrize("collective", sorted(SWEEPS))
def test_sweep_small_counts(collective, world_size):
    results = run_ranks(SWEEPS[collective], world_size, workers.QUICK_COUNTS)
    assert_clean(results, minimum_checks=len(workers.DTYPES) * len(workers.QUICK_COUNTS))


@pytest.mark.slow
@pytest.mark.parametrize("world_size", WORLD_SIZES)
@pytest.mark.parametrize("collective", sorted(SWEEPS))
def test_sweep_large_count(collective, world_size):
    results = run_ranks(SWEEPS[collective], world_size, [workers.LARGE_COUNT], timeout_s=900)
    assert_clean(results, minimum_checks=len(workers.DTYPES))


@pytest.mark.parametrize("world_size", WORLD_SIZES)
def test_layouts_async_futures_objects(world_size):
    results = run_ranks(workers.layouts_and_async, world_size)
    assert_clean(results, minimum_checks=10)


@pytest.mark.parametrize("segment_bytes", ["64", "4096"])
def test_ring_with_many_rounds(segment_bytes):
    """Tiny ring segments force many rounds and uneven segments at 3 ranks."""
    results = run_ranks(workers.sweep_allreduce, 3, [1, 7, 1000, 4099], [workers.torch.float32, workers.torch.int64],
                        env={"DDPLITE_RING_SEGMENT_BYTES": segment_bytes, "DDPLITE_TREE_CHUNK_BYTES": segment_bytes})
    assert_clean(results, minimum_checks=8)


def test_sequence_numbers_and_options():
    results = run_ranks(workers.sequence_numbers, 2, pg_timeout_s=77)
    for result in results:
        assert result["after"] - result["before"] == 3
        assert result["timeout_s"] == pytest.approx(77)
        assert result["timeout_after_set_s"] == pytest.approx(5)
        assert result["name"] == result["backend_name"] == result["options_name"] == "ddplite"
