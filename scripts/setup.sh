#!/usr/bin/env bash
# Installs what torch-ddp-lite needs and builds the extension, idempotently: a second run only
# checks (a few seconds). Run by scripts/train.sh, scripts/test.sh and scripts/torch_slice.sh.
#   TORCH_VERSION   the torch to install, replacing the one installed (default: keep an installed
#                   torch that torch-ddp-lite supports; install the newest tested one where there
#                   is none). Supported and tested: torch_ddp_lite/torch_versions.py.
#   PYTHON          interpreter to use (default: python3)
set -euo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PYTHON="${PYTHON:-python3}"
cd "$REPO"
# A stale editable install (a moved or deleted checkout) leaves an entry point whose module is
# gone, and torch then fails at import. Nothing here needs the autoload, so switch it off.
export TORCH_DEVICE_BACKEND_AUTOLOAD=0

say() { echo "[setup] $*"; }
versions() { "$PYTHON" "$REPO/torch_ddp_lite/torch_versions.py" "$@"; }

# 1. torch: never replaced unless TORCH_VERSION asks for it. The CUDA build from PyPI is fine
#    (the CPU path needs no GPU).
installed_torch=$("$PYTHON" -c "import importlib.metadata as m; print(m.version('torch'))" 2>/dev/null || true)
decision=$(versions decide "$installed_torch" "${TORCH_VERSION:-}") || true
want_torch="${decision#* }"
case "$decision" in
  keep\ *) say "torch $installed_torch present (kept)" ;;
  install\ *)
    say "installing torch==$want_torch${installed_torch:+ (replacing torch $installed_torch, as TORCH_VERSION asks)}"
    "$PYTHON" -m pip install --quiet --disable-pip-version-check "torch==$want_torch" ;;
  refuse\ *)
    say "${decision#refuse }."
    say "Either install a supported torch into this environment${installed_torch:+ (this replaces torch $installed_torch)}:"
    say "    TORCH_VERSION=$(versions newest) bash scripts/setup.sh"
    say "or keep it and use a virtual environment of its own:"
    say "    python3 -m venv ~/venv-ddplite && PYTHON=~/venv-ddplite/bin/python bash scripts/setup.sh"
    exit 1 ;;
  *) say "could not decide which torch to use (torch_ddp_lite/torch_versions.py failed)"; exit 1 ;;
esac
# Every later install is constrained to this torch, so that no package's requirement replaces it.
constraints="$(mktemp)"
trap 'rm -f "$constraints"' EXIT
echo "torch==$("$PYTHON" -c "import importlib.metadata as m; print(m.version('torch'))")" > "$constraints"

# 1a. The other Python packages: install only what is missing.
missing=$("$PYTHON" - "$want_torch" "$(versions torchvision "$want_torch" || true)" <<'PY'
import importlib.metadata as md, sys
# torchvision must match torch (torch_versions.py); the others are for the example, plots and tests.
want = {"torchvision": sys.argv[2] or None, "numpy": None, "pytest": None,
        "ninja": None, "wheel": None, "build": None, "tqdm": None, "matplotlib": None, "hypothesis": None,
        "expecttest": None,  # expecttest: torch's own distributed test suite imports it (tests/torch_suite_runner.py)
        "torchft": "0.2.0",  # torchft (pinned: its process-group API moves): the optional extra torch_ddp_lite.torchft serves (tests/test_torchft.py)
        "parameterized": None,  # torchft's own test modules import it (tests/torchft_suite_runner.py runs them on ddplite)
        "accelerate": "1.15.0", "lightning": "2.6.6"}  # the trainers' recipes (examples/, tests/test_recipes.py)
out = []
for name, version in want.items():
    try:
        have = md.version(name)
        if version and have.split("+")[0] != version:
            out.append(f"{name}=={version}")
    except md.PackageNotFoundError:
        out.append(f"{name}=={version}" if version else name)
try:
    major, minor = (int(x) for x in md.version("setuptools").split(".")[:2])
    if not (70 <= major < 82):
        out.append("setuptools>=70,<82")
except md.PackageNotFoundError:
    out.append("setuptools>=70,<82")
print(" ".join(out))
PY
)
if [ -n "$missing" ]; then
  say "installing: $missing"
  "$PYTHON" -m pip install --quiet --disable-pip-version-check -c "$constraints" $missing
else
  say "python packages present"
fi

