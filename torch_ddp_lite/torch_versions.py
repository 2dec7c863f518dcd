"""The torch releases torch-ddp-lite builds and is tested with: the one list every script reads.

Imported by the package (a clear error on an unsupported torch), run as a script by
scripts/setup.sh (which torch to install or keep), scripts/torch_matrix.sh and
scripts/torch_compile_check.py. It imports nothing, so it runs before torch is installed.

    python3 torch_ddp_lite/torch_versions.py newest          # 2.15.0
    python3 torch_ddp_lite/torch_versions.py torchvision 2.15.0
    python3 torch_ddp_lite/torch_versions.py supported 2.13.0+cu130   # exit 0 if supported
    python3 torch_ddp_lite/torch_versions.py decide 2.13.0+cu130 ""   # keep 2.13.0 (setup.sh's choice)
    python3 torch_ddp_lite/torch_versions.py all             # one release per minor, oldest first
    python3 torch_ddp_lite/torch_versions.py between         # all but the oldest and the newest
"""
import sys

# One tested release per minor version, oldest first, with the torchvision built for it
# (torchvision's wheels pin torch: 0.23.0 needs torch==2.8.0; 0.29.2 needs torch>=2.14).
TESTED = {
    "2.8.0": "0.23.0",
    "2.9.1": "0.24.1",
    "2.10.0": "0.25.0",
    "2.11.0": "0.26.0",
    "2.12.1": "0.27.1",
    "2.13.0": "0.28.0",
    "2.14.1": "0.29.1",
    "2.15.0": "0.29.2",
}
# Other patch releases of a supported minor version, with their torchvision.
OTHER_PATCHES = {"2.9.0": "0.24.0", "2.12.0": "0.27.0", "2.14.0": "0.29.0"}

# What torch-ddp-lite serves only from some torch release on (the C++ side keys the same
# differences on torch's version macros: csrc/common/compat.hpp). On an older torch the feature is
# refused with the release that has it (torch_ddp_lite.torch_has / require_torch).
FEATURES = {
    "split": ((2, 9), "dist.split_group on a ddplite group (torch's Backend.split)"),
    "shrink": ((2, 10), "dist.shrink_group (torch's Backend.shrink)"),
    "group_desc": ((2, 11), "the group description in flight-recorder dumps"),
    "split_keeps_order": ((2, 14), "split_group numbering ranks in the caller's order (earlier: sorted)"),
    "options_clone": ((2, 14), "Backend.Options.clone()"),
    "monitored_barrier_any_backend": ((2, 14), "dist.monitored_barrier on a ddplite group (earlier: torch_ddp_lite.monitored_barrier)"),
    "torch_flight_recorder_hook": ((2, 15), "torch's FlightRecorderHook on third-party backends"),
}

OLDEST = next(iter(TESTED))
NEWEST = list(TESTED)[-1]
SUPPORTED_MINORS = sorted({tuple(int(x) for x in v.split(".")[:2]) for v in TESTED})


def release(version):
    """'2.15.0+cu132' -> (2, 15, 0); pre-releases and local labels are cut off."""
    core = version.split("+")[0]
    parts = []
    for piece in core.split(".")[:3]:
        digits = ""
        for ch in piece:
            if not ch.isdigit():
                break
            digits += ch
        parts.append(int(digits or 0))
    while len(parts) < 3:
        parts.append(0)
    return tuple(parts)


def is_supported(version):
    """True when the major.minor of ``version`` is one torch-ddp-lite builds and tests."""
    return release(version)[:2] in SUPPORTED_MINORS


def has(feature, version):
    """True when torch ``version`` has ``feature`` (a key of FEATURES)."""
    return release(version)[:2] >= FEATURES[feature][0]


def first_with(feature):
    """'2.9' for 'split': the first torch release that has ``feature``."""
    major, minor = FEATURES[feature][0]
    return f"{major}.{minor}"


def torchvision_for(version):
    """The torchvision release that matches a torch release, or None when none is known."""
    core = ".".join(str(x) for x in release(version))
    return TESTED.get(core) or OTHER_PATCHES.get(core)


def supported_range():
    lo, hi = SUPPORTED_MINORS[0], SUPPORTED_MINORS[-1]
    return f"{lo[0]}.{lo[1]} to {hi[0]}.{hi[1]}"


def decide(installed, requested):
    """What scripts/setup.sh does about torch: ("keep", version), ("install", version) or
    ("refuse", reason). `installed`: the installed torch's version or "" for none; `requested`:
    TORCH_VERSION or "". An installed supported torch is never replaced unless a release is
    requested; an unsupported one is refused rather than replaced."""
    if requested:
        if not is_supported(requested):
            return "refuse", f"TORCH_VERSION={requested} is not a release torch-ddp-lite supports ({supported_range()})"
        if installed and release(installed) == release(requested):
            return "keep", installed.split("+")[0]
        return "install", requested.split("+")[0]  # PyPI's wheels carry no local label
    if installed:
        if not is_supported(installed):
            return "refuse", f"torch {installed} is installed, but torch-ddp-lite supports torch {supported_range()} only"
        return "keep", installed.split("+")[0]
    return "install", NEWEST


def main(argv):
    command = argv[1] if len(argv) > 1 else "all"
    if command == "newest":
        print(NEWEST)
    elif command == "oldest":
        print(OLDEST)
    elif command == "all":
        print(" ".join(TESTED))
    elif command == "between":  # all but the oldest and the newest
        print(" ".join(list(TESTED)[1:-1]))
    elif command == "range":
        print(supported_range())
    elif command == "torchvision":
        found = torchvision_for(argv[2])
        if found is None:
            return 1
        print(found)
    elif command == "supported":
        return 0 if is_supported(argv[2]) else 1
    elif command == "decide":  # decide <installed or ""> <requested or "">
        action, what = decide(argv[2], argv[3])
        print(f"{action} {what}")
        return 0 if action != "refuse" else 1
    else:
        print(__doc__, file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
