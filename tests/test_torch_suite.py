"""CI's slice of PyTorch's own distributed test suite run against ddplite. The full
comparison with gloo, every test of DistributedTest._DistTestBase on both backends, is
scripts/torch_suite.py; its latest result is in docs/parity.md, and every test below passes on
gloo there. Each test here must pass on ddplite, and must have run on ddplite on every rank (the
runner's record), not been skipped."""

import os
import subprocess
import sys
import xml.etree.ElementTree as ElementTree

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# One or more per area the issue names, among those that pass on gloo on CPU at 2 ranks.
SLICE = [
    "test_all_reduce_sum",                          # collectives
    "test_all_reduce_coalesced_max",
    "test_all_reduce_complex_unsupported_ops",
    "test_sparse_all_reduce_sum",
    "test_all_gather_coalesced_simple",
    "test_reduce_product",
    "test_scatter_checks",
    "test_gather_checks",
    "test_barrier_timeout_full_group",              # "Timed out" phrase
    "test_monitored_barrier_gloo",                  # gloo's monitored_barrier and its phrases
    "test_monitored_barrier_gloo_rank_0_timeout",
    "test_send_recv_with_tag",                      # p2p
    "test_send_recv_any_source",
    "test_batch_isend_irecv_gloo_tags",
    "test_get_future",
    "test_get_backend",                             # the runner's name check
    "test_destroy_group",                           # subgroups
    "test_all_gather_object_subgroup",
    "test_SyncBatchNorm_process_group",             # SyncBatchNorm
    "test_DistributedDataParallelCPU",              # DDP
    "test_accumulate_gradients_no_sync_allreduce_hook",
    "test_ddp_create_graph",
]


@pytest.mark.slow
def test_torch_suite_slice_passes_on_ddplite(tmp_path):
    junit, record = tmp_path / "ddplite.xml", tmp_path / "record"
    env = dict(os.environ, DDPLITE_SUITE_BACKEND="ddplite", WORLD_SIZE="2", DDPLITE_SUITE_RECORD=str(record),
               TEMP_DIR=str(tmp_path / "suite"))
    os.makedirs(env["TEMP_DIR"])
    node_ids = [f"tests/torch_suite_runner.py::TestTorchSuite::{name}" for name in SLICE]
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--junitxml={junit}", *node_ids],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=1500, check=False)
    outcomes = {}
    for case in ElementTree.parse(junit).getroot().iter("testcase"):
        problem = next((tag for tag in ("failure", "error", "skipped") if case.find(tag) is not None), None)
        outcomes[case.get("name")] = problem or "passed"
    assert sorted(outcomes) == sorted(SLICE), run.stdout[-3000:]
    assert all(outcome == "passed" for outcome in outcomes.values()), (outcomes, run.stdout[-6000:])
    ran = {}
    for line in record.read_text().splitlines():
        test, rank, backend = line.split()
        ran.setdefault(test, set()).add((int(rank), backend))
    for name in SLICE:
        assert ran.get(name) == {(0, "ddplite"), (1, "ddplite")}, (name, ran.get(name))
