"""examples/train_cifar10.py, run as users run it: real rank processes under torchrun or --spawn.

Every run uses a tiny configuration (a narrow ResNet-9 on 2000 generated training images) so the
file takes a couple of minutes on 2 cores. The rank processes import this checkout's
torch_ddp_lite (PYTHONPATH), whatever other copy is installed.
"""

import csv
import os
import pickle
import shutil
import signal
import socket
import subprocess
import sys
import time

import numpy as np
import pytest
import torch

import torch_ddp_lite

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(REPO, "examples", "train_cifar10.py")
sys.path.insert(0, os.path.join(REPO, "examples"))

import cifar10_data  # noqa: E402  (lives beside the script, not in a package)
from harness import mpirun_environment  # noqa: E402

TINY = ["--arch", "resnet9", "--width", "8", "--batch-size", "32", "--lr", "0.05",
        "--synthetic-train-size", "2000", "--synthetic-test-size", "500"]
FEW_STEPS = ["--epochs", "1", "--limit-train-batches", "5", "--limit-eval-batches", "2"]


@pytest.fixture(scope="module")
def synthetic_dir(tmp_path_factory):
    """One cache of generated data for the whole file (the first run generates it)."""
    return str(tmp_path_factory.mktemp("generated-cifar10"))


def rank_environment(**extra):
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [REPO, env.get("PYTHONPATH")]))
    env.update(extra)
    return env


