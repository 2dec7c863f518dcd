"""mpirun: the mpi:// rendezvous, env:// under MPI launchers and Slurm, MPI as the set-up
broadcast, and MPI's collectives as a CPU data path (DDPLITE_CPU_TRANSPORT=mpi), against the
closed form and gloo on identical inputs (tests/mpi_job.py runs inside the job)."""

import os
import shutil
import socket
import subprocess
import sys
import time

import pytest
import torch

import torch_ddp_lite
import sweeps
import workers
from harness import RankFailed, mpirun_environment, run_ranks
from tiers import exhaustive

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
MPIRUN = shutil.which("mpirun")
MPI_BUILT = torch_ddp_lite.build_info()["mpi"]

needs_mpirun = pytest.mark.skipif(MPIRUN is None or not MPI_BUILT,
                                  reason="needs mpirun and ddplite built with MPI (scripts/setup.sh installs both)")


def mpirun(mode, ranks, out_dir, transport="tcp", timeout_s=300, **env):
    """Runs tests/mpi_job.py under mpirun (with `env` passed to every rank); returns every rank's
    result."""
    exported = [arg for name in ("DDPLITE_CPU_TRANSPORT", *env) for arg in ("-x", name)]
    command = [MPIRUN, "--bind-to", "none", *exported, "-np", str(ranks), sys.executable,
               os.path.join(HERE, "mpi_job.py"), mode, str(out_dir)]
    completed = subprocess.run(command, env=mpirun_environment(DDPLITE_CPU_TRANSPORT=transport, **env),
                               capture_output=True, text=True, timeout=timeout_s)
    assert completed.returncode == 0, f"mpirun failed ({completed.returncode}):\n{completed.stdout}\n{completed.stderr}"
    return [torch.load(out_dir / f"rank{rank}.pt", weights_only=False) for rank in range(ranks)]


def test_mpi_is_compiled_in_where_mpirun_exists():
    """Guards the skips below: on a machine set up by scripts/setup.sh they must run."""
    if MPIRUN is None:
        pytest.skip("no mpirun on this machine")
    info = torch_ddp_lite.build_info()
    assert info["mpi"], "mpirun is installed but ddplite was built without MPI: rerun scripts/setup.sh"
    assert info["mpi_library"].startswith(("Open MPI", "MPICH")), info
    assert info["mpi_standard"] >= "3.0", info


@needs_mpirun
@pytest.mark.parametrize("transport,ranks", [("mpi", 1), exhaustive("mpi", 2), ("mpi", 3), ("mpi", 4),
                                             ("tcp", 2), exhaustive("tcp", 3)])
def test_mpirun_collectives_match_closed_form_and_gloo(tmp_path, transport, ranks):
    results = mpirun("sweeps", ranks, tmp_path, transport)
    for rank, result in enumerate(results):
        assert (result["rank"], result["size"]) == (rank, ranks)
        assert (result["transport"], result["bootstrap"]) == (transport, "mpi")
        assert result["shared"] == f"set-up blob from rank 0 of {ranks}"
        for name, sweep in result["sweeps"].items():
            assert sweep["failures"] == [], f"{name}: " + "\n".join(sweep["failures"][:10])
            assert sweep["checked"] >= len(workers.DTYPES) * 4, (name, sweep["checked"])
        assert sum(sweep["gloo_refused"] for sweep in result["sweeps"].values()) < result["sweeps"]["allreduce"]["checked"]
        for name, sweep in result["extra dtypes"].items():  # int16, uint16/32/64, float8 (moved only)
            assert sweep["failures"] == [], f"{name}: " + "\n".join(sweep["failures"][:10])
            assert sweep["checked"] >= len(sweeps.extra_dtypes(name)) * 4, (name, sweep["checked"])


@needs_mpirun
@pytest.mark.parametrize("transport,ranks", [("mpi", 1), exhaustive("mpi", 2), ("tcp", 2), exhaustive("mpi", 3),
                                             ("mpi", 4), exhaustive("tcp", 4)])
