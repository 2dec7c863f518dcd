"""Soak, the quick slice CI runs (tests/soak_workers.py; the full run is scripts/soak.py): random
collectives on integer data through ddplite (two groups, used alternately) bit-identical to gloo
on the same inputs; RSS, descriptors and threads flat; new_group/destroy rounds without leaks."""

import soak_workers
from harness import run_ranks


def test_random_collectives_match_gloo_and_leak_nothing():
    results = run_ranks(soak_workers.soak, 2, 1500, 5, 20, timeout_s=600)
    for rank, result in enumerate(results):
        assert result["mismatches"] == [], (rank, result["mismatches"][:10])
        samples = result["samples"]
        rss, fds, threads = soak_workers.growth(samples, "after_warm_up", "after_ops")
        assert rss < 0.05 and fds <= 0 and threads <= 0, (rank, samples)
        rss, fds, threads = soak_workers.growth(samples, "before_groups", "after_groups")
        assert rss < 0.05 and fds <= 0 and threads <= 0, (rank, samples)