def command(run_dir, synthetic_dir, *args, nproc=2):
    """torchrun with ``nproc`` ranks (None: no launcher, for --spawn)."""
    launcher = [] if nproc is None else ["-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(nproc)]
    return [sys.executable, *launcher, SCRIPT, *TINY, "--synthetic-dir", synthetic_dir,
            "--data-dir", os.path.join(run_dir, "no-cifar10-here"),
            "--checkpoint-dir", run_dir, "--out-dir", run_dir, *args]


def train(run_dir, synthetic_dir, *args, nproc=2, timeout=240):
    result = subprocess.run(command(str(run_dir), synthetic_dir, *args, nproc=nproc), capture_output=True,
                            text=True, timeout=timeout, cwd=REPO, env=rank_environment())
    assert result.returncode == 0, result.stdout + result.stderr[-5000:]
    return result.stdout


def summary(stdout):
    lines = [line for line in stdout.splitlines() if line.startswith("done:")]
    assert len(lines) == 1, stdout
    return dict(field.split("=", 1) for field in lines[0].split()[1:])


def load_checkpoint(run_dir):
    return torch.load(os.path.join(run_dir, "checkpoint.pt"), map_location="cpu", weights_only=False)


def read_metrics(run_dir):
    with open(os.path.join(run_dir, "metrics.csv")) as metrics:
        return list(csv.DictReader(metrics))


def deterministic_metrics(checkpoint):
    """The per-epoch losses and accuracies (times and speeds vary from run to run)."""
    return [{k: v for k, v in row.items() if "seconds" not in k and "per_s" not in k} for row in checkpoint["metrics"]]


@pytest.fixture(scope="module")
def three_epoch_run(tmp_path_factory, synthetic_dir):
    """2-rank torchrun, ddplite, 3 epochs, never interrupted: (run folder, stdout)."""
    run_dir = tmp_path_factory.mktemp("three-epochs")
    return run_dir, train(run_dir, synthetic_dir, "--epochs", "3")


@pytest.fixture(scope="module")
def few_steps_ddplite(tmp_path_factory, synthetic_dir):
    run_dir = tmp_path_factory.mktemp("few-steps-ddplite")
    train(run_dir, synthetic_dir, *FEW_STEPS)
    return load_checkpoint(run_dir)


def test_two_rank_torchrun_learns_and_writes_its_outputs(three_epoch_run):
    run_dir, stdout = three_epoch_run
    assert "data: generated CIFAR-format data (not the real CIFAR-10)" in stdout, stdout
    fields = summary(stdout)
    assert fields["backend"] == "ddplite" and fields["world_size"] == "2" and fields["data"] == "generated", fields
    assert float(fields["images/s"]) > 0
    # 10 classes: chance is 0.1
    assert float(fields["test_accuracy"]) > 0.3, stdout
    rows = read_metrics(run_dir)
    assert [int(row["epoch"]) for row in rows] == [1, 2, 3]
    assert float(rows[-1]["train_loss"]) < float(rows[0]["train_loss"]), rows
    assert float(rows[-1]["test_accuracy"]) == pytest.approx(float(fields["test_accuracy"]), abs=1e-3)
    with open(os.path.join(run_dir, "metrics.png"), "rb") as plot:
        assert plot.read(8) == b"\x89PNG\r\n\x1a\n"
    checkpoint = load_checkpoint(run_dir)
    assert checkpoint["epoch"] == 3 and len(checkpoint["rng"]) == 2
    assert {"model", "optimizer", "scheduler", "scaler"} <= checkpoint.keys()
    assert not os.path.exists(os.path.join(run_dir, "checkpoint.pt.tmp"))


def test_killed_run_resumes_to_the_same_parameters(tmp_path, synthetic_dir, three_epoch_run):
    """Kill-and-resume, bitwise. A 3-epoch run is killed for real once its first checkpoint is on disk
    (SIGTERM to torchrun, which ends its ranks mid-epoch, as a scheduler's preemption does); a fresh
    launch with --resume and the same arguments finishes it, and its final parameters, buffers,
    optimizer state and per-epoch metrics equal the uninterrupted run's exactly.

    The kill is real rather than simulated by a shorter --epochs: the learning-rate schedule spans
    all epochs, so a run told "--epochs 1" is a different run, not a prefix of the 3-epoch one."""
    reference_dir, _ = three_epoch_run
    checkpoint_path = tmp_path / "checkpoint.pt"
    job = subprocess.Popen(command(str(tmp_path), synthetic_dir, "--epochs", "3"), stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL, cwd=REPO, env=rank_environment())
    try:
        deadline = time.monotonic() + 180
        while not checkpoint_path.exists() and job.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        job.send_signal(signal.SIGTERM)
        assert job.wait(timeout=60) != 0, "the job ended on its own before it could be killed"
    finally:
        if job.poll() is None:
            job.kill()
    interrupted_at = load_checkpoint(tmp_path)["epoch"]
    assert 1 <= interrupted_at < 3

    stdout = train(tmp_path, synthetic_dir, "--epochs", "3", "--resume")
    assert f"continuing from epoch {interrupted_at + 1}" in stdout and "warning" not in stdout, stdout
    resumed, reference = load_checkpoint(tmp_path), load_checkpoint(reference_dir)
    assert resumed["model"].keys() == reference["model"].keys()
    for name, tensor in reference["model"].items():
        assert torch.equal(resumed["model"][name], tensor), name
    for index, state in reference["optimizer"]["state"].items():
        assert torch.equal(resumed["optimizer"]["state"][index]["momentum_buffer"], state["momentum_buffer"])
    assert deterministic_metrics(resumed) == deterministic_metrics(reference)


def test_ddplite_and_gloo_give_the_same_parameters(tmp_path, synthetic_dir, few_steps_ddplite):
    train(tmp_path, synthetic_dir, *FEW_STEPS, "--backend", "gloo")
    gloo = load_checkpoint(tmp_path)
    assert gloo["config"] == few_steps_ddplite["config"]
    for name, tensor in gloo["model"].items():
        torch.testing.assert_close(few_steps_ddplite["model"][name], tensor, rtol=1e-5, atol=1e-7, msg=name)


def test_spawn_launch_matches_torchrun(tmp_path, synthetic_dir, few_steps_ddplite):
    stdout = train(tmp_path, synthetic_dir, *FEW_STEPS, "--spawn", "2", nproc=None)
    assert "launcher=mp.spawn world_size=2" in stdout, stdout
    spawned = load_checkpoint(tmp_path)
    for name, tensor in spawned["model"].items():
        torch.testing.assert_close(few_steps_ddplite["model"][name], tensor, rtol=1e-5, atol=1e-7, msg=name)


# ------------------------------------------------------------- other launchers: same parameters as torchrun

def free_port():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def run_together(commands, timeout=180, env=None):
    """Starts every command at once, each in its own session (process group), and waits for all.
    Returns [(returncode, output)]. Whatever is still running at the end is killed, group and all."""
    jobs = [subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=REPO,
                             env=env or rank_environment(), start_new_session=True) for cmd in commands]
    try:
        deadline = time.monotonic() + timeout
        outputs = [job.communicate(timeout=max(1.0, deadline - time.monotonic()))[0] for job in jobs]
        return [(job.returncode, output) for job, output in zip(jobs, outputs)]
    finally:
        for job in jobs:
            try:
                os.killpg(job.pid, signal.SIGKILL)  # the group: torchrun's ranks too
            except ProcessLookupError:
                pass
            job.wait()


def one_thread_environment():
    """torchrun sets OMP_NUM_THREADS=1 only for several ranks per node; two "nodes" of one rank each
    on one machine would oversubscribe its cores (and differ from the reference in the last bits)."""
    return {**rank_environment(), "OMP_NUM_THREADS": "1"}


def assert_same_parameters(checkpoint, reference):
    assert checkpoint["config"] == reference["config"]
    assert checkpoint["model"].keys() == reference["model"].keys()
    for name, tensor in reference["model"].items():
        assert torch.equal(checkpoint["model"][name], tensor), name  # bitwise: same ranks, same algorithms


