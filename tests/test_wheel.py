"""The wheel: built against the installed torch, named for it, and working where neither this
checkout nor a compiler is (scripts/wheel_check.sh: a fresh virtual environment with only that torch,
a 2-rank all_reduce and a DDP step through ddplite against their closed forms)."""

import os
import subprocess

import pytest
import torch

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.slow
def test_wheel_installs_and_runs_without_the_checkout_or_a_compiler(tmp_path):
    proc = subprocess.run(["bash", os.path.join(REPO, "scripts", "wheel_check.sh"), str(tmp_path)],
                          capture_output=True, text=True, timeout=1200)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    major, minor = torch.__version__.split(".")[:2]
    wheel = next(line for line in proc.stdout.splitlines() if line.startswith("wheel: "))
    assert wheel.startswith(f"wheel: torch_ddp_lite-0.1.0+torch{major}.{minor}-"), wheel
    assert "wheel works" in proc.stdout, proc.stdout
