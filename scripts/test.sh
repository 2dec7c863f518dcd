#!/usr/bin/env bash
# Set up (idempotent) and run the test suite. Extra arguments go to pytest, e.g.
#   bash scripts/test.sh -m "not slow"      # the quick subset
set -euo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$REPO/scripts/setup.sh"
cd "$REPO"
exec "${PYTHON:-python3}" -m pytest tests --durations=20 "$@"