def test_torchrun_two_nodes_match_one_node(tmp_path, synthetic_dir, few_steps_ddplite):
    """Two torchrun invocations on one machine acting as two nodes (--nnodes 2, c10d rendezvous),
    one rank each: the world of the 2-rank single-node run, and its exact parameters."""
    endpoint = f"127.0.0.1:{free_port()}"
    nodes = [[sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--node-rank", str(node),
              "--nproc-per-node", "1", "--rdzv-backend", "c10d", "--rdzv-endpoint", endpoint,
              *command(str(tmp_path), synthetic_dir, *FEW_STEPS, nproc=None)[1:]] for node in (0, 1)]
    results = run_together(nodes, env=one_thread_environment())
    for node, (returncode, output) in enumerate(results):
        assert returncode == 0, f"node {node}:\n{output[-5000:]}"
    assert "launcher=torchrun world_size=2" in "".join(output for _, output in results)
    assert_same_parameters(load_checkpoint(tmp_path), few_steps_ddplite)


def test_ranks_started_by_hand_with_dist_url_match_torchrun(tmp_path, synthetic_dir, few_steps_ddplite):
    """The flags of PyTorch's ImageNet example: --dist-url tcp://IP:PORT --world-size 2 --rank R,
    one process per rank, started separately."""
    url = f"tcp://127.0.0.1:{free_port()}"
    ranks = [command(str(tmp_path), synthetic_dir, *FEW_STEPS, "--dist-url", url, "--world-size", "2",
                     "--rank", str(rank), nproc=None) for rank in (0, 1)]
    results = run_together(ranks, env=one_thread_environment())
    for rank, (returncode, output) in enumerate(results):
        assert returncode == 0, f"rank {rank}:\n{output[-5000:]}"
    assert "launcher=dist-url world_size=2" in results[0][1], results[0][1]
    assert_same_parameters(load_checkpoint(tmp_path), few_steps_ddplite)


def test_spawn_with_tcp_dist_url_matches_torchrun(tmp_path, synthetic_dir, few_steps_ddplite):
    url = f"tcp://127.0.0.1:{free_port()}"
    stdout = train(tmp_path, synthetic_dir, *FEW_STEPS, "--spawn", "2", "--dist-url", url, nproc=None)
    assert "launcher=mp.spawn world_size=2" in stdout, stdout
    assert_same_parameters(load_checkpoint(tmp_path), few_steps_ddplite)


def test_spawn_on_two_machines_with_tcp_dist_url_matches_torchrun(tmp_path, synthetic_dir, few_steps_ddplite):
    """--spawn 1 --world-size 2 --rank M: the ImageNet example's multi-node mp.spawn (world = 2 x 1)."""
    url = f"tcp://127.0.0.1:{free_port()}"
    machines = [command(str(tmp_path), synthetic_dir, *FEW_STEPS, "--spawn", "1", "--dist-url", url,
                        "--world-size", "2", "--rank", str(machine), nproc=None) for machine in (0, 1)]
    results = run_together(machines, env=one_thread_environment())
    for machine, (returncode, output) in enumerate(results):
        assert returncode == 0, f"machine {machine}:\n{output[-5000:]}"
    assert "launcher=mp.spawn world_size=2" in results[0][1], results[0][1]
    assert_same_parameters(load_checkpoint(tmp_path), few_steps_ddplite)


def test_dist_url_flags_are_checked():
    result = subprocess.run([sys.executable, SCRIPT, "--dist-url", "tcp://127.0.0.1:1", "--rank", "0"],
                            capture_output=True, text=True, timeout=120, cwd=REPO, env=rank_environment())
    assert result.returncode == 2 and "needs all of --dist-url, --world-size and --rank" in result.stderr, result


def test_generated_data_has_the_cifar10_file_format(tmp_path):
    root = cifar10_data.ensure_generated(str(tmp_path), seed=3, train_size=103, test_size=20)
    folder = os.path.join(root, "cifar-10-batches-py")
    assert sorted(os.listdir(folder)) == ["batches.meta", "data_batch_1", "data_batch_2", "data_batch_3",
                                          "data_batch_4", "data_batch_5", "test_batch"]
    with open(os.path.join(folder, "data_batch_5"), "rb") as batch_file:
        batch = pickle.load(batch_file, encoding="bytes")  # the usual recipe for the real files
    assert set(batch) == {b"batch_label", b"data", b"labels", b"filenames"}
    assert batch[b"data"].dtype == np.uint8 and batch[b"data"].shape == (23, 3072)  # 4 x 20 + 23 = 103
    assert batch[b"batch_label"] == b"training batch 5 of 5"
    assert len(batch[b"labels"]) == len(batch[b"filenames"]) == 23
    with open(os.path.join(folder, "batches.meta"), "rb") as meta_file:
        assert pickle.load(meta_file, encoding="bytes")[b"label_names"][0] == b"airplane"
    train_set, test_set = cifar10_data.load_datasets(root)  # torchvision's loader
    assert len(train_set) == 103 and len(test_set) == 20 and train_set.classes[9] == "truck"
    image, label = train_set[0]
    assert image.shape == (3, 32, 32) and 0 <= label < 10
    # the same seed gives the same bytes; generating again leaves the folder as it is
    again = cifar10_data.ensure_generated(str(tmp_path / "again"), seed=3, train_size=103, test_size=20)
    for name in os.listdir(folder):
        with open(os.path.join(folder, name), "rb") as first, \
                open(os.path.join(again, "cifar-10-batches-py", name), "rb") as second:
            assert first.read() == second.read(), name
    assert cifar10_data.ensure_generated(str(tmp_path), seed=3, train_size=103, test_size=20) == root