def test_mpirun_ddp_matches_gloo(tmp_path, transport, ranks):
    results = mpirun("ddp", ranks, tmp_path, transport)
    reference = workers.single_process_train(world_size=ranks, steps=8)
    for result in results:
        assert result["transport"] == transport
        for name, expected in result["gloo"].items():
            torch.testing.assert_close(result["ddplite"][name], expected, rtol=1e-5, atol=1e-6, msg=name)
            torch.testing.assert_close(result["ddplite"][name], reference[name], rtol=1e-5, atol=1e-6, msg=name)
        assert all(torch.equal(result["ddplite"][n], results[0]["ddplite"][n]) for n in reference)
    untouched = dict(workers.make_cnn(seed=0).named_parameters())
    assert any(not torch.allclose(results[0]["ddplite"][n], untouched[n]) for n in untouched)


@needs_mpirun
@pytest.mark.parametrize("ranks", [3, 4])
def test_mpi_transport_on_overlapping_subgroups(tmp_path, ranks):
    """A communicator per group (MPI_Comm_create_group), async ops in flight on two at once."""
    results = mpirun("groups", ranks, tmp_path, "mpi")
    for rank, result in enumerate(results):
        assert result["failures"] == [], result["failures"]
        if rank >= 1:
            assert (result["subgroup transport"], result["subgroup bootstrap"]) == ("mpi", "mpi")


@needs_mpirun
@pytest.mark.parametrize("transport", ["tcp", "mpi"])
def test_env_rendezvous_under_mpirun_needs_nothing_set(tmp_path, transport):
    results = mpirun("env", 3, tmp_path, transport)
    for rank, result in enumerate(results):
        assert (result["rank"], result["size"], result["transport"]) == (rank, 3, transport)
        assert torch.equal(result["sum"], torch.full((5,), 6.0))


@needs_mpirun
@pytest.mark.parametrize("transport", ["tcp", "mpi"])
def test_rank_missing_from_a_collective_fails_within_the_timeout(tmp_path, transport):
    results = mpirun("stall", 2, tmp_path, transport, timeout_s=120)
    assert results[1]["raised"] is None
    failure = results[0]
    assert failure["raised"] == "DistBackendError", failure
    assert "ddplite rank 0/2, allreduce #2" in failure["message"] and "Hint:" in failure["message"]
    assert "Timed out" in failure["message"], failure  # gloo's phrase, on both data paths
    assert 4.5 < failure["seconds"] < 30, failure


