"""PyTorch's own distributed test suite as the oracle: every test of
DistributedTest._DistTestBase (collectives, p2p, DDP, subgroups, SyncBatchNorm, ...) run on CPU
against gloo and against ddplite, one pytest run per backend (tests/torch_suite_runner.py says
how the gloo-gated tests reach ddplite). Every test that passes on gloo must pass on ddplite,
except those listed in TORCH_REFUSES below with torch's own reason; a passing ddplite test must
also have run on ddplite on every rank (the runner's record). tests/test_torch_suite.py runs a
slice of this in CI; docs/parity.md has the latest figures.

    python scripts/torch_suite.py [--world-size 2] [-k EXPR] [--json docs/data/torch_suite_ws2.json]
    python scripts/torch_suite.py --world-size 4 --rerun-skipped docs/data/torch_suite_ws2.json  # what 2 ranks skip

About 25 minutes per backend at 2 ranks on 2 cores: each test spawns its ranks afresh.
Exit status 0 when ddplite passes everything gloo passes (less TORCH_REFUSES), else 1.
"""

import argparse
import datetime
import json
import os
import re
import shlex
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ElementTree

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RUNNER = os.path.join("tests", "torch_suite_runner.py")
BACKENDS = ("gloo", "ddplite")

# Tests that pass on gloo and cannot pass on a third-party backend, with torch's reason (the line
# of torch/testing/_internal/distributed/distributed_test.py or of torch.distributed that refuses).
TORCH_REFUSES = {
    "test_ddp_logging_data_cpu":
        "DDP's logger records ProcessGroup::getBackendName(), which is backendTypeToString(backendType_): "
        "'custom' for every backend registered with dist.Backend.register_backend "
        "(torch/csrc/distributed/c10d/ProcessGroup.hpp), while the test expects dist.get_backend(group) "
        "('ddplite'); the test stops at that assert",
}

# First match wins: a test belongs to the first area whose pattern it matches.
AREAS = [
    ("SyncBatchNorm", r"SyncBatchNorm|sync_bn"),
    ("DDP", r"ddp|DistributedDataParallel|DDP|accumulate_gradients|static_graph|localSGD|model_averager"
            r"|average_parameters|grads_same|output_unused|undefined_grad|different_graph|stateless_api"
            r"|skip_all_reduce|compute_bucket|verify_model|detect_ddp|invalid_static|get_data_parallel"),
    ("p2p", r"send|recv|isend|irecv"),
    ("subgroup", r"_group_|_group$|subgroup|destroy"),
    ("collective", r"all_reduce|all_gather|broadcast|reduce|scatter|gather|all_to_all|barrier|coalesc"),
    ("other", r""),
]


def area_of(test):
    return next(name for name, pattern in AREAS if re.search(pattern, test))


def run_backend(backend, world_size, select, workdir):
    """One pytest run of the suite on `backend`; returns {test: (outcome, message)} and records."""
    junit = os.path.join(workdir, f"{backend}.xml")
    record = os.path.join(workdir, f"{backend}.record")
    env = dict(os.environ, DDPLITE_SUITE_BACKEND=backend, WORLD_SIZE=str(world_size),
               DDPLITE_SUITE_RECORD=record, TEMP_DIR=tempfile.mkdtemp(prefix=f"suite-{backend}-", dir=workdir))
    command = [sys.executable, "-m", "pytest", RUNNER, "-q", "-p", "no:cacheprovider", f"--junitxml={junit}"]
    if select:
        command += ["-k", select]
    started = time.monotonic()
    log_path = os.path.join(workdir, f"{backend}.log")
    with open(log_path, "w") as log:
        subprocess.run(command, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT, check=False)
    elapsed = time.monotonic() - started
    outcomes = parse_junit(junit)
    ran = {}
    if os.path.exists(record):
        with open(record) as lines:
            for line in lines:
                test, rank, ran_on = line.split()
                ran.setdefault(test, set()).add((int(rank), ran_on))
    return outcomes, ran, elapsed


def parse_junit(path):
    outcomes = {}
    for case in ElementTree.parse(path).getroot().iter("testcase"):
        name = case.get("name")
        outcome, message = "passed", ""
        for tag in ("failure", "error", "skipped"):
            element = case.find(tag)
            if element is not None:
                outcome = "skipped" if tag == "skipped" else "failed"
                message = first_line_of_cause((element.get("message") or "") + "\n" + (element.text or ""))
                break
        outcomes[name] = (outcome, message)
    return outcomes


def first_line_of_cause(message):
    """The line that says why: a rank's exception ("AssertionError: ...") when a rank failed,
    else the first line."""
    lines = [line.strip() for line in message.splitlines() if line.strip()]
    for line in lines:
        line = re.sub(r"^E\s+", "", line)  # pytest's prefix in the failure's text
        if re.match(r"^[\w.]+(Error|Exception): ", line) and not line.startswith("RuntimeError: Process "):
            return line[:300]
    return lines[0][:300] if lines else ""


