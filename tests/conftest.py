import os
import sys

# The test helpers (harness, workers) are imported by name, here and in the forked ranks.
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


# Failures dump the flight recorder (DDPLITE_TRACE_DIR); the tests' dumps go to a folder of this
# session, removed at its end, unless a test names its own.
import atexit  # noqa: E402
import shutil  # noqa: E402
import tempfile  # noqa: E402

if "DDPLITE_TRACE_DIR" not in os.environ:
    os.environ["DDPLITE_TRACE_DIR"] = tempfile.mkdtemp(prefix="ddplite-test-traces-")
    atexit.register(shutil.rmtree, os.environ["DDPLITE_TRACE_DIR"], True)
