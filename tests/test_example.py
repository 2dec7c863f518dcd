"""The README's main job: 2-rank DDP training through ddplite, launched by torchrun (env://)."""

import os
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_torchrun_two_rank_training():
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
               os.path.join(REPO, "examples", "train_ddp_cpu.py"), "--epochs", "3"]
    result = subprocess.run(command, capture_output=True, text=True, timeout=300, cwd=REPO)
    assert result.returncode == 0, result.stdout + result.stderr
    lines = result.stdout.splitlines()
    summary = [line for line in lines if line.startswith("done:")]
    assert summary and "backend=ddplite world_size=2" in summary[0] and "params_in_sync=True" in summary[0], lines
    epochs = [line for line in lines if line.startswith("epoch")]
    losses = [float(line.split("loss ")[1].split()[0]) for line in epochs]
    accuracy = float(epochs[-1].split("train accuracy ")[1])
    assert len(losses) == 3 and losses[-1] < losses[0], epochs  # it learns...
    assert accuracy > 0.5, epochs  # ...well above chance (0.1)
