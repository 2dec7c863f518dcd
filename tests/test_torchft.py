"""torchft on ddplite (issue 28): ProcessGroupDdplite serves every collective torchft calls through
reconfigurations, records a dead peer's error for the Manager instead of raising, and torchft's
Manager trains two replica groups on it, healing a killed-and-restarted one (the example's --torchft
mode), with torchft's own ProcessGroupGloo as the oracle."""

import os
import re
import sys

import pytest
import torch
import torch.distributed as dist

pytest.importorskip("torchft", reason="torchft is not installed (scripts/setup.sh installs it)")

import torchft_workers  # noqa: E402
from harness import run_ranks  # noqa: E402
from test_example import run_in_own_session  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXAMPLE = os.path.join(ROOT, "examples", "train_fault_tolerant.py")


def _check_closed_forms(out, rank, size):
    triangle = size * (size + 1) / 2
    assert out["size"] == size
    assert torch.equal(out["allreduce_sum"], torch.full((1001,), triangle))
    assert torch.equal(out["allreduce_max"], torch.tensor([size - 1.0, 0.0]))
    first, second = out["allreduce_coalesced"]
    assert torch.equal(first, torch.full((3,), size * (size - 1) / 2))
    assert torch.equal(second, torch.full((2,), float(size * (size - 1))))
    assert [g.tolist() for g in out["allgather"]] == [[float(i)] * 3 for i in range(size)]
    assert torch.equal(out["allgather_into_tensor_coalesced"], torch.arange(float(size)).repeat_interleave(3))
    assert torch.equal(out["broadcast"], torch.arange(5.0) * size)
    assert torch.equal(out["reduce_scatter"], torch.full((4,), triangle + size * rank))
    expected_chunk = torch.tensor([size * (2 * rank + j) + size * (size - 1) / 2 for j in range(2)])
    assert torch.equal(out["reduce_scatter_tensor_coalesced"], expected_chunk)
    assert torch.equal(out["alltoall_base"], torch.tensor([peer * 10.0 + rank for peer in range(size)]))
    if size > 1 and rank == size - 1:
        assert torch.equal(out["p2p"], torch.arange(6.0) + 100)


@pytest.mark.parametrize("world_size,transport", [(2, "auto"), (3, "tcp")])
def test_every_collective_through_reconfigurations_and_a_dead_peer(world_size, transport):
    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)  # outlives every rank
    victim = world_size - 1
    results = run_ranks(torchft_workers.reconfigured_rounds, world_size, victim, backend=None, timeout_s=180,
                        may_exit={victim},
                        env={"TORCHFT_TEST_STORE_PORT": str(store.port), "DDPLITE_CPU_TRANSPORT": transport})
    survivors = [r for r in range(world_size) if r != victim]
    for rank in survivors:
        outcome = results[rank]
        first, second, after = outcome["rounds"]
        _check_closed_forms(first, rank, world_size)
        _check_closed_forms(second, rank, world_size)
        failure = outcome["failure"]
        # torchft's Manager expects wait() not to raise: the error is kept for errored()
        assert failure["waited"] is True, failure
        name, message = failure["error"]
        assert name == "DistBackendError" and f"rank {victim}" in message, failure
        assert failure["noticed"] < 5, failure  # the dead peer is seen at once, not at the 30 s timeout
        print(f"{transport} {world_size} ranks, rank {victim} killed: rank {rank}'s all_reduce recorded "
              f"{name} after {failure['noticed']:.2f} s")
        assert failure["future_value"] is None and failure["same_error_after_future"], failure
        assert failure["errored_after_configure"] is None, failure
        assert failure["errored_after_stale_work"] is None, failure
        assert failure["errored_after_abort"] == ("RuntimeError", "ddplite process group aborted"), failure
        _check_closed_forms(after, survivors.index(rank), len(survivors))


def _run_example(tmp_path, name, *arguments):
    """Runs the example's --torchft launcher; returns (its output, replica 0's final parameters)."""
    params = tmp_path / name
    completed = run_in_own_session([sys.executable, EXAMPLE, "--torchft", "--save-params", str(params), *arguments],
                                   timeout=240)  # a timeout kills the replicas too
    output = completed.stdout + completed.stderr
    assert completed.returncode == 0, output[-6000:]
    assert "replicas hold bitwise the same parameters: yes" in completed.stdout, output[-6000:]
    return completed.stdout, torch.load(f"{params}.replica0", weights_only=True)


def test_manager_heals_a_restarted_replica_and_matches_torchft_gloo_bitwise(tmp_path):
    """min 2 replicas: the live replica drops the step its all_reduce failed in and waits; the
    restarted one heals from it; the job ends with the parameters of torchft's own gloo group run
    without a kill."""
    steps = ["--steps", "10", "--min-replicas", "2", "--min-step-seconds", "0"]
    gloo_output, gloo_params = _run_example(tmp_path, "gloo", *steps, "--process-group", "gloo")
    output, params = _run_example(tmp_path, "ddplite", *steps, "--kill-replica", "1", "--kill-at-step", "4")
    assert "launcher: replica 1 was killed; restarting it" in output, output
    assert re.search(r"replica 0 step 4: .*not committed", output), output
    assert re.search(r"replica 1 step 0: .*healed from a live replica, now at step \d+", output), output
    assert len(params) == len(gloo_params) == 4
    assert all(torch.equal(a, b) for a, b in zip(params, gloo_params))
    assert re.search(r"replica 0 step 9: .*2 replica\(s\) in the quorum, committed", gloo_output), gloo_output


def test_training_goes_on_alone_while_the_killed_replica_restarts(tmp_path):
    """min 1 replica (the example's default): the live replica commits steps alone until the
    restarted one heals and joins; both end with bitwise the same parameters."""
    output, _ = _run_example(tmp_path, "alone", "--steps", "40", "--kill-replica", "1", "--kill-at-step", "4")
    assert "launcher: replica 1 was killed; restarting it" in output, output
    after_kill = output[output.index("launcher: replica 1 was killed"):]
    assert re.search(r"replica 0 step 4: .*not committed", output), output
    alone = re.findall(r"replica 0 step (\d+): .*1 replica\(s\) in the quorum, committed", after_kill)
    assert len(alone) >= 2, output
    healed = re.search(r"replica 1 step 0: .*healed from a live replica, now at step (\d+)", after_kill)
    assert healed and int(healed.group(1)) > 5, output
    assert re.search(r"replica 1 step 39: .*2 replica\(s\) in the quorum, committed", output), output
