"""examples/train_fault_tolerant.py: 4 ranks, one SIGKILLed mid-epoch; the survivors agree on the
loss (failed_ranks), shrink the group, re-shard and finish. Their final parameters equal, bit for
bit, those of a fresh 3-rank run started from the state they carried on from."""

import os
import re
import sys

import pytest
import torch
import torch.distributed as dist

from test_example import REPO, run_in_own_session

EXAMPLE = os.path.join(REPO, "examples", "train_fault_tolerant.py")

pytestmark = pytest.mark.skipif(not hasattr(dist, "shrink_group"), reason="torch without shrink_group")


def test_survivors_shrink_finish_and_match_a_fresh_run_from_the_same_state(tmp_path):
    checkpoint, shrunk, fresh = tmp_path / "at_shrink.pt", tmp_path / "shrunk.pt", tmp_path / "fresh.pt"
    killed = run_in_own_session([sys.executable, EXAMPLE, "--nproc", "4", "--kill-rank", "2", "--kill-at-step", "6",
                                 "--checkpoint-at-shrink", str(checkpoint), "--save-params", str(shrunk)], timeout=300)
    output = killed.stdout + killed.stderr[-4000:]
    assert killed.returncode == 0, output
    for rank in (0, 1, 3):
        assert f"rank {rank}/4: lost rank(s) [2] at step 6 (DistBackendError after" in killed.stdout, output
    assert "done: ranks [0, 1, 3] finished, rank(s) [2] lost (exit codes [-9])" in killed.stdout, output
    assert "epoch 2: loss" in killed.stdout and "on 3 ranks" in killed.stdout, output
    state = torch.load(checkpoint, weights_only=True)
    assert (state["epoch"], state["step"], state["global_step"]) == (0, 6, 6), state.keys()

    resumed = run_in_own_session([sys.executable, EXAMPLE, "--nproc", "3", "--resume", str(checkpoint),
                                  "--save-params", str(fresh)], timeout=300)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr[-4000:]
    assert "done: ranks [0, 1, 2] finished, rank(s) [] lost" in resumed.stdout, resumed.stdout
    ours, theirs = torch.load(shrunk, weights_only=True), torch.load(fresh, weights_only=True)
    assert len(ours) == len(theirs) == 4
    for a, b in zip(ours, theirs):
        assert torch.equal(a, b), (a - b).abs().max()


def test_torchrun_restart_from_the_checkpoint_ends_as_a_run_without_the_kill(tmp_path):
    """The other way (the cost beside shrink: scripts/recovery_cost.py): under torchrun
    --max-restarts 1 the kill ends every rank, torchrun starts all 4 again, and they resume from the
    checkpoint rank 0 wrote after step 5, with forked DataLoader workers alive at the kill. Resuming
    loses nothing, so the parameters equal those of a 4-rank run without the kill, bitwise."""
    job = [EXAMPLE, "--worker", "--epochs", "1", "--loader-workers", "2", "--report-times"]
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "4",
                "--max-restarts", "1"]
    restarted = run_in_own_session(torchrun + job + ["--kill-rank", "2", "--kill-at-step", "6", "--checkpoint",
                                                     str(tmp_path / "every_step.pt"),
                                                     "--save-params", str(tmp_path / "restarted.pt")], timeout=300)
    output = restarted.stdout + restarted.stderr[-4000:]
    assert restarted.returncode == 0, output
    assert "rank 2: SIGKILL at t=" in restarted.stdout, output
    back = re.findall(r"rank (\d+): first step after the failure done", restarted.stdout)
    assert sorted(back) == ["0", "1", "2", "3"], output  # every rank of the restarted job, once
    assert "epoch 1: loss" in restarted.stdout and "on 4 ranks" in restarted.stdout, output
    uninterrupted = run_in_own_session(torchrun + job + ["--save-params", str(tmp_path / "uninterrupted.pt")],
                                       timeout=300)
    assert uninterrupted.returncode == 0, uninterrupted.stdout + uninterrupted.stderr[-4000:]
    ours = torch.load(tmp_path / "restarted.pt", weights_only=True)
    theirs = torch.load(tmp_path / "uninterrupted.pt", weights_only=True)
    assert len(ours) == len(theirs) == 4
    for a, b in zip(ours, theirs):
        assert torch.equal(a, b), (a - b).abs().max()
