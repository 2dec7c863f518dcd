#!/usr/bin/env bash
# Times every ddplite CPU algorithm of allreduce (2 and 3 ranks), allgather and reduce_scatter
# (3 ranks) from 8 B to 2 MB with the benchmark tool, one pinned algorithm per run, and prints
# the markdown tables of docs/algorithms.md (median us per op; the fastest in bold).
#   OUT   folder for the JSON rows (default: runs/algorithms)
set -euo pipefail
OUT="${OUT:-runs/algorithms}"
mkdir -p "$OUT"
bench() {  # collective algorithm op world_size
  python -m torch_ddp_lite.bench --backends ddplite --algo "$1:$2" --ops "$3" -b 8 -e 4M -f 4 \
    --world-size "$4" --time-per-point 0.2 --rounds 3 --json "$OUT/$1_$4_$2.json" > /dev/null
}
for ws in 2 3; do
  for a in naive ring butterfly halving_doubling; do bench allreduce "$a" all_reduce "$ws"; done
done
for a in ring doubling; do bench allgather "$a" all_gather_into_tensor 3; done
for a in ring halving; do bench reduce_scatter "$a" reduce_scatter_tensor 3; done
python - "$OUT" <<'PY'
import json, sys
out = sys.argv[1]
def table(collective, algorithms, world_size):
    times = {}
    for algorithm in algorithms:
        for row in json.load(open(f"{out}/{collective}_{world_size}_{algorithm}.json")):
            times.setdefault(row["bytes"], {})[algorithm] = row["time_us"]
    print(f"\n{collective}, {world_size} ranks (us)\n\n| bytes | " + " | ".join(algorithms) + " |")
    print("|---:|" + "---:|" * len(algorithms))
    for size, by_algorithm in sorted(times.items()):
        best = min(by_algorithm.values())
        cells = [("**%.0f**" if by_algorithm[a] == best else "%.0f") % by_algorithm[a] for a in algorithms]
        print(f"| {size} | " + " | ".join(cells) + " |")
for world_size in (2, 3):
    table("allreduce", ["naive", "ring", "butterfly", "halving_doubling"], world_size)
table("allgather", ["ring", "doubling"], 3)
table("reduce_scatter", ["ring", "halving"], 3)
PY
