"""torch's own distributed test suite (DistributedTest._DistTestBase, shipped in the wheel), driven
as torch's test/distributed/test_distributed_spawn.py drives it, against gloo or against ddplite.

The suite gates many tests on the backend's name (``BACKEND != "gloo"`` at import time). To run
against ddplite exactly the tests that run against gloo, the suite is imported with
BACKEND=gloo; under DDPLITE_SUITE_BACKEND=ddplite each rank process then creates its default
group with backend "ddplite" where the suite asks for "gloo" (groups the suite creates with an
explicit backend stay as asked), and ``dist.monitored_barrier`` (which torch refuses for every
backend but gloo before asking it) goes to ``torch_ddp_lite.monitored_barrier`` for ddplite
groups. ``dist.get_backend()`` says "ddplite"; the two tests that compare it with the suite's
BACKEND (NAME_TESTS) see BACKEND == "ddplite" in their body, every other body sees "gloo" and so
expects gloo's behaviour.

Each rank checks, before the test body runs, that its default group really is on the backend asked
for, and appends "<test> <rank> <backend>" to $DDPLITE_SUITE_RECORD when that is set, so a
caller can prove which backend ran every test that passed.

Run through scripts/torch_suite.py (the comparison) or tests/test_torch_suite.py (CI's slice);
directly: ``DDPLITE_SUITE_BACKEND=ddplite python -m pytest tests/torch_suite_runner.py -k test_barrier``.
Needs ``expecttest`` (scripts/setup.sh installs it) and WORLD_SIZE (default 2).
"""

import atexit
import os
import shutil
import tempfile

SUITE_BACKEND = os.environ.get("DDPLITE_SUITE_BACKEND", "ddplite")
if SUITE_BACKEND not in ("gloo", "ddplite"):
    raise ValueError(f"DDPLITE_SUITE_BACKEND={SUITE_BACKEND!r}: use gloo or ddplite")
os.environ["BACKEND"] = "gloo"  # the suite's gates: the tests gloo runs
os.environ.setdefault("WORLD_SIZE", "2")
if "TEMP_DIR" not in os.environ:  # the suite's scratch folder; the rank processes inherit it
    os.environ["TEMP_DIR"] = tempfile.mkdtemp(prefix="ddplite-torch-suite-")
    atexit.register(shutil.rmtree, os.environ["TEMP_DIR"], True)

import torch.distributed as dist  # noqa: E402
from torch.testing._internal.distributed.distributed_test import (  # noqa: E402
    DistributedTest,
    TestDistBackend,
)

import torch_ddp_lite  # noqa: E402
from torch.testing._internal.distributed import distributed_test  # noqa: E402

# Tests whose body compares a name with the suite's BACKEND: they run with BACKEND set to the
# backend under test (only in that rank process, after the gates were decided). Every other test
# sees BACKEND == "gloo" in its body, as when it runs on gloo.
NAME_TESTS = {"test_get_backend", "test_Backend_enum_class"}

_torch_init_process_group = dist.init_process_group
_torch_monitored_barrier = dist.monitored_barrier


def _init_process_group(*args, **kwargs):
    if kwargs.get("backend") == "gloo":
        kwargs["backend"] = torch_ddp_lite.BACKEND_NAME
    return _torch_init_process_group(*args, **kwargs)


def _monitored_barrier(group=None, timeout=None, wait_all_ranks=False):
    if dist.get_backend(group) == torch_ddp_lite.BACKEND_NAME:
        return torch_ddp_lite.monitored_barrier(group, timeout, wait_all_ranks)
    return _torch_monitored_barrier(group, timeout, wait_all_ranks)


if SUITE_BACKEND == "ddplite":
    dist.init_process_group = _init_process_group
    dist.monitored_barrier = _monitored_barrier


class TestTorchSuite(TestDistBackend, DistributedTest._DistTestBase):
    def setUp(self):
        super().setUp()
        self._spawn_processes()

    # In each rank's process, after the suite's init_process_group and barrier.
    def run_test(self, test_name, parent_pipe):
        backend = dist.get_backend()
        if backend != SUITE_BACKEND:
            raise RuntimeError(f"{test_name}: the default group runs on {backend}, not {SUITE_BACKEND}")
        if SUITE_BACKEND == "ddplite" and test_name in NAME_TESTS:
            distributed_test.BACKEND = SUITE_BACKEND
        record = os.environ.get("DDPLITE_SUITE_RECORD")
        if record:
            with open(record, "a") as out:
                out.write(f"{test_name} {self.rank} {backend}\n")
        return super().run_test(test_name, parent_pipe)
