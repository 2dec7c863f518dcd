"""Teardown soak (tests/test_teardown.py runs a slice in CI): `--runs` jobs of init ->
mixed ops (coalesced and plain send/recv, a gloo subgroup, a ddplite subgroup, shared memory and
TCP, ops left in flight) -> destroy_process_group (or none) -> exit, at 2-4 ranks, under CPU
stress (one busy process per core). Every rank must be gone within 2 s of finishing its ops
(a fresh interpreter: 2 s beyond the exit of a bare one, the same imports and no group, started
beside it: torch's own interpreter shutdown takes 1-2 s here) and exit with code 0; a rank still alive after 10 s is a hang, and its native stacks (gdb) go to
`--stacks`. The job layouts rotate: world size 2, 3, 4; shared memory, TCP; destroy on three runs
of four; every `--fresh-every`th run starts fresh interpreters (they exit through interpreter
shutdown and C++ static destructors), the others fork from a preloaded forkserver.

    python scripts/teardown_soak.py [--runs 1000] [--no-stress] [--fresh-every 10] [--json out.json]
"""

import argparse
import json
import multiprocessing
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests"))

import teardown_workers  # noqa: E402

SLOW_EXIT_S = 2.0


def spread(values):
    values = sorted(values)
    if not values:
        return None
    return {"n": len(values), "median": round(values[len(values) // 2], 3),
            "p99": round(values[int(len(values) * 0.99)], 3), "max": round(values[-1], 3)}


def burn():
    while True:
        pass


def layout(index, fresh_every):
    world_size = 2 + index % 3
    transport = ("shm", "tcp")[(index // 3) % 2]
    teardown = "none" if index % 4 == 3 else "destroy"
    start = "fresh" if fresh_every and index % fresh_every == fresh_every - 1 else "forked"
    return world_size, transport, teardown, start


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=1000)
    parser.add_argument("--fresh-every", type=int, default=10, help="every Nth run starts fresh interpreters (0: none)")
    parser.add_argument("--no-stress", action="store_true", help="no busy processes beside the ranks")
    parser.add_argument("--stacks", default="teardown-stacks", help="folder for the stacks of hung ranks")
    parser.add_argument("--json", help="write the summary here")
    options = parser.parse_args()
    burners = []
    if not options.no_stress:
        context = multiprocessing.get_context("fork")
        burners = [context.Process(target=burn, daemon=True) for _ in range(os.cpu_count() or 1)]
        for burner in burners:
            burner.start()
    started = time.monotonic()
    exits, fresh_exits, baselines, slow, aborts, hangs, failures = [], [], [], [], [], [], []
    store_races = []  # jobs whose file torch's ~FileStore race left (teardown_workers.store_destructor_incomplete)
    try:
        for index in range(options.runs):
            world_size, transport, teardown, start = layout(index, options.fresh_every)
            outcome = teardown_workers.run_once(world_size, transport, teardown, start)
            name = f"run {index} ({world_size} ranks, {transport}, {teardown}, {start})"
            if start == "fresh" and outcome["baseline"] is not None:
                baselines.append(outcome["baseline"])
            for rank, seconds in enumerate(outcome["exits"]):
                if seconds is None:
                    continue
                beyond = seconds - (outcome["baseline"] or 0.0)  # forked: 0; fresh: a bare interpreter's exit
                (fresh_exits if start == "fresh" else exits).append(beyond)
                if beyond > SLOW_EXIT_S:
                    slow.append(f"{name} rank {rank}: {seconds:.2f} s, {beyond:.2f} s beyond the bare interpreter's")
            aborts += [f"{name} rank {rank}: exit {outcome['codes'][rank]}" for rank in outcome["aborts"]]
            failures += [f"{name}: {error[-2000:]}" for error in outcome["errors"]]
            failures += [f"{name} rank {rank}: checks failed {names}" for rank, names in outcome["checks_failed"]]
            if teardown == "destroy" and outcome["store_destructor_incomplete"]:
                failures.append(f"{name}: the file:// store's file shows a ~FileStore cut short or never run")
            elif teardown == "destroy" and outcome["store_file_left"]:
                store_races.append(name)  # every ~FileStore ran to its end: torch's own race left the file
            for rank, stacks in outcome["hung"].items():
                os.makedirs(options.stacks, exist_ok=True)
                path = os.path.join(options.stacks, f"run{index}-rank{rank}.txt")
                with open(path, "w") as file:
                    file.write(stacks)
                hangs.append(f"{name} rank {rank}: stacks in {path}")
            if (index + 1) % 50 == 0 or outcome["hung"] or outcome["aborts"]:
                print(f"[{time.monotonic() - started:6.0f} s] {index + 1} runs; slowest exit "
                      f"{max(exits + fresh_exits, default=0):.2f} s; {len(slow)} slow, {len(aborts)} aborts, "
                      f"{len(hangs)} hangs, "
                      f"{len(failures)} failures", flush=True)
    finally:
        for burner in burners:
            burner.kill()
    summary = {
        "runs": options.runs, "rank_exits": len(exits) + len(fresh_exits), "stress_processes": len(burners),
        "forked_exit_s": spread(exits),
        "fresh_exit_beyond_bare_s": spread(fresh_exits),
        "bare_interpreter_exit_s": spread(baselines),
        "slow_exits": slow, "aborts": aborts, "hangs": hangs, "failures": failures[:50], "store_file_races": store_races,
        "seconds": round(time.monotonic() - started),
    }
    print(json.dumps(summary, indent=1))
    if options.json:
        with open(options.json, "w") as file:
            json.dump(summary, file, indent=1)
    return 1 if slow or aborts or hangs or failures else 0


if __name__ == "__main__":
    sys.exit(main())
