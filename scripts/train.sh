#!/usr/bin/env bash
# Set up (idempotent) and run the main job: 2-rank DDP training through ddplite on CPU.
# Extra arguments go to the training script, e.g. --epochs 1 or --backend gloo.
set -euo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$REPO/scripts/setup.sh"
cd "$REPO"
exec "${PYTHON:-python3}" -m torch.distributed.run --nproc-per-node 2 examples/train_ddp_cpu.py "$@"
