#!/usr/bin/env bash
# Builds torch-ddp-lite against one torch release in a virtual environment of its own and runs the
# quick slice of the tests there (registration, collectives, DDP, parity, shared memory), then a
# 2-rank DDP smoke run of the main job through torchrun. The checkout's own environment is not
# touched: the venv and a copy of the tree (its own build/ and _C.so) live under
#   ${DDPLITE_TORCH_ENVS:-~/.cache/ddplite/torch-envs}/torch-<version>/{venv,src}
# and are kept, so a second run rebuilds only what changed.
#   bash scripts/torch_slice.sh 2.8.0          # CI runs this for the oldest supported torch
#   bash scripts/torch_slice.sh 2.13.0 -x      # extra arguments go to pytest
# Last line: "torch-slice torch=<v> build=ok|failed passed=N failed=N skipped=N ddp=ok|failed seconds=S";
# the same as JSON in <env>/result.json (scripts/torch_matrix.sh collects them). Exit 0 only when
# the build, every test of the slice and the DDP run pass.
set -uo pipefail
VERSION="${1:?usage: torch_slice.sh <torch version> [pytest args]}"
shift
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
ENVS="${DDPLITE_TORCH_ENVS:-$HOME/.cache/ddplite/torch-envs}"
HERE="$ENVS/torch-$VERSION"
VENV="$HERE/venv"
SRC="$HERE/src"
SLICE=(tests/test_registration.py tests/test_collectives.py tests/test_ddp.py tests/test_parity.py tests/test_shm.py
       tests/test_status.py::test_the_tool_reads_torchs_tcp_store_without_torch)
started=$(date +%s)
say() { echo "[torch-slice $VERSION] $*"; }

finish() {  # build passed failed skipped ddp
  local seconds=$(( $(date +%s) - started ))
  printf '{"torch": "%s", "build": "%s", "passed": %s, "failed": %s, "skipped": %s, "ddp": "%s", "seconds": %s, "date": "%s"}\n' \
    "$VERSION" "$1" "$2" "$3" "$4" "$5" "$seconds" "$(date -u +%Y-%m-%d)" > "$HERE/result.json"
  echo "torch-slice torch=$VERSION build=$1 passed=$2 failed=$3 skipped=$4 ddp=$5 seconds=$seconds"
  [ "$1" = ok ] && [ "$2" -gt 0 ] && [ "$3" = 0 ] && [ "$5" = ok ]
  exit $?
}

mkdir -p "$HERE"
if ! python3 "$REPO/torch_ddp_lite/torch_versions.py" supported "$VERSION"; then
  say "torch $VERSION is not one torch-ddp-lite supports ($(python3 "$REPO/torch_ddp_lite/torch_versions.py" range))"
  exit 2
fi
[ -x "$VENV/bin/python" ] || python3 -m venv "$VENV"

# The tree as it is now (tracked and new files, not ignored ones), over the previous copy; its
# build/ and _C.so stay, and tar keeps modification times, so ninja recompiles only what changed.
mkdir -p "$SRC"
find "$SRC" -mindepth 1 -maxdepth 1 ! -name build ! -name torch_ddp_lite -exec rm -rf {} +
find "$SRC/torch_ddp_lite" -mindepth 1 ! -name '_C*.so' -exec rm -rf {} + 2>/dev/null || true
# (--ignore-failed-read: a tracked file deleted in the working tree is left out, not an error)
(cd "$REPO" && git ls-files -co --exclude-standard -z | tar --null --ignore-failed-read -T - -cf - 2>/dev/null) \
  | tar -xf - -C "$SRC"

say "setting up $VENV (torch $VERSION) and building $SRC"
if ! PYTHON="$VENV/bin/python" TORCH_VERSION="$VERSION" bash "$SRC/scripts/setup.sh"; then
  say "set-up or build failed"
  finish failed 0 0 0 skipped
fi

cd "$SRC"
export PATH="$VENV/bin:$PATH"
# A CUDA build of torch brings its nvidia-nccl wheel: the build must then have compiled the NCCL
# path too (the CUDA files against this torch's headers), else the slice would not cover them.
if ! "$VENV/bin/python" -c "
import sys, torch, torch_ddp_lite
sys.exit(0 if not torch.version.cuda or torch_ddp_lite.build_info()['nccl']['compiled_in'] else 1)"; then
  say "torch $VERSION is a CUDA build but the extension was built without NCCL"
  finish failed 0 0 0 skipped
fi
log="$HERE/pytest.log"
"$VENV/bin/python" -m pytest "${SLICE[@]}" -m "not slow and not exhaustive" -q -p no:cacheprovider "$@" 2>&1 | tee "$log" | tail -n 25
summary=$(grep -E "^(=+ )?[0-9]+ (passed|failed|skipped|error)" "$log" | tail -n 1)
count() { echo "$summary" | grep -oE "[0-9]+ $1" | grep -oE "[0-9]+" || echo 0; }
passed=$(count passed); failed=$(( $(count failed) + $(count error) )); skipped=$(count skipped)
[ -n "$summary" ] || failed=1

say "DDP smoke: 2 ranks, torchrun, examples/train_cifar10.py (one short epoch)"
ddp=failed
if PYTHONPATH="$SRC" timeout 600 "$VENV/bin/python" -m torch.distributed.run --standalone --nproc-per-node 2 \
    examples/train_cifar10.py --arch resnet9 --width 8 --epochs 1 --batch-size 32 \
    --synthetic-train-size 512 --synthetic-test-size 128 --limit-train-batches 4 --limit-eval-batches 2 \
    --checkpoint-dir "$HERE/runs" --out-dir "$HERE/runs" > "$HERE/ddp.log" 2>&1; then
  ddp=ok
fi
tail -n 3 "$HERE/ddp.log"
finish ok "$passed" "$failed" "$skipped" "$ddp"
