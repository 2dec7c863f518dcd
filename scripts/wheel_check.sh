#!/usr/bin/env bash
# Builds the wheel against the installed torch and proves it works without this checkout or a
# compiler: `python -m build --wheel --no-isolation` (it reuses build/'s objects of an earlier
# setup), then a fresh virtual environment that has only that torch (this interpreter's
# site-packages as a plain path: its .pth files, e.g. this checkout's editable install, stay out),
# `pip install --no-index` of the wheel, and tests/wheel_job.py there with PATH holding the venv's
# bin/ alone: a 2-rank all_reduce and a DDP step, each against its closed form.
#   bash scripts/wheel_check.sh [outdir]    # default: a temporary folder, removed afterwards
# Prints the wheel's name and the job's JSON; exit 0 when both are right.
set -euo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PYTHON="${PYTHON:-python3}"
if [ $# -ge 1 ]; then OUT="$1"; mkdir -p "$OUT"; else OUT="$(mktemp -d)"; trap 'rm -rf "$OUT"' EXIT; fi
torch_mm=$("$PYTHON" -c "import torch; print('.'.join(torch.__version__.split('.')[:2]))")

rm -rf "$OUT/dist" "$OUT/venv"
MAX_JOBS="${MAX_JOBS:-2}" "$PYTHON" -m build --wheel --no-isolation --outdir "$OUT/dist" "$REPO" > "$OUT/build.log" 2>&1 \
  || { tail -n 30 "$OUT/build.log"; exit 1; }
wheel=$(ls "$OUT"/dist/*.whl)
echo "wheel: $(basename "$wheel")"
case "$(basename "$wheel")" in
  *"+torch$torch_mm-"*) ;;
  *) echo "the wheel's name does not carry torch $torch_mm as its local version label"; exit 1 ;;
esac

"$PYTHON" -m venv "$OUT/venv"
host_site=$("$PYTHON" -c "import os, torch; print(os.path.dirname(os.path.dirname(torch.__file__)))")
venv_site=$("$OUT/venv/bin/python" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
echo "$host_site" > "$venv_site/zz-host-torch.pth"
# --no-deps: torch and numpy are there through the path; the wheel's torch requirement is checked below.
"$OUT/venv/bin/python" -m pip install --quiet --no-index --no-deps "$wheel"
cp "$REPO/tests/wheel_job.py" "$OUT/wheel_job.py"
cd "$OUT"
env -i HOME="$OUT" PATH="$OUT/venv/bin" TORCH_DEVICE_BACKEND_AUTOLOAD=1 "$OUT/venv/bin/python" wheel_job.py | tee "$OUT/job.json"
env -i HOME="$OUT" PATH="$OUT/venv/bin" "$OUT/venv/bin/python" - "$OUT/job.json" "$venv_site" <<'PY'
import json, sys
job = json.load(open(sys.argv[1]))
assert job["ok"], job
assert job["package"].startswith(sys.argv[2]), f"torch_ddp_lite came from {job['package']}, not the wheel"
from importlib.metadata import requires
torch_release = ".".join(job["torch"].split("+")[0].split(".")[:2])
import re
wanted = [r.replace(" ", "") for r in requires("torch-ddp-lite") if re.match(r"torch\s*[=<>!~]", r)]
assert wanted == [f"torch=={torch_release}.*"], f"the wheel requires {wanted}, not torch=={torch_release}.*"
print(f"wheel works: torch_ddp_lite {job['version']} (built against torch {job['built_torch']}) from the venv")
PY
