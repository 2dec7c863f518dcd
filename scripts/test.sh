#!/usr/bin/env bash
# Set up (idempotent) and run the test suite: CI's set, everything but the `exhaustive` sweeps.
#   bash scripts/test.sh                    # CI's set (what .ci/run runs)
#   bash scripts/test.sh --all              # everything: CI's set and the exhaustive sweeps
#   bash scripts/test.sh -m "not slow and not exhaustive"   # the quick loop
# The other arguments go to pytest. A -m of your own replaces the default -m "not exhaustive"
# (add "and not exhaustive" to it to keep the sweeps out).
set -euo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
all=0
args=()
for arg in "$@"; do
  if [ "$arg" = "--all" ]; then all=1; else args+=("$arg"); fi
done
set -- ${args[@]+"${args[@]}"}
if [ "$all" = 0 ]; then
  user_marks=0
  for arg in "$@"; do
    case "$arg" in -m*) user_marks=1 ;; esac
  done
  if [ "$user_marks" = 0 ]; then
    set -- -m "not exhaustive" "$@"
  fi
fi
bash "$REPO/scripts/setup.sh"
cd "$REPO"
# Every test of 5 s or more is listed at the end: CI's time (40 minutes is the goal) is planned from them.
exec "${PYTHON:-python3}" -m pytest tests --durations=0 --durations-min=5 "$@"
