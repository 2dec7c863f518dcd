"""Launch detection without a launcher's own runtime: the environment a Slurm job step, a batch
script, srun's PMI and mpirun give a process, set by hand (the real Slurm cluster runs the same
jobs for real). And what the package must not do: change torch's env:// for the backends it does
not own (torch itself, with the package's hook switched off, is the oracle)."""

import os
import random
import subprocess
import sys
import time

import pytest

from test_auth import finish  # communicate with every process, killing the rest on a timeout
from torch_ddp_lite import rendezvous

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LAUNCHER_PREFIXES = ("OMPI_", "PMI_", "PMIX_", "SLURM_", "MASTER_", "RANK", "WORLD_SIZE", "LOCAL_RANK",
                     "TORCHELASTIC_", "GROUP_RANK")


def clean_environment(overrides, autoload=True):
    env = {name: value for name, value in os.environ.items() if not name.startswith(LAUNCHER_PREFIXES)}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [REPO, env.get("PYTHONPATH")]))
    if not autoload:
        env["TORCH_DEVICE_BACKEND_AUTOLOAD"] = "0"
    env.update(overrides)
    return env


def run_python(code, overrides, autoload=True, timeout_s=120):
    return subprocess.run([sys.executable, "-c", code], env=clean_environment(overrides, autoload),
                          capture_output=True, text=True, timeout=timeout_s, cwd=REPO)


def last_line(stderr):
    return stderr.strip().splitlines()[-1] if stderr.strip() else ""


def slurm_step(rank, tasks, job_id, nodes="localhost", **more):
    """The variables srun gives task `rank` of a one-node step (those launch detection reads)."""
    return {"SLURM_JOB_ID": str(job_id), "SLURM_STEP_ID": "0", "SLURM_PROCID": str(rank), "SLURM_LOCALID": str(rank),
            "SLURM_NTASKS": str(tasks), "SLURM_STEP_NUM_TASKS": str(tasks), "SLURM_STEP_NODELIST": nodes,
            "SLURM_JOB_NODELIST": nodes, **more}


def free_job_id():
    """A job id whose step 0's port (rendezvous.slurm_port) is free here now."""
    import socket

    for _ in range(50):
        job_id = random.randrange(1, 10 ** 6)
        with socket.socket() as probe:
            try:
                probe.bind(("127.0.0.1", rendezvous.slurm_port(job_id, 0)))
                return job_id
            except OSError:
                continue
    pytest.skip("no free port in 10000-29999")


# ---- the decisions, on environments given as dicts -----------------------------------------------

@pytest.mark.parametrize("nodelist, first", [
    ("node[01-04,07],gpu5", "node01"), ("rack[1-2]-n[3-4]", "rack1-n3"), ("a1,b2", "a1"), ("single", "single"),
    ("n[5]", "n5"), ("x[007-010]", "x007"), ("gpu[3,1-2]", "gpu3"), ("  host-a.example.org ", "host-a.example.org"),
])
def test_first_host_of_a_slurm_host_list(nodelist, first):
    assert rendezvous.first_slurm_host(nodelist) == first


def test_a_slurm_steps_store_is_on_its_first_node_at_a_port_from_the_job_id():
    env = slurm_step(3, 4, 5123456, nodes="node[07-08]")
    env["SLURM_JOB_NODELIST"] = "node[01-08]"  # the whole allocation; the step runs on two of them
    host, port, how = rendezvous.slurm_store_address(env)
    assert (host, port) == ("node07", 10000 + (32 * 5123456) % 20000) == ("node07", 20592)
    assert "node[07-08]" in how
    # the steps of one job, and neighbouring jobs, get ports of their own, below the ephemeral range
    ports = {rendezvous.slurm_port(job, step) for job in range(5123456, 5123456 + 100) for step in range(8)}
    assert len(ports) == 800 and min(ports) >= 10000 and max(ports) < 32768
    # MASTER_ADDR / MASTER_PORT of the user's win, each on its own; brackets and empty values
    assert rendezvous.slurm_store_address({**env, "MASTER_ADDR": "10.0.0.9"})[:2] == ("10.0.0.9", 20592)
    assert rendezvous.slurm_store_address({**env, "MASTER_PORT": "29400"})[:2] == ("node07", 29400)
    assert rendezvous.slurm_store_address({**env, "MASTER_ADDR": "[fd00::1]"})[0] == "fd00::1"
    assert rendezvous.slurm_store_address({**env, "MASTER_ADDR": ""})[0] == "node07"
    assert rendezvous.slurm_store_address({"SLURM_PROCID": "0", "SLURM_NTASKS": "2"}) is None