# ------------------------------------------------------------------------- GPU (skipped without one)

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
GPU_RUN = ["--arch", "resnet18", "--batch-size", "256", "--workers", "4", "--epochs", "2",
           "--synthetic-train-size", "20000", "--synthetic-test-size", "2000", "--device", "cuda"]


def train_on_gpu(run_dir, synthetic_dir, nproc, backend):
    """Returns (finished, output, images/s of the last epoch)."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(nproc), SCRIPT,
           *GPU_RUN, "--backend", backend, "--synthetic-dir", synthetic_dir,
           "--data-dir", os.path.join(run_dir, "no-cifar10-here"), "--checkpoint-dir", run_dir, "--out-dir", run_dir]
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=REPO, env=rank_environment())
    output = result.stdout + result.stderr[-5000:]
    if result.returncode != 0:
        return False, output, None
    return True, output, float(read_metrics(run_dir)[-1]["train_images_per_s"])


def xfail_if_ddplite_has_no_cuda(output):
    # Only a build without NCCL refuses CUDA tensors (NotImplementedError naming the reason).
    if "NotImplementedError" in output and "this ddplite build has none" in output:
        pytest.xfail("this ddplite build has no NCCL (see torch_ddp_lite.build_info()['nccl'])")


@needs_cuda
def test_cuda_ddplite_one_rank_and_two_ranks_on_one_gpu(tmp_path, synthetic_dir):
    for nproc in (1, 2):
        finished, output, images_per_s = train_on_gpu(str(tmp_path / f"ranks{nproc}"), synthetic_dir, nproc, "ddplite")
        if not finished:
            xfail_if_ddplite_has_no_cuda(output)
        assert finished, output
        assert float(summary(output)["test_accuracy"]) > 0.3, output
        print(f"ddplite, {nproc} rank(s) on one GPU: {images_per_s:.0f} images/s")


@needs_cuda
def test_cuda_images_per_second_ddplite_against_nccl(tmp_path, synthetic_dir):
    """World size 1, back to back: the figures docs/cifar10.md records."""
    finished, output, nccl = train_on_gpu(str(tmp_path / "nccl"), synthetic_dir, 1, "nccl")
    assert finished, output
    finished, output, ddplite = train_on_gpu(str(tmp_path / "ddplite"), synthetic_dir, 1, "ddplite")
    if not finished:
        xfail_if_ddplite_has_no_cuda(output)
    assert finished, output
    print(f"world size 1, resnet18, batch 256: nccl {nccl:.0f} images/s, ddplite {ddplite:.0f} images/s")


@pytest.mark.skipif(shutil.which("mpirun") is None or not torch_ddp_lite.build_info()["mpi"],
                    reason="needs mpirun and ddplite built with MPI (scripts/setup.sh installs both)")
@pytest.mark.parametrize("transport", ["tcp", "mpi"])
def test_mpirun_launch_matches_torchrun(tmp_path, synthetic_dir, few_steps_ddplite, transport):
    """mpirun -np 2: the script sees Open MPI's variables and joins through mpi://; on 2 ranks the
    MPI data path sums in the same order, so both transports end bitwise equal to torchrun."""
    env = mpirun_environment(DDPLITE_CPU_TRANSPORT=transport)
    mpirun = [shutil.which("mpirun"), "--bind-to", "none", "-x", "DDPLITE_CPU_TRANSPORT", "-np", "2"]
    result = subprocess.run(mpirun + command(str(tmp_path), synthetic_dir, *FEW_STEPS, nproc=None), capture_output=True,
                            text=True, timeout=240, cwd=REPO, env=env)
    assert result.returncode == 0, result.stdout + result.stderr[-5000:]
    assert "launcher=mpirun world_size=2" in result.stdout, result.stdout
    assert_same_parameters(load_checkpoint(tmp_path), few_steps_ddplite)
