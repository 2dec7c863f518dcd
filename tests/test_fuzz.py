"""Bad-input fuzz, the quick slice CI runs (tests/fuzz_workers.py; the full run is
scripts/fuzz_inputs.py): random invalid calls of every collective on every rank at once must each
raise a Python exception, ddplite's naming the rank, and leave the group usable."""

import pytest

import fuzz_workers
from harness import run_ranks


@pytest.mark.parametrize("world_size,seed", [(2, 1), (3, 2)])
def test_random_invalid_calls_raise_and_keep_the_group_usable(world_size, seed):
    results = run_ranks(fuzz_workers.fuzz_invalid_calls, world_size, 150, seed, timeout_s=300)
    for rank, result in enumerate(results):
        assert result["problems"] == [], (rank, result["problems"][:10])
        assert result["ddplite_messages"] > 0, (rank, result)