# 1b. iproute2: tests/test_multihost.py builds its "hosts" with `ip netns` (and skips without it).
if ! command -v ip >/dev/null 2>&1 && command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
  say "installing iproute2 (ip netns, for tests/test_multihost.py)"
  { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq iproute2 >/dev/null; } \
    || say "could not install iproute2: tests/test_multihost.py will be skipped"
fi

# 2. Open MPI (mpirun, and the headers the extension's MPI support compiles against), from
#    Debian's packages; skipped when present or when DDPLITE_WITH_MPI=0. Without it the
#    extension still builds, and only mpi:// and DDPLITE_CPU_TRANSPORT=mpi are unavailable.
if [ "${DDPLITE_WITH_MPI:-1}" != "0" ]; then
  if command -v mpirun >/dev/null 2>&1 && command -v mpicxx >/dev/null 2>&1; then
    say "Open MPI present ($(mpirun --version 2>/dev/null | head -n 1))"
  elif command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = "0" ]; then
    say "installing Open MPI (apt-get: libopenmpi-dev openmpi-bin)"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q libopenmpi-dev openmpi-bin >/dev/null 2>&1 \
      || { apt-get update -q >/dev/null 2>&1 \
           && DEBIAN_FRONTEND=noninteractive apt-get install -y -q libopenmpi-dev openmpi-bin >/dev/null; } \
      || say "could not install Open MPI: building without MPI (tests/test_mpi.py will skip)"
  else
    say "Open MPI missing and cannot be installed here (needs root and apt-get): building without MPI"
  fi
fi

# 2b. Slurm and munge (Debian's slurmd, slurmctld, slurm-client, munge): tests/test_slurm.py runs a
#     real two-node cluster in namespaces (and skips without them). Nothing is started here.
if ! command -v slurmd >/dev/null 2>&1 || ! command -v munged >/dev/null 2>&1; then
  if command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = "0" ]; then
    say "installing Slurm and munge (apt-get: slurmd slurmctld slurm-client munge; for tests/test_slurm.py)"
    { DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends slurmd slurmctld slurm-client munge \
        >/dev/null 2>&1 \
      || { apt-get update -q >/dev/null 2>&1 && DEBIAN_FRONTEND=noninteractive apt-get install -y -q \
             --no-install-recommends slurmd slurmctld slurm-client munge >/dev/null; }; } \
      || say "could not install Slurm: tests/test_slurm.py will be skipped"
  else
    say "Slurm missing and cannot be installed here (needs root and apt-get): tests/test_slurm.py will be skipped"
  fi
else
  say "Slurm present ($(slurmd -V 2>/dev/null))"
fi

# 3. The extension: rebuilt only when its sources, build files, torch, MPI or a DDPLITE_WITH_* changed.
stamp_file="$REPO/build/.ddplite-build-stamp"
stamp=$( { cat setup.py pyproject.toml _ddplite_autoload.py; find csrc -type f | sort | xargs cat;
           "$PYTHON" -c "import torch; print(torch.__version__)"; command -v mpicxx || true;
           echo "${DDPLITE_WITH_MPI:-1} ${DDPLITE_WITH_NCCL:-1} ${DDPLITE_WITH_PCH:-1}"; } | sha256sum | cut -d' ' -f1)
# The install must also be this checkout's: an editable install made from another path (a moved
# or re-cloned checkout) imports from there, or fails in torch's autoload of `_ddplite_autoload`.
# So the check imports torch with its autoload on, from outside the checkout.
installed_here() {
  (cd / && TORCH_DEVICE_BACKEND_AUTOLOAD=1 "$PYTHON" -c "
import os, sys, torch, torch_ddp_lite
sys.exit(0 if os.path.realpath(torch_ddp_lite.__file__).startswith(os.path.realpath(sys.argv[1]) + os.sep) else 1)
" "$REPO") >/dev/null 2>&1
}
if [ -f "$stamp_file" ] && [ "$(cat "$stamp_file")" = "$stamp" ] && installed_here; then
  say "extension up to date"
else
  say "building the extension against torch $("$PYTHON" -c 'import torch; print(torch.__version__)') (about 6 minutes on 2 cores the first time; later builds recompile only what changed)"
  MAX_JOBS="${MAX_JOBS:-2}" "$PYTHON" -m pip install --quiet --disable-pip-version-check \
    --no-build-isolation --no-deps -e "$REPO"
  mkdir -p "$(dirname "$stamp_file")"
  echo "$stamp" > "$stamp_file"
  "$PYTHON" -c "import torch_ddp_lite; print('[setup] built torch_ddp_lite', torch_ddp_lite.__version__)"
fi
