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

