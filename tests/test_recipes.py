"""The trainers' and orchestrators' recipes of docs/launchers.md, each run as its page shows it and,
where it trains, against the same run on gloo, bit for bit: Hugging Face Accelerate
(examples/accelerate_train.py), PyTorch Lightning (examples/lightning_train.py), Ray Train
(examples/ray_train.py) and a Kubernetes Indexed Job (examples/kubernetes/ddplite-job.yaml, its
container command run with the environment the manifest gives each pod). A recipe whose package is
missing is skipped with the reason (scripts/setup.sh installs Accelerate and Lightning; Ray is
large and left to the user)."""

import importlib.util
import os
import re
import signal
import subprocess
import sys

import pytest
import torch

from test_example import run_in_own_session

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def needs(module):
    return pytest.mark.skipif(importlib.util.find_spec(module) is None,
                              reason=f"{module} is not installed (pip install {module})")


def environment(**extra):
    env = {name: value for name, value in os.environ.items()
           if not name.startswith(("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_", "SLURM_", "OMPI_", "PMI_"))}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [REPO, env.get("PYTHONPATH")]))
    env["PATH"] = os.pathsep.join([os.path.dirname(sys.executable), env.get("PATH", "")])
    return {**env, "OMP_NUM_THREADS": "1", **extra}


def run(command, timeout=600):
    result = run_in_own_session(command, timeout, env=environment())
    assert result.returncode == 0, result.stdout + _why(result.stderr) + result.stderr[-5000:]
    return result.stdout


def _why(stderr):
    """The lines of a failed run's stderr that say why (a launcher's traceback buries them)."""
    markers = ("terminate called", "what():", "Error", "error:", "WARN", "Fatal", "Abort", "Signal")
    lines = [line for line in stderr.splitlines() if any(marker in line for marker in markers)]
    return "\n--- the lines of stderr that say why ---\n" + "\n".join(lines[-60:]) + "\n--- stderr's end ---\n"


def done_line(stdout):
    done = [line for line in stdout.splitlines() if line.startswith("done:")]
    assert len(done) == 1, stdout
    return done[0]


def assert_same_parameters(path, reference_path):
    reached, reference = torch.load(path), torch.load(reference_path)
    assert reached.keys() == reference.keys()
    for name, tensor in reference.items():
        assert torch.equal(reached[name], tensor), name


def torchrun(*args):
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", *args]


@needs("accelerate")
def test_accelerate_adopts_the_ddplite_group_and_trains_as_on_gloo(tmp_path):
    outputs = {}
    for backend in ("ddplite", "gloo"):
        stdout = run(torchrun("examples/accelerate_train.py", "--backend", backend,
                              "--save-params", str(tmp_path / f"{backend}.pt")))
        assert f"done: backend={backend} processes=2" in done_line(stdout), stdout
        outputs[backend] = [line for line in stdout.splitlines() if line.startswith("epoch")]
    assert outputs["ddplite"] == outputs["gloo"] and len(outputs["ddplite"]) == 2  # loss, gathered accuracy
    assert float(outputs["ddplite"][-1].split()[-1]) > 0.5  # it learns (chance: 0.1)
    assert_same_parameters(tmp_path / "ddplite.pt", tmp_path / "gloo.pt")


@needs("lightning")
def test_lightning_ddp_strategy_with_the_ddplite_backend(tmp_path):
    for backend in ("ddplite", "gloo"):
        stdout = run([sys.executable, "examples/lightning_train.py", "--devices", "2", "--backend", backend,
                      "--save-params", str(tmp_path / f"{backend}.pt")])
        assert f"done: backend={backend} world_size=2" in done_line(stdout), stdout
    assert_same_parameters(tmp_path / "ddplite.pt", tmp_path / "gloo.pt")


@needs("ray")
def test_ray_train_with_torch_config_backend_ddplite(tmp_path):
    for backend in ("ddplite", "gloo"):
        stdout = run([sys.executable, "examples/ray_train.py", "--workers", "2", "--backend", backend,
                      "--save-params", str(tmp_path / f"{backend}.pt")], timeout=900)
        assert f"done: backend={backend} world_size=2" in done_line(stdout), stdout
    assert_same_parameters(tmp_path / "ddplite.pt", tmp_path / "gloo.pt")


def pod_commands(manifest, pods):
    """The Job's container command of each pod, $(VAR) filled in as Kubernetes does, with the env the
    manifest gives; pod 0's DNS name (headless Service) becomes 127.0.0.1 here."""
    import yaml

    with open(manifest) as text:
        job = next(doc for doc in yaml.safe_load_all(text) if doc["kind"] == "Job")
    container = job["spec"]["template"]["spec"]["containers"][0]
    assert job["spec"]["completionMode"] == "Indexed" and job["spec"]["completions"] == pods
    commands = []
    for index in range(pods):
        env = {item["name"]: str(item["value"]) for item in container["env"]}
        env["JOB_COMPLETION_INDEX"] = str(index)
        env["MASTER_ADDR"] = "127.0.0.1"
        argv = [re.sub(r"\$\((\w+)\)", lambda match: env[match.group(1)], part)
                for part in container["command"] + container["args"]]
        commands.append((argv, env))
    return commands


@needs("yaml")
def test_the_kubernetes_indexed_job_forms_one_job_of_both_pods():
    manifest = os.path.join(REPO, "examples", "kubernetes", "ddplite-job.yaml")
    processes = []
    for argv, env in pod_commands(manifest, 2):
        assert argv[0] == "torchrun"
        argv = [sys.executable, "-m", "torch.distributed.run", *argv[1:]]
        processes.append(subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO,
                                          env=environment(**env), start_new_session=True))
    outputs = []
    for process in processes:
        try:
            outputs.append(process.communicate(timeout=300))
        except subprocess.TimeoutExpired:
            for other in processes:
                os.killpg(other.pid, signal.SIGKILL)
            raise
    assert all(process.returncode == 0 for process in processes), [stderr[-3000:] for _, stderr in outputs]
    done = done_line(outputs[0][0] + outputs[1][0])  # the job's rank 0 is on pod 0
    assert "backend=ddplite world_size=4" in done and "params_in_sync=True" in done, done