def compare(results, world_size):
    gloo, ours = results["gloo"]["outcomes"], results["ddplite"]["outcomes"]
    ran_on_ddplite = results["ddplite"]["ran"]
    rows, problems = [], []
    for test in sorted(set(gloo) | set(ours)):
        g, o = gloo.get(test, ("absent", "")), ours.get(test, ("absent", ""))
        row = {"test": test, "area": area_of(test), "gloo": g[0], "ddplite": o[0],
               "gloo_message": g[1], "ddplite_message": o[1]}
        if o[0] == "passed" and ran_on_ddplite.get(test) != {(r, "ddplite") for r in range(world_size)}:
            row["problem"] = f"passed, but the record shows it ran on {sorted(ran_on_ddplite.get(test, []))}"
        elif g[0] == "passed" and o[0] != "passed":
            if test in TORCH_REFUSES:
                row["torch_refuses"] = TORCH_REFUSES[test]
            else:
                row["problem"] = f"passes on gloo, {o[0]} on ddplite: {o[1]}"
        if "problem" in row:
            problems.append(row)
        rows.append(row)
    return rows, problems


def summary_table(rows):
    lines = ["| area | tests | pass on gloo | pass on ddplite | skipped on both | gloo passes, ddplite not |",
             "|---|---:|---:|---:|---:|---:|"]
    for area, _ in AREAS:
        mine = [row for row in rows if row["area"] == area]
        if not mine:
            continue
        lines.append(f"| {area} | {len(mine)} | {sum(r['gloo'] == 'passed' for r in mine)} | "
                     f"{sum(r['ddplite'] == 'passed' for r in mine)} | "
                     f"{sum(r['gloo'] == r['ddplite'] == 'skipped' for r in mine)} | "
                     f"{sum(r['gloo'] == 'passed' and r['ddplite'] != 'passed' for r in mine)} |")
    lines.append(f"| all | {len(rows)} | {sum(r['gloo'] == 'passed' for r in rows)} | "
                 f"{sum(r['ddplite'] == 'passed' for r in rows)} | "
                 f"{sum(r['gloo'] == r['ddplite'] == 'skipped' for r in rows)} | "
                 f"{sum(r['gloo'] == 'passed' and r['ddplite'] != 'passed' for r in rows)} |")
    return "\n".join(lines)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--world-size", type=int, default=2)
    parser.add_argument("-k", dest="select", default="", help="pytest -k expression (default: every test)")
    parser.add_argument("--rerun-skipped", default="", metavar="JSON",
                        help="run only the tests that gloo skipped for their world size in this earlier --json")
    parser.add_argument("--json", default="", help="write every test's outcome on both backends here")
    parser.add_argument("--keep", action="store_true", help="keep the pytest logs (their folder is printed)")
    options = parser.parse_args()
    import torch

    if options.rerun_skipped:
        with open(options.rerun_skipped) as earlier:
            rows = json.load(earlier)["tests"]
        names = [row["test"] for row in rows if row["gloo"] == "skipped" and "world size" in row["gloo_message"]]
        options.select = " or ".join(names)

    workdir = tempfile.mkdtemp(prefix="ddplite-torch-suite-")
    results = {}
    for backend in BACKENDS:
        outcomes, ran, elapsed = run_backend(backend, options.world_size, options.select, workdir)
        results[backend] = {"outcomes": outcomes, "ran": ran, "seconds": round(elapsed)}
        counts = {k: sum(1 for o, _ in outcomes.values() if o == k) for k in ("passed", "failed", "skipped")}
        print(f"{backend}: {counts['passed']} passed, {counts['failed']} failed, {counts['skipped']} skipped "
              f"in {elapsed / 60:.1f} min", flush=True)
    rows, problems = compare(results, options.world_size)
    print(summary_table(rows))
    for row in rows:
        if "torch_refuses" in row:
            print(f"  torch refuses ddplite: {row['test']}: {row['torch_refuses']}")
    for row in problems:
        print(f"  DIFFERS: {row['test']}: {row['problem']}")
    if not problems:
        print("ddplite passes every test that gloo passes" + (" (less those torch refuses)" if TORCH_REFUSES else ""))
    if options.json:
        with open(options.json, "w") as out:
            json.dump({"command": "python scripts/torch_suite.py " + shlex.join(sys.argv[1:]),
                       "date": datetime.date.today().isoformat(), "torch": torch.__version__,
                       "world_size": options.world_size,
                       "minutes": {b: round(results[b]["seconds"] / 60, 1) for b in BACKENDS},
                       "summary": summary_table(rows), "tests": rows}, out, indent=1)
            out.write("\n")
    if options.keep:
        print(f"logs: {workdir}")
    else:
        import shutil
        shutil.rmtree(workdir, ignore_errors=True)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
