"""torchft on ddplite: ProcessGroupDdplite serves every collective torchft calls through
reconfigurations, records a dead peer's error for the Manager instead of raising, and torchft's
Manager trains two replica groups on it, healing a killed-and-restarted one (the example's --torchft
mode), with torchft's own ProcessGroupGloo as the oracle. torchft's own tests of its gloo group and
of its Manager run on ProcessGroupDdplite too, gloo as the oracle."""

import os
import re
import subprocess
import sys
import time
import xml.etree.ElementTree as ElementTree

import pytest
import torch
import torch.distributed as dist

torchft = pytest.importorskip("torchft", reason="torchft is not installed (scripts/setup.sh installs it)")

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
        # torchft's contract (its NCCL group's RuntimeError("aborted")), the backend's error as the cause
        cause_name, cause = failure["cause"]
        assert cause_name == "DistBackendError" and f"rank {victim}" in cause, failure
        assert failure["error"] == ("RuntimeError", f"ddplite process group aborted: {cause}"), failure
        assert failure["noticed"] < 5, failure  # the dead peer is seen at once, not at the 30 s timeout
        print(f"{transport} {world_size} ranks, rank {victim} killed: rank {rank}'s all_reduce recorded "
              f"{cause_name} after {failure['noticed']:.2f} s")
        assert failure["future_value"] is None and failure["same_error_after_future"], failure
        assert failure["same_error_after_abort"], failure
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


# torchft's own tests that make a ProcessGroupGloo (tests/torchft_suite_runner.py puts
# ProcessGroupDdplite in its place), from the torchft wheel. Not selected: the Baby* groups (torchft's
# subprocess wrappers of gloo and NCCL), the NCCL ones (a GPU), those on ProcessGroupDummy or a mock.
# manager_test.py is not run: every test there gives the Manager create_autospec(ProcessGroup).
TORCHFT_SUITE = {
    "process_group_test.py": ["NormalGlooMultiPgTest", "test_gloo_apis", "test_gloo_timeout",
                              "test_functional_collectives"],
    "manager_integ_test.py": ["ManagerIntegTest"],
}
# Left out on both groups: a race in the test itself. Its two replicas are threads of one process
# that share torch's global RNG; each seeds it and builds its model under INIT_LOCK, but draws its
# first batch (`torch.rand` in ddp_train_loop) outside the lock, before any collective. A replica
# that draws while the other is between its seed and its model shifts the other's initial weights,
# and with init_sync=False nothing brings them back together: the final weights then differ by the
# size of an initial weight, whichever group carries the gradients (torchft 0.2.0: seen once in a
# full CI run, "Tensor-likes are not close", |diff| 0.98 in layers.0.bias; 0 in 36 runs by hand).
TORCHFT_RACY = ["test_ddp_skip_init_sync"]


def _run_torchft_suite(group, tmp_path):
    """One pytest run of TORCHFT_SUITE on `group` (gloo or ddplite); returns ({test: outcome},
    {test: {group names it made}}, seconds, output)."""
    torchft_dir = os.path.dirname(torchft.__file__)  # torchft's tests ship in its wheel
    junit, record = tmp_path / f"{group}.xml", tmp_path / f"{group}.record"
    tests_dir = os.path.dirname(os.path.abspath(__file__))
    env = dict(os.environ, DDPLITE_TORCHFT_SUITE_PG=group, DDPLITE_TORCHFT_SUITE_RECORD=str(record),
               PYTHONHASHSEED="0",  # torchft names its parametrized tests in a set's order
               PYTHONPATH=os.pathsep.join([tests_dir, *filter(None, [os.environ.get("PYTHONPATH")])]))
    files = [os.path.join(torchft_dir, name) for name in TORCHFT_SUITE]
    select = "(" + " or ".join(name for names in TORCHFT_SUITE.values() for name in names) + ")"
    select += "".join(f" and not {name}" for name in TORCHFT_RACY)
    started = time.monotonic()
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "torchft_suite_runner",
                          f"--junitxml={junit}", "-k", select, *files],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=600, check=False)
    elapsed = time.monotonic() - started
    output = run.stdout + run.stderr
    assert junit.exists(), output[-6000:]
    outcomes = {}  # tests as "process_group_test.py::Class::test", in the junit and in the record
    for case in ElementTree.parse(junit).getroot().iter("testcase"):
        problem = next((tag for tag in ("failure", "error", "skipped") if case.find(tag) is not None), None)
        module, cls = case.get("classname").rsplit(".", 1)
        outcomes[f"{module.rsplit('.', 1)[-1]}.py::{cls}::{case.get('name')}"] = problem or "passed"
    made = {}
    for line in (record.read_text().splitlines() if record.exists() else []):
        test, made_group = line.split()
        path, test_in_file = test.split("::", 1)
        made.setdefault(f"{os.path.basename(path)}::{test_in_file}", set()).add(made_group)
    return outcomes, made, elapsed, output


