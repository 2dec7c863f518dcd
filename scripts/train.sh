#!/usr/bin/env bash
# Set up (idempotent) and run the main job: examples/train_cifar10.py, a ResNet-9 trained by 2-rank
# DDP through ddplite on CPU under torchrun, on CIFAR-10 if --data-dir holds it and otherwise on
# generated CIFAR-format data. The configuration below is sized for 2 cores (about a minute and a
# half); extra arguments go to the training script and override it, e.g. --epochs 5, --backend gloo,
# --data-dir /data (a folder holding cifar-10-batches-py), --resume.
set -euo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$REPO/scripts/setup.sh"
cd "$REPO"
# The ranks import this checkout's torch_ddp_lite even where another copy is installed.
export PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}"
exec "${PYTHON:-python3}" -m torch.distributed.run --standalone --nproc-per-node 2 examples/train_cifar10.py \
  --arch resnet9 --width 16 --epochs 3 --batch-size 64 --lr 0.1 \
  --synthetic-train-size 10000 --synthetic-test-size 2000 "$@"
