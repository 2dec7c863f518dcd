"""send/recv with tags and any-source, batch_isend_irecv, p2p errors, and subgroups."""

import pytest

import groups_p2p
from harness import run_ranks


@pytest.mark.parametrize("world_size", [2, 3, 4])
def test_send_recv_tags_any_source_and_batches(world_size):
    for failures in run_ranks(groups_p2p.tags_any_source_and_batches, world_size, timeout_s=120):
        assert failures == []


def test_p2p_errors_name_peer_and_tag():
    results = run_ranks(groups_p2p.p2p_errors, 2, pg_timeout_s=3)
    for rank, result in enumerate(results):
        assert result["send to self"]["raised"] == "ValueError"
        assert f"ddplite rank {rank}/2, send #" in result["send to self"]["message"]
        assert f"send to rank {rank}: that is this rank" in result["send to self"]["message"]
        assert result["batch with self"]["raised"] == "ValueError"
        assert "inside batch_isend_irecv" in result["batch with self"]["message"]
        assert result["recv from out of range"]["raised"] == "ValueError"
        assert "Hint:" in result["recv from out of range"]["message"]
        assert result["after"] == [2.0, 2.0]
    mismatch, missing = results[1]["size mismatch"], results[1]["no sender"]
    assert mismatch["is_dist_error"] and "24 bytes but the receiving tensor has 12" in mismatch["message"]
    assert "rank 0" in mismatch["message"] and "tag 4" in mismatch["message"]
    assert missing["is_dist_error"] and "Timed out waiting for a message from rank 0" in missing["message"]
    assert "tag 77" in missing["message"] and "Hint:" in missing["message"]
    assert 2.5 <= missing["elapsed"] <= 15


@pytest.mark.parametrize("world_size", [3, 4])
def test_overlapping_subgroups_and_new_subgroups(world_size):
    for failures in run_ranks(groups_p2p.overlapping_groups, world_size, timeout_s=120):
        assert failures == []
