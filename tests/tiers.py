"""CI's set and the full run (docs/testing.md#what-ci-runs).

`scripts/test.sh` (CI) runs every test but those marked `exhaustive`; `scripts/test.sh --all` runs
them too. A parametrized scenario keeps in CI's set one case of each kind of thing it checks (a
transport, an odd and an even world size, a layout of hosts); its other cases, repeats at other
sizes, go to the full run through ``exhaustive``."""

import pytest


def exhaustive(*values, id=None):
    """A parameter set left to the full run: ``pytest.param(*values)`` marked `exhaustive`."""
    return pytest.param(*values, marks=pytest.mark.exhaustive, id=id)
