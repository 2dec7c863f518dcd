#!/usr/bin/env bash
# The GPU checks of docs/gpu.md as one bounded run, for a machine lent for a few minutes:
# build with NCCL, tests/test_cuda.py (quick part), the collectives benchmark against nccl at
# world size 1, then the slow DDP tests and the DDP benchmark while time is left.
#
#   bash scripts/gpu_check.sh [OUT_DIR] [BUDGET_S]
#
# OUT_DIR (default $OUT, else /tmp/gpu_check) receives info.txt, summary.txt, build.log,
# tests.log, bench.log, gpu_ws1.json, slow.log, ddp.log (eight files, what a device call brings
# back). BUDGET_S (default 520) bounds the whole run: each stage gets at most its own cap and
# what is left of the budget, so the script ends inside a device call's limit even when a stage
# hangs.
set -u
out=${1:-${OUT:-/tmp/gpu_check}}
budget=${2:-520}
mkdir -p "$out"
start=$SECONDS
export PYTHONUNBUFFERED=1 PYTHONFAULTHANDLER=1 TORCH_DEVICE_BACKEND_AUTOLOAD=0

left() { echo $((budget - (SECONDS - start))); }
stage() {  # stage NAME CAP_S LOG COMMAND...: runs COMMAND under min(CAP_S, time left)
    local name=$1 cap=$2 log=$3; shift 3
    local limit; limit=$(left)
    (( cap < limit )) && limit=$cap
    if (( limit < 20 )); then echo "== $name: skipped, ${limit} s left" | tee -a "$out/summary.txt"; return 99; fi
    local t0=$SECONDS
    timeout -k 10 "$limit" "$@" >"$out/$log" 2>&1
    local rc=$?
    echo "== $name: rc=$rc in $((SECONDS - t0)) s (limit ${limit} s)" | tee -a "$out/summary.txt"
    tail -n 25 "$out/$log"
    return $rc
}

{
    date -u; nvidia-smi -L; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
    python3 -c "import sys, torch; print(sys.version); print('torch', torch.__version__, 'cuda', torch.version.cuda, 'nccl', torch.cuda.nccl.version(), 'gpus', torch.cuda.device_count())"
    python3 -m pip list 2>/dev/null | grep -i -E "nccl|pytest|^torch "
    which nvcc g++ && g++ --version | head -1 && nvcc --version | tail -2
    nproc; free -g | head -2
} >"$out/info.txt" 2>&1
cat "$out/info.txt"

# nvcc's toolkit provides cuda_runtime_api.h; setup.py reads CUDA_HOME (default /usr/local/cuda).
if [[ -z ${CUDA_HOME:-} && ! -d /usr/local/cuda ]] && command -v nvcc >/dev/null; then
    CUDA_HOME=$(dirname "$(dirname "$(command -v nvcc)")")
    export CUDA_HOME
fi
stage build 260 build.log env MAX_JOBS="$(nproc)" python3 -m pip install --no-build-isolation --no-deps -e . || {
    echo "build failed: see build.log"; exit 1; }
{
    # the extension must import torch's libstdc++.so.6, not carry a copy (setup.py, libstdcxx_link_args)
    for compiler in "${CXX:-c++}" g++; do
        echo "$compiler: $(command -v "$compiler") $("$compiler" --version | head -1); libstdc++.so: $("$compiler" -print-file-name=libstdc++.so)"
    done
    readelf -d torch_ddp_lite/_C*.so | grep NEEDED | grep -E "stdc|nccl|cudart"
    echo "libstdc++ code copied in: $(nm -D --defined-only torch_ddp_lite/_C*.so | grep -c _ZNSo9_M_insertIlEERSoT_)"
    python3 -c "import torch_ddp_lite, json; print(json.dumps(torch_ddp_lite.build_info()['nccl'])); print(torch_ddp_lite.nccl_version())"
} 2>&1 | tee -a "$out/info.txt"

# GPU_CHECK_PYTEST: more pytest arguments, e.g. --maxfail=2 for a short run (details print at the end)
# shellcheck disable=SC2086
stage tests 240 tests.log python3 -m pytest tests/test_cuda.py -v -m "not slow" -p no:cacheprovider --timeout 100 \
    --tb short ${GPU_CHECK_PYTEST:-}
stage bench 90 bench.log python3 -m torch_ddp_lite.bench --device cuda --world-size 1 --backends ddplite,nccl \
    --ops all_reduce,broadcast,all_gather_into_tensor,reduce_scatter_tensor --sizes 8,1K,64K,1M,16M,256M \
    --time-per-point 0.2 --json "$out/gpu_ws1.json"
stage slow 150 slow.log python3 -m pytest tests/test_cuda.py -v -m slow -p no:cacheprovider --timeout 120
stage ddp 60 ddp.log python3 -m torch_ddp_lite.bench ddp --device cuda --world-size 1 --backends ddplite,nccl
echo "total $((SECONDS - start)) s"