def test_which_launcher_a_process_belongs_to():
    step = slurm_step(1, 4, 77)
    found = rendezvous.launcher_rank(step)
    assert (found.launcher, found.rank, found.world_size, found.size_variable) == (
        rendezvous.SLURM, 1, 4, "SLURM_STEP_NUM_TASKS")
    # a step on part of a job: the step's tasks, not the job's
    assert rendezvous.launcher_rank({**step, "SLURM_NTASKS": "16"}).world_size == 4
    # srun --mpi=pmi2 sets PMI_RANK/PMI_SIZE, the size the step's: still Slurm, not an MPI launch
    assert rendezvous.launcher_rank({**step, "PMI_RANK": "1", "PMI_SIZE": "4"}).launcher is rendezvous.SLURM
    # MPICH's mpiexec inside an allocation: its processes carry its proxies' step (one task per node)
    mpich = {**slurm_step(0, 2, 77), "PMI_RANK": "5", "PMI_SIZE": "8"}
    assert (rendezvous.launcher_rank(mpich).launcher, rendezvous.launcher_rank(mpich).rank) == (rendezvous.PMI, 5)
    # Open MPI's mpirun likewise, whatever Slurm says
    openmpi = {**slurm_step(0, 2, 77), "OMPI_COMM_WORLD_RANK": "3", "OMPI_COMM_WORLD_SIZE": "8"}
    assert rendezvous.launcher_rank(openmpi).launcher is rendezvous.OPEN_MPI
    assert rendezvous.launcher_rank({}) is None


def test_a_batch_script_without_srun_is_told_so():
    batch = {"SLURM_JOB_ID": "42", "SLURM_NTASKS": "4", "SLURM_PROCID": "0", "SLURM_JOB_NODELIST": "n[1-2]"}
    text = rendezvous.slurm_batch_without_srun(batch)
    assert "Slurm job 42's batch script (SLURM_NTASKS=4, no SLURM_STEP_ID)" in text and "srun" in text
    assert rendezvous.slurm_batch_without_srun({**batch, "SLURM_NTASKS": "1"}) is None  # a one-task job
    assert rendezvous.slurm_batch_without_srun(slurm_step(0, 4, 42)) is None  # inside a step
    assert rendezvous.slurm_batch_without_srun({}) is None
    # mpirun's ranks on the batch node itself (it starts only the other nodes' daemons with srun)
    mpirun_in_batch = {**batch, "OMPI_COMM_WORLD_RANK": "0", "OMPI_COMM_WORLD_SIZE": "4"}
    assert rendezvous.slurm_batch_without_srun(mpirun_in_batch) is None
    assert rendezvous.launcher_rank(mpirun_in_batch).launcher is rendezvous.OPEN_MPI


def test_a_rank_or_size_given_must_agree_with_the_launcher():
    launch = rendezvous.launcher_rank(slurm_step(1, 4, 77))
    rendezvous._check_against_launcher(launch, "1", None)
    rendezvous._check_against_launcher(launch, None, "4")
    with pytest.raises(ValueError, match=r"world_size=8 was given, but Slurm \(srun\) says 4"):
        rendezvous._check_against_launcher(launch, None, "8")
    with pytest.raises(ValueError, match=r"rank=0 was given"):
        rendezvous._check_against_launcher(launch, "0", None)


# ---- torch's env:// for other backends: unchanged ------------------------------------------------

INIT = "import torch.distributed as dist; dist.init_process_group({backend!r}); print('ok', dist.get_rank(), dist.get_world_size())"

ENVIRONMENTS_TORCH_DOES_NOT_READ = {
    "slurm step": slurm_step(0, 2, 1234),
    "slurm batch script": {"SLURM_JOB_ID": "1234", "SLURM_NTASKS": "2", "SLURM_PROCID": "0"},
    "mpirun": {"OMPI_COMM_WORLD_RANK": "0", "OMPI_COMM_WORLD_SIZE": "2", "OMPI_COMM_WORLD_LOCAL_RANK": "0"},
}


@pytest.mark.parametrize("case", sorted(ENVIRONMENTS_TORCH_DOES_NOT_READ))
def test_other_backends_get_torchs_env_rendezvous(case):
    """gloo with torch_ddp_lite installed (its hook on) fails exactly as torch alone does."""
    code = INIT.format(backend="gloo")
    overrides = ENVIRONMENTS_TORCH_DOES_NOT_READ[case]
    with_package = run_python(code, overrides)
    torch_alone = run_python(code, overrides, autoload=False)
    assert with_package.returncode != 0 and torch_alone.returncode != 0
    assert "environment variable RANK expected" in last_line(torch_alone.stderr), torch_alone.stderr
    assert last_line(with_package.stderr) == last_line(torch_alone.stderr), with_package.stderr