@needs_mpirun
def test_stragglers_and_the_status_query_on_the_mpi_data_path(tmp_path):
    """DDPLITE_CPU_TRANSPORT=mpi (MPI's own collectives), mpi:// rendezvous, 4 ranks, rank 3 30%
    slower per step: stragglers() names it first on every rank, and the status query, asked at
    rank 0's store, gets every rank's answer, with ranks 1-3 waiting in the barrier rank 0 has not
    reached. MASTER_PORT set: rank 0's mpi:// store listens there, for the tool to be pointed at."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    results = mpirun("health", 4, tmp_path, "mpi", MASTER_PORT=str(port))
    for result in results:
        assert result["transport"] == "mpi", result
        assert result["rows"] == results[0]["rows"], "every rank gets the same table"
        assert result["rows"][0][0] == 3 and 0.55 < result["rows"][0][2] < 0.92, result["text"]
    asked = results[0]["status"]
    assert asked["port"] == port and asked["code"] == 0, asked
    report = asked["report"]
    assert [entry["outcome"] for entry in report["ranks"]] == ["answered"] * 4, report
    waiting = {entry["rank"]: entry["state"]["groups"][0]["running"] for entry in report["ranks"]}
    assert waiting[0] is None and all(waiting[r]["op"] == "barrier" for r in (1, 2, 3)), waiting
    assert report["stalled"]["not_arrived"] == [0], report["stalled"]
    assert report["stragglers"][0]["rank"] == 3, report["stragglers"]


# ---- without mpirun -----------------------------------------------------------------------------

def run_python(code, env_overrides, timeout_s=120):
    env = mpirun_environment()
    for name in [n for n in env if n.startswith(("OMPI_", "PMI_", "PMIX_", "SLURM_"))]:
        del env[name]
    env.update(env_overrides)
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=timeout_s)


INIT_DEFAULT = "import torch.distributed as dist; dist.init_process_group('ddplite'); print('ok', dist.get_rank(), dist.get_world_size())"


def test_slurm_variables_without_master_address_list_what_is_missing():
    # Rank variables alone, without a step's node list or a job id (tests/test_launch_env.py: a real step's).
    started = time.monotonic()
    completed = run_python(INIT_DEFAULT, {"SLURM_PROCID": "0", "SLURM_NTASKS": "2", "SLURM_LOCALID": "0"})
    assert completed.returncode != 0
    assert "ValueError: ddplite env:// rendezvous: launched by Slurm (srun) (rank 0 of 2 from SLURM_PROCID/SLURM_NTASKS)" \
        in completed.stderr, completed.stderr
    assert "MASTER_ADDR and MASTER_PORT are not set" in completed.stderr
    assert "Hint: run the tasks with srun, which sets SLURM_STEP_NODELIST and SLURM_JOB_ID" in completed.stderr
    assert time.monotonic() - started < 60


def test_slurm_variables_with_master_address_give_rank_and_size():
    completed = run_python(INIT_DEFAULT, {"SLURM_PROCID": "0", "SLURM_NTASKS": "1", "MASTER_ADDR": "127.0.0.1",
                                          "MASTER_PORT": str(29500 + os.getpid() % 1000)})
    assert completed.returncode == 0, completed.stderr
    assert completed.stdout.split() == ["ok", "0", "1"]


def test_torch_variables_keep_torch_behaviour():
    """RANK/WORLD_SIZE set: ddplite's env:// hands over to torch's handler untouched (its error)."""
    completed = run_python(INIT_DEFAULT, {"RANK": "0", "WORLD_SIZE": "1", "OMPI_COMM_WORLD_RANK": "0",
                                          "OMPI_COMM_WORLD_SIZE": "1"})
    assert completed.returncode != 0
    assert "MASTER_ADDR expected, but not set" in completed.stderr, completed.stderr


def test_mpi_rendezvous_without_mpi_says_how_to_rebuild():
    code = ("import torch_ddp_lite, torch.distributed as dist\n"
            "extension = torch_ddp_lite._load_extension()\n"
            "info = extension.build_info(); info['mpi'] = False\n"
            "extension.build_info = lambda: info  # what a build without MPI reports\n"
            "dist.init_process_group('ddplite', init_method='mpi://')\n")
    completed = run_python(code, {})
    assert completed.returncode != 0
    assert "RuntimeError: ddplite: init_method='mpi://' needs MPI, and this ddplite was built without it." \
        in completed.stderr, completed.stderr
    assert "apt-get install libopenmpi-dev openmpi-bin" in completed.stderr


def init_only(rank, world_size):
    return "initialised"


def test_unknown_cpu_transport_is_a_value_error():
    with pytest.raises(RankFailed) as failure:
        run_ranks(init_only, 2, env={"DDPLITE_CPU_TRANSPORT": "infiniband"})
    assert "ValueError: ddplite rank 0/2, init #0: DDPLITE_CPU_TRANSPORT='infiniband' is not a valid value; " \
        "use one of: auto (the default), tcp, mpi, shm" in str(failure.value)


@needs_mpirun
def test_mpi_transport_outside_one_mpi_job_is_refused():
    """Two processes started without mpirun are two MPI singletons, not one job."""
    with pytest.raises(RankFailed) as failure:
        run_ranks(init_only, 2, env={"DDPLITE_CPU_TRANSPORT": "mpi"}, timeout_s=120)
    message = str(failure.value)
    assert "DDPLITE_CPU_TRANSPORT=mpi, but the ranks of this group are not one MPI job" in message, message
    assert "the group's ranks report MPI ranks 0,0" in message
    assert "mpirun -np N" in message


@needs_mpirun
def test_benchmark_has_an_mpi_column(tmp_path):
    out = tmp_path / "rows.json"
    command = [MPIRUN, "--bind-to", "none", "-np", "2", sys.executable, "-m", "torch_ddp_lite.bench", "--backends",
               "ddplite,ddplite-mpi,gloo", "--ops", "all_reduce,all_gather_into_tensor", "-b", "8", "-e", "64K", "-f", "64",
               "--time-per-point", "0.02", "--json", str(out)]
    completed = subprocess.run(command, env=mpirun_environment(), capture_output=True, text=True, timeout=180)
    assert completed.returncode == 0, completed.stdout + completed.stderr
    assert "ddplite/ddplite-mpi" in completed.stdout
    import json
    rows = json.loads(out.read_text())
    for op in ("all_reduce", "all_gather_into_tensor"):
        for size in (8, 512, 32768):
            backends = {row["backend"]: row for row in rows if row["op"] == op and row["bytes"] == size}
            assert set(backends) == {"ddplite", "ddplite-mpi", "gloo"}, (op, size, backends)
            assert all(row["time_us"] > 0 and row["world_size"] == 2 for row in backends.values())


MPI_LESS_SCRIPT = """
import json, os, sys
from datetime import timedelta
import torch, torch.distributed as dist
import torch_ddp_lite
rank, world, folder = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
info = torch_ddp_lite.build_info()
out = {"file": torch_ddp_lite.__file__, "mpi": info["mpi"], "cpu_transports": info["cpu_transports"]}
dist.init_process_group("ddplite", init_method=f"file://{folder}/store", rank=rank, world_size=world,
                        timeout=timedelta(seconds=60))
