"""The mutation test (scripts/mutants.py, docs/testing.md) is not part of CI (an hour on 2 cores),
but every mutant must still apply to the sources: a change that removes a mutant's line must
update the mutant, or the next full run silently tests less."""

import os
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_every_mutant_still_applies():
    result = subprocess.run([sys.executable, os.path.join(REPO, "scripts", "mutants.py"), "--check"],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "mutants apply" in result.stdout