@pytest.mark.slow
def test_torchft_own_tests_pass_on_ddplite_as_on_gloo(tmp_path):
    """Every one of torchft's tests in TORCHFT_SUITE that passes on its ProcessGroupGloo passes with
    ProcessGroupDdplite in its place, and the groups those tests made were ddplite's."""
    pytest.importorskip("parameterized", reason="torchft's tests import it (scripts/setup.sh installs it)")
    gloo, gloo_made, gloo_seconds, gloo_output = _run_torchft_suite("gloo", tmp_path)
    ours, ours_made, ours_seconds, output = _run_torchft_suite("ddplite", tmp_path)
    for group, outcomes, seconds in (("gloo", gloo, gloo_seconds), ("ddplite", ours, ours_seconds)):
        print(f"torchft's tests on {group}: {sum(o == 'passed' for o in outcomes.values())} passed, "
              f"{sum(o == 'skipped' for o in outcomes.values())} skipped of {len(outcomes)} in {seconds:.0f} s")
    passed_on_gloo = {test for test, outcome in gloo.items() if outcome == "passed"}
    for name in TORCHFT_SUITE:  # the selection still finds torchft's tests (a new torchft may rename them)
        assert any(test.startswith(f"{name}::") for test in passed_on_gloo), (name, gloo_output[-6000:])
    assert sorted(ours) == sorted(gloo), output[-6000:]
    differing = sorted(test for test in passed_on_gloo if ours[test] != "passed")
    assert not differing, f"pass on gloo, not on ddplite: {differing}\n{output[-12000:]}"
    # the oracle ran on gloo; the same tests made ddplite groups, and no gloo one
    assert set().union(*gloo_made.values()) == {"torchft-gloo"}, gloo_made
    assert set().union(*ours_made.values()) == {"torchft-ddplite"}, ours_made
    assert set(ours_made) == set(gloo_made) and len(gloo_made) >= 10, (sorted(gloo_made), sorted(ours_made))


@pytest.mark.parametrize("replicas,per_replica", [(1, 1), (2, 2), (3, 4)])
def test_every_process_of_a_quorum_notes_the_same_number_of_ranks_for_the_status_tool(replicas, per_replica):
    # torchft's global rank is replica * group_world_size + group rank, and each group holds one
    # group rank of every replica: all processes must publish the same count (every replica's ranks),
    # whichever group they are in, or the status tool would ask some and not others
    from torch_ddp_lite.torchft import ProcessGroupDdplite

    noted = set()
    for group_rank in range(per_replica):
        group = ProcessGroupDdplite()
        group._global_ranks = [replica * per_replica + group_rank for replica in range(replicas)]
        group._group_world_size = per_replica
        noted.add(group._ranks_in_the_job(replicas))
    assert noted == {replicas * per_replica}
    group._global_ranks = None  # configured without global ranks: the group's own size
    assert group._ranks_in_the_job(replicas) == replicas