t = torch.arange(5, dtype=torch.float32) * (rank + 1)
dist.all_reduce(t)
out["sum"] = t.tolist()
dist.destroy_process_group()
os.environ["DDPLITE_CPU_TRANSPORT"] = "mpi"
try:
    dist.init_process_group("ddplite", init_method=f"file://{folder}/store2", rank=rank, world_size=world,
                            timeout=timedelta(seconds=60))
    out["mpi_transport"] = "initialised"
except ValueError as error:
    out["mpi_transport"] = str(error)
print("RESULT " + json.dumps(out), flush=True)
"""


@pytest.mark.skipif(shutil.which("c++") is None, reason="needs a C++ compiler")
def test_extension_built_without_mpi_loads_runs_and_refuses_the_mpi_transport(tmp_path):
    """A real MPI-less build (tests/build_variants.py: the MPI sources recompiled without MPI,
    linked without -lmpi) loads, reports no MPI, runs a 2-rank all_reduce over TCP, and refuses
    DDPLITE_CPU_TRANSPORT=mpi with a ValueError that says how to rebuild."""
    import json

    import build_variants

    site, library = build_variants.without_mpi(str(tmp_path), torch_ddp_lite.build_info())
    needed = subprocess.run(["readelf", "-d", library], capture_output=True, text=True, check=True).stdout
    assert "libmpi" not in needed and "libtorch" in needed
    script = tmp_path / "job.py"
    script.write_text(MPI_LESS_SCRIPT)
    env = dict(os.environ, PYTHONPATH=site, TORCH_DEVICE_BACKEND_AUTOLOAD="0")
    env.pop("DDPLITE_CPU_TRANSPORT", None)
    ranks = [subprocess.Popen([sys.executable, str(script), str(rank), "2", str(tmp_path)], cwd=tmp_path, env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for rank in range(2)]
    outputs = [rank.communicate(timeout=180)[0] for rank in ranks]
    assert [rank.returncode for rank in ranks] == [0, 0], outputs
    for output in outputs:
        result = json.loads(output.split("RESULT ", 1)[1])
        assert result["file"].startswith(site)
        assert result["mpi"] is False and result["cpu_transports"] == ["tcp", "shm"]
        assert result["sum"] == [0.0, 3.0, 6.0, 9.0, 12.0]
        assert "DDPLITE_CPU_TRANSPORT=mpi, but this ddplite was built without MPI" in result["mpi_transport"]
        assert "libopenmpi-dev" in result["mpi_transport"]


@needs_mpirun
@pytest.mark.parametrize("transport,ranks", [("mpi", 2), ("mpi", 3), ("tcp", 2)])
def test_mpirun_mismatched_collectives_raise_on_every_rank(tmp_path, transport, ranks):
    """On the MPI data path too, no rank computes with another collective's data: the
    fingerprint all-reduce before each collective makes every rank raise, naming both sides."""
    results = mpirun("mismatch", ranks, tmp_path, transport, timeout_s=180)
    for rank, result in enumerate(results):
        gather, broadcast = result["gather"], result["broadcast"]
        # rank 0 refuses its gather; on the MPI path the others' gather meets rank 0's all_reduce in
        # the fingerprint all-reduce and raises there, on TCP it completes (bytes sent, nothing received)
        assert ("error" in gather["gather"]) == (rank == 0 or transport == "mpi"), gather["gather"]
        # On TCP a peer may finish all_reduce #2 with rank 0's data, sent before rank 0 read the
        # stray header (then only with the true sum); its next collective fails.
        for step in ("all_reduce", "next"):
            outcome = gather[step]
            if "value" in outcome:
                assert transport == "tcp" and rank != 0 and step == "all_reduce", (rank, step, outcome)
                assert outcome["value"] == [float(ranks)] * 3, (rank, outcome)
                continue
            assert outcome["dist"], outcome
            assert "collective mismatch" in outcome["message"], outcome["message"]
            assert outcome["seconds"] < 15
        if "value" in broadcast["first"]:
            assert rank == 1 and transport == "tcp", (rank, broadcast["first"])
        else:
            assert "collective mismatch" in broadcast["first"]["message"] or rank != 0, broadcast["first"]
        assert "error" in broadcast["second"], (rank, broadcast["second"])
    if transport == "mpi":
        text = results[0]["gather"]["all_reduce"]["message"]
        assert "rank 0 is in allreduce #2" in text and "gather #1" in text, text
        assert all("error" in r["broadcast"]["first"] for r in results)


@needs_mpirun
@pytest.mark.parametrize("transport,ranks", [("mpi", 1), exhaustive("mpi", 2), ("mpi", 3), ("mpi", 4),
                                             ("tcp", 2)])
def test_mpirun_parity_calls(tmp_path, transport, ranks):
    """The calls of tests/test_parity.py under mpirun, with MPI as the CPU transport (and TCP)."""
    import parity_workers as pw

    results = mpirun("parity", ranks, tmp_path, transport)
    cases = sum(len(shapes) for shapes in pw.ALLGATHER_COALESCED_SHAPES) * len(pw.ALLGATHER_COALESCED_DTYPES)
    n = ranks
    for rank, result in enumerate(results):
        assert (result["transport"], result["bootstrap"]) == (transport, "mpi")
        gathered = result["all_gather_coalesced"]
        assert gathered["failures"] == [] and gathered["checked"] == cases * n, gathered["failures"][:10]
        coalescing = result["coalescing"]
        assert coalescing["supports"] is True and coalescing["fast path ok"] and coalescing["sync"], coalescing
        assert coalescing["one by one"] == (1, True, True), coalescing
        if n > 1:
            assert coalescing["ring 5"] == coalescing["ring 300000"] == (1, 2, True, True), coalescing
        sparse = result["sparse"]
        assert [dense for _, _, dense in sparse["results"]] == sparse["expected"]
        assert sparse["max"][0] == "ValueError" and sparse["after"] == [n] * 2
        split = result["split"]
        if isinstance(split["bound"][0], tuple):  # torch 2.12-2.14 on a CPU-only host: refused, as for gloo
            assert split["bound"][0][:2] == ("raised", "RuntimeError"), split
        else:
            assert split["bound"][0]["ranks"] == list(range(n)) and split["bound"][0]["sum"] == n * (n + 1) / 2
            assert split["bound"][1] == {"rank": 0, "size": 1, "ranks": [rank], "sum": rank + 1.0,
                                         "broadcast": rank * 10, "gathered": [rank]}
            assert split["one_group_for_cpu_and_cuda"] == [True, True], split
        monitored = result["monitored"]
        assert [o[0] for o in monitored["passed"]] == ["ok", "ok"] and monitored["sum"] == [n * (n + 1) / 2] * 2
        if n == 1:
            assert monitored["failed"][0] == "ok"
        elif rank == 0:
            assert f"[Rank 0]: Rank {n - 1} failed to pass monitoredBarrier in 1000 ms" in monitored["failed"][2]
        elif rank < n - 1:
            assert f"Rank {rank} successfully reached monitoredBarrier" in monitored["failed"][2]
