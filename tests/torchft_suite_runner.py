"""torchft's own tests (shipped in the torchft wheel: torchft/process_group_test.py,
torchft/manager_integ_test.py) run against torchft's ProcessGroupGloo or, in its place, against
torch_ddp_lite.torchft.ProcessGroupDdplite: a pytest plugin, loaded with ``-p`` before pytest
imports torchft's test modules.

Under DDPLITE_TORCHFT_SUITE_PG=ddplite it puts ProcessGroupDdplite where those modules import
ProcessGroupGloo from (``torchft.process_group.ProcessGroupGloo``, and ``torchft.ProcessGroupGloo``);
every test body, torchft's unchanged, then makes and drives ddplite groups. Under =gloo nothing is
replaced (the oracle). Either way, each time a group makes its backend (``_create_pg``, called by
``configure``) the plugin appends "<test id> <getBackendName()>" to $DDPLITE_TORCHFT_SUITE_RECORD
when that is set, so a caller can prove which group each test ran on ("torchft-gloo" or
"torchft-ddplite"); a group made in a class's setUpClass is recorded under that class's first test.

Run through tests/test_torchft.py (gloo and ddplite compared); directly:

    DDPLITE_TORCHFT_SUITE_PG=ddplite PYTHONPATH=tests python -m pytest -p torchft_suite_runner \\
        "$(python -c 'import torchft, os; print(os.path.dirname(torchft.__file__))')/process_group_test.py" \\
        -k NormalGloo

torchft's test modules import ``parameterized`` (scripts/setup.sh installs it).
"""

import os
import threading

import torchft
import torchft.process_group as torchft_process_group

from torch_ddp_lite.torchft import ProcessGroupDdplite

SUITE_PG = os.environ.get("DDPLITE_TORCHFT_SUITE_PG", "ddplite")
if SUITE_PG not in ("gloo", "ddplite"):
    raise ValueError(f"DDPLITE_TORCHFT_SUITE_PG={SUITE_PG!r}: use gloo or ddplite")

_record_lock = threading.Lock()  # the tests configure their ranks' groups from threads
_current_test = "(no test)"


def _recording(create_pg):
    def _create_pg(self, store, rank, world_size):
        record = os.environ.get("DDPLITE_TORCHFT_SUITE_RECORD")
        if record:
            with _record_lock, open(record, "a") as out:
                out.write(f"{_current_test} {self.getBackendName()}\n")
        return create_pg(self, store, rank, world_size)

    return _create_pg


for _group in (torchft_process_group.ProcessGroupGloo, ProcessGroupDdplite):
    _group._create_pg = _recording(_group._create_pg)

if SUITE_PG == "ddplite":
    torchft_process_group.ProcessGroupGloo = ProcessGroupDdplite
    torchft.ProcessGroupGloo = ProcessGroupDdplite


def pytest_runtest_protocol(item, nextitem):
    global _current_test
    _current_test = item.nodeid