def test_other_backends_do_not_even_load_the_package():
    """A gloo group with torch's variables set: torch_ddp_lite is neither imported nor its extension
    loaded (a stale build must not break other backends)."""
    code = ("import sys, torch.distributed as dist\n"
            "sys.modules['torch_ddp_lite._C'] = None  # as an extension that cannot load\n"
            "dist.init_process_group('gloo'); print('ok', 'torch_ddp_lite' in sys.modules)\n"
            "dist.destroy_process_group()\n")
    completed = run_python(code, {"RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1",
                                  "MASTER_PORT": str(rendezvous.slurm_port(free_job_id(), 0))})
    assert completed.returncode == 0, completed.stderr
    assert completed.stdout.split() == ["ok", "False"], completed.stdout


def test_a_direct_rendezvous_call_is_torchs():
    code = ("import torch_ddp_lite, torch.distributed as dist\n"
            "next(dist.rendezvous('env://'))\n")
    completed = run_python(code, slurm_step(0, 2, 1234))
    assert completed.returncode != 0 and "environment variable RANK expected" in last_line(completed.stderr)


# ---- ddplite under a Slurm step, a batch script ---------------------------------------------------

def test_ddplite_under_a_slurm_step_needs_nothing_else():
    job_id = free_job_id()
    code = ("import torch, torch.distributed as dist\n"
            "dist.init_process_group('ddplite')\n"
            "t = torch.full((3,), float(dist.get_rank() + 1)); dist.all_reduce(t)\n"
            "print('ok', dist.get_rank(), dist.get_world_size(), t.tolist())\n"
            "dist.destroy_process_group()\n")
    processes = [subprocess.Popen([sys.executable, "-c", code], env=clean_environment(slurm_step(rank, 2, job_id)),
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO)
                 for rank in range(2)]
    outputs = finish(processes, 120)
    for rank, (process, (stdout, stderr)) in enumerate(zip(processes, outputs)):
        assert process.returncode == 0, stderr
        assert stdout.split() == ["ok", str(rank), "2", "[3.0,", "3.0,", "3.0]"], stdout


def test_task_0_on_another_node_than_the_first_is_told_at_once():
    started = time.monotonic()
    completed = run_python(INIT.format(backend="ddplite"), slurm_step(0, 2, 4242, SLURMD_NODENAME="node9"))
    assert completed.returncode != 0
    assert "task 0 of this Slurm step runs on node9, not on the step's first node localhost" in completed.stderr, \
        completed.stderr
    assert last_line(completed.stderr).startswith("Hint: export MASTER_ADDR=")
    assert time.monotonic() - started < 30


def test_ddplite_in_a_batch_script_without_srun_fails_at_once():
    started = time.monotonic()
    completed = run_python(INIT.format(backend="ddplite"),
                           {"SLURM_JOB_ID": "4242", "SLURM_NTASKS": "2", "SLURM_PROCID": "0"})
    assert completed.returncode != 0
    assert last_line(completed.stderr).startswith("Hint: start the tasks with srun"), completed.stderr
    assert "ValueError: ddplite env:// rendezvous: this process is Slurm job 4242's batch script" in completed.stderr
    assert time.monotonic() - started < 30


def test_the_example_under_srun_trains_one_job(tmp_path):
    """srun python examples/train_cifar10.py: both tasks form one 2-rank job (not two jobs of one)."""
    job_id = free_job_id()
    command = [sys.executable, os.path.join(REPO, "examples", "train_cifar10.py"), "--arch", "resnet9", "--width", "8",
               "--epochs", "1", "--batch-size", "32", "--synthetic-train-size", "256", "--synthetic-test-size", "64",
               "--limit-train-batches", "2", "--limit-eval-batches", "1", "--synthetic-dir", str(tmp_path / "data"),
               "--data-dir", str(tmp_path / "none"), "--checkpoint-dir", str(tmp_path), "--out-dir", str(tmp_path)]
    processes = [subprocess.Popen(command, env=clean_environment({**slurm_step(rank, 2, job_id), "OMP_NUM_THREADS": "1"}),
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO)
                 for rank in range(2)]
    outputs = finish(processes, 300)
    assert all(process.returncode == 0 for process in processes), [stderr[-3000:] for _, stderr in outputs]
    run_lines = [line for line in outputs[0][0].splitlines() if line.startswith("run:")]
    assert run_lines and "launcher=srun world_size=2" in run_lines[0], outputs[0][0]
    assert outputs[1][0].strip() == ""  # rank 1 prints nothing: one job, rank 0 reports
