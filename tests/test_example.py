"""The README's commands: ``bash scripts/train.sh`` (the main job, examples/train_cifar10.py; its
full runs are in tests/test_cifar10.py) and the minimal example, examples/train_ddp_cpu.py, under
torchrun (env://)."""

import os
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_train_sh_runs_the_cifar10_example_and_passes_arguments_through(tmp_path):
    # Arguments after train.sh's own override them: one short epoch, everything in tmp_path.
    command = ["bash", os.path.join(REPO, "scripts", "train.sh"), "--epochs", "1", "--limit-train-batches", "3",
               "--limit-eval-batches", "2", "--data-dir", str(tmp_path / "no-cifar10-here"),
               "--synthetic-dir", str(tmp_path / "generated"), "--checkpoint-dir", str(tmp_path),
               "--out-dir", str(tmp_path)]
    result = subprocess.run(command, capture_output=True, text=True, timeout=300, cwd=REPO,
                            env={**os.environ, "PYTHON": sys.executable})
    assert result.returncode == 0, result.stdout + result.stderr[-5000:]
    summary = [line for line in result.stdout.splitlines() if line.startswith("done:")]
    assert summary, result.stdout
    assert "backend=ddplite world_size=2 device=cpu arch=resnet9 data=generated epochs=1" in summary[0], summary
    assert (tmp_path / "checkpoint.pt").exists() and (tmp_path / "metrics.png").exists()


def test_torchrun_two_rank_training():
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
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
