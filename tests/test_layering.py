"""The layers of csrc/ (README, "Layout"): the transports know nothing of the algorithms or the
backend above them. transport/fingerprint.cpp once included cpu/algorithms/selector to name
algorithms in messages; the algorithm layer now registers the names with it instead (that the
names still reach the messages: tests/test_mismatch.py, "algorithm: ring here, butterfly at the
peer")."""

import os
import re

CSRC = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "csrc")
ABOVE_THE_TRANSPORTS = ("cpu/algorithms/", "cpu/shm/", "cpu/collectives", "backend/", "cuda/")


def includes(path):
    with open(path) as source:
        return re.findall(r'^#include "([^"]+)"', source.read(), re.MULTILINE)


def test_transports_include_nothing_above_them():
    folder = os.path.join(CSRC, "cpu", "transport")
    offending = [(name, included) for name in sorted(os.listdir(folder))
                 for included in includes(os.path.join(folder, name)) if included.startswith(ABOVE_THE_TRANSPORTS)]
    assert offending == []



# What the backend may include from cpu/: the CPU path object (which owns the transports, the
# segments or the hierarchy, MPI's collectives and the send/recv engine), the collectives it runs
# on it, the engine's API, the algorithm selector (pins), the reduction kernels, and the transport
# interface for its error and deadline types. Not a transport, a segment or a hierarchy itself.
BACKEND_MAY_INCLUDE = ("cpu/cpu_path.hpp", "cpu/collectives.hpp", "cpu/p2p_engine.hpp", "cpu/algorithms/",
                       "cpu/reduce/", "cpu/transport/transport.hpp")


def test_the_backend_talks_to_the_cpu_path_only():
    folder = os.path.join(CSRC, "backend")
    offending = [(name, included) for name in sorted(os.listdir(folder))
                 for included in includes(os.path.join(folder, name))
                 if included.startswith("cpu/") and not included.startswith(BACKEND_MAY_INCLUDE)]
    assert offending == []
