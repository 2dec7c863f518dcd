"""Every collective x algorithm x dtype x reduce op x world size 1-5 x element count, against the
closed form and against gloo on identical inputs (see sweeps.py for the inputs and the oracle)."""

import pytest
import torch

import sweeps
import torch_ddp_lite
import workers
from harness import run_ranks

WORLD_SIZES = [1, 2, 3, 4, 5]


def assert_clean(results, minimum_checks):
    for rank, result in enumerate(results):
        assert result["failures"] == [], "\n".join(result["failures"][:20])
        assert result["checked"] >= minimum_checks, f"rank {rank} checked only {result['checked']} cases"


@pytest.mark.parametrize("world_size", WORLD_SIZES)
@pytest.mark.parametrize("collective", sorted(sweeps.SWEEPS))
def test_sweep_small_counts(collective, world_size):
    results = run_ranks(sweeps.SWEEPS[collective], world_size, sweeps.QUICK_COUNTS, timeout_s=300)
    assert_clean(results, minimum_checks=len(workers.DTYPES) * len(sweeps.QUICK_COUNTS))


# Large counts at 1-4 ranks: segmentation and pipelining at odd and even sizes. 5 ranks (5
# processes on 2 cores, about 5 minutes of CI for these alone) run the small counts above.
# CI runs every collective at 2 ranks; 1, 3 and 4 ranks are `exhaustive` (scripts/test.sh --all).
LARGE_COUNT_WORLD_SIZES = [size for size in WORLD_SIZES if size <= 4]
LARGE_COUNT_IN_CI = 2


@pytest.mark.slow
@pytest.mark.parametrize("world_size", [
    size if size == LARGE_COUNT_IN_CI else pytest.param(size, marks=pytest.mark.exhaustive)
    for size in LARGE_COUNT_WORLD_SIZES
])
@pytest.mark.parametrize("collective", sorted(sweeps.SWEEPS))
def test_sweep_large_count(collective, world_size):
    results = run_ranks(sweeps.SWEEPS[collective], world_size, sweeps.LARGE_COUNTS, timeout_s=900)
    assert_clean(results, minimum_checks=len(workers.DTYPES))


def test_gloo_oracle_is_used():
    """Guards the oracle: gloo answers every case but the ones workers.gloo_refuses lists (and
    really refuses those: float32 PREMUL_SUM and int32 AVG here)."""
    results = run_ranks(sweeps.sweep_allreduce, 2, [3], [torch.float32, torch.int32])
    for result in results:
        assert result["failures"] == []
        assert result["gloo_refused"] == 2
        # float32: 6 cases (5 ops + PREMUL_SUM), int32: 8 (5 ops + 3 bitwise); 5 runs each (4
        # algorithms + auto); every run vs the closed form, and vs gloo where gloo answers
        assert result["checked"] == 5 * (6 + 8) * 2 - 5 * 2


@pytest.mark.parametrize("world_size", [1, 2, 3, 4])
def test_layouts_async_futures_objects(world_size):
    results = run_ranks(workers.layouts_and_async, world_size)
    assert_clean(results, minimum_checks=10)


@pytest.mark.parametrize("segment_bytes", ["64", "4096"])
@pytest.mark.parametrize("collective", ["allreduce", "broadcast", "reduce"])
def test_pipelines_with_many_rounds(collective, segment_bytes):
    """Tiny segments and chunks force many rounds and uneven pieces at 3 ranks."""
    results = run_ranks(sweeps.SWEEPS[collective], 3, [1, 7, 1000, 4099], [torch.float32, torch.int64],
                        env={"DDPLITE_RING_SEGMENT_BYTES": segment_bytes, "DDPLITE_TREE_CHUNK_BYTES": segment_bytes})
    assert_clean(results, minimum_checks=8)


def test_sequence_numbers_and_options():
    results = run_ranks(workers.sequence_numbers, 2, pg_timeout_s=77)
    for result in results:
        assert result["after"] - result["before"] == 3
        assert result["timeout_s"] == pytest.approx(77)
        if torch_ddp_lite.torch_has("split"):  # torch 2.9+: Backend.set_timeout reaches setTimeout
            assert result["timeout_after_set_s"] == pytest.approx(5)
        else:
            assert result["timeout_after_set_s"] is None
        assert result["name"] == result["backend_name"] == result["options_name"] == "ddplite"


@pytest.mark.parametrize("count", [1, 5, 1000])
@pytest.mark.parametrize("world_size", [1, 2, 3, 4])
def test_noncontiguous_every_op(world_size, count):
    """Strided inputs and outputs for every collective and send/recv, against gloo on contiguous
    copies; the gaps of each strided buffer must stay untouched."""
    results = run_ranks(workers.noncontiguous_every_op, world_size, count)
    assert_clean(results, minimum_checks=20)


@pytest.mark.parametrize("algorithm", ["dissemination"])
@pytest.mark.parametrize("world_size", [2, 3, 4])
def test_barrier_synchronises(world_size, algorithm, tmp_path):
    """No rank leaves the barrier before the last one entered: the late rank's marker (written
    just before it enters) exists for everyone afterwards, and everyone waited its delay."""
    delay_s = 1.0
    for late_rank in (0, world_size - 1):
        folder = tmp_path / f"late{late_rank}"
        folder.mkdir()
        results = run_ranks(workers.barrier_synchronises, world_size, str(folder), late_rank, delay_s,
                            env={"DDPLITE_ALGO": f"barrier:{algorithm}"})
        for rank, result in enumerate(results):
            assert result["missing"] == [], f"rank {rank} left the barrier before rank(s) {result['missing']} entered"
            assert result["waited_s"] >= delay_s * 0.9, f"rank {rank} waited only {result['waited_s']:.3f} s"


@pytest.mark.parametrize("algorithm", ["ring", "butterfly", "halving_doubling", "naive"])
@pytest.mark.parametrize("world_size", [2, 3, 4])
def test_half_precision_sums_round_like_float32(world_size, algorithm):
    """fp16/bf16 with inexact sums: 2 ranks equal the float32 sum rounded once, bit for bit; more
    ranks stay within the rounding bound of P-1 additions (workers.half_precision_sums)."""
    results = run_ranks(workers.half_precision_sums, world_size, 4099, algorithm)
    assert_clean(results, minimum_checks=4)
