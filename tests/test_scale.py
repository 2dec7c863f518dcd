"""Per-rank costs that do not grow with the group or with time. Figures (threads, fds,
latency at 8-64 ranks against gloo) are benchmarks: scripts/scale_probe.py, docs/scale.md."""

import pytest

import scale_workers
from harness import run_ranks


@pytest.mark.parametrize("world_size,rounds,env", [
    (4, 30, {}),
    pytest.param(4, 20, {"DDPLITE_CPU_TRANSPORT": "tcp", "DDPLITE_CONNECT": "on_demand"}, id="4-20-tcp-on-demand"),
    pytest.param(16, 100, {}, marks=[pytest.mark.slow, pytest.mark.exhaustive]),
])
def test_threads_and_descriptors_stay_flat_across_new_group_rounds(world_size, rounds, env):
    """Every new_group + destroy leaves the process as it found it: no thread, socket, pidfd or
    segment descriptor of the group outlives it, round after round (on demand: nor its listeners
    and acceptor threads)."""
    results = run_ranks(scale_workers.group_rounds, world_size, rounds, timeout_s=900, env=env)
    for rank, out in enumerate(results):
        before = tuple(out["before"])
        assert [tuple(counts) for counts in out["after"]] == [before] * rounds, (rank, before, out["after"])


def test_running_out_of_descriptors_is_a_clear_error_on_every_rank(tmp_path):
    """Rank 2 of 8 may open only a few more descriptors than it has: it raises at once, naming
    RLIMIT_NOFILE, what it holds and what the group needs, with the way to raise the limit; the
    others fail by the group's 20 s timeout naming rank 2. Nobody hangs."""
    store = str(tmp_path / "store")
    results = run_ranks(scale_workers.descriptors_run_out, 8, store, 2, 6, backend=None, timeout_s=180)
    victim = results[2]
    assert victim["type"] == "DistBackendError", victim
    message = victim["message"]
    assert "rank 2" in message and "out of file descriptors" in message and "RLIMIT_NOFILE" in message, message
    assert "a ddplite group of 8 ranks holds up to about 22 per rank" in message and "ulimit -n" in message, message
    assert victim["seconds"] < 10.0, victim
    # The others: each raises by the timeout (20 s) plus slack. Those that were connecting to rank 2
    # or waiting for its keys name it; a rank waiting for a third rank stuck behind rank 2 names
    # that one.
    others = [outcome for rank, outcome in enumerate(results) if rank != 2]
    for outcome in others:
        assert outcome["type"] == "DistBackendError", outcome
        assert outcome["seconds"] < 60.0, outcome
    assert any("rank 2" in outcome["message"] for outcome in others), others



@pytest.mark.parametrize("transport", ["shm", "tcp"])
def test_set_up_store_traffic_of_a_rank_does_not_grow_with_the_group(transport, tmp_path):
    """A rank other than 0 makes about the same number of store requests at 3 and 9 ranks, of
    about the same bytes (key names grow by a digit), with connections on demand: rank 0 alone reads
    every rank's host identity and publishes the layout; readiness and reports are barriers through
    a counter, not a read of every rank's key."""
    env = {"DDPLITE_CONNECT": "on_demand", "DDPLITE_CPU_TRANSPORT": "tcp" if transport == "tcp" else "auto"}
    small, large = (run_ranks(scale_workers.store_traffic_of_init, size, str(tmp_path / f"store{size}"), backend=None,
                              env=env) for size in (3, 9))
    worst = {size: {kind: max(counted[kind] for counted in results[1:]) for kind in ("calls", "bytes")}
             for size, results in ((3, small), (9, large))}
    # the rank whose add completes a barrier round makes 2-3 requests more: which one does varies
    assert worst[9]["calls"] <= worst[3]["calls"] + 8, worst
    assert worst[9]["bytes"] <= 1.1 * worst[3]["bytes"], worst
    if transport == "shm":  # rank 0 reads O(P): every identity, and the attach reports of its segments
        assert large[0]["bytes"] > small[0]["bytes"], (small[0], large[0])
