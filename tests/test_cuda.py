"""ddplite's CUDA path (docs/gpu.md).

CI part (runs everywhere): the build found NCCL where the CUDA toolkit and torch's NCCL wheel are
present, and reports the NCCL it was compiled against and the one loaded at run time.

GPU part (skipped without CUDA; written for a 1-GPU H100/H200 machine, and more GPUs where
present): every op and dtype at world size 1 against torch's NCCL backend on the same inputs;
2 ranks on one GPU (host staging) against gloo; DDP ResNet-18 against nccl and gloo; stream
semantics; multi-GPU runs and the watchdog where >= 2 GPUs exist.
"""

import importlib.metadata
import os
import re

import pytest
import torch
import torch.distributed as dist

import cuda_workers
import torch_ddp_lite
from harness import RankFailed, run_ranks

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (none on this machine)")
needs_two_gpus = pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 CUDA GPUs")


def nccl_header_version(include_folder):
    text = open(os.path.join(include_folder, "nccl.h")).read()
    return tuple(int(re.search(rf"#define NCCL_{part} (\d+)", text).group(1)) for part in ("MAJOR", "MINOR", "PATCH"))


def nccl_expected_here():
    """What setup.py looks for: a CUDA torch and nccl.h next to a libnccl.so.2 (wheel or toolkit)."""
    if not torch.version.cuda:
        return False
    try:
        import nvidia.nccl
        wheel = list(nvidia.nccl.__path__)[0]
    except ImportError:
        wheel = None
    cuda_home = os.environ.get("CUDA_HOME", "/usr/local/cuda")
    headers = [os.path.join(cuda_home, "include", "nccl.h")] + ([os.path.join(wheel, "include", "nccl.h")] if wheel else [])
    libraries = [os.path.join(cuda_home, "lib64", "libnccl.so.2")] + ([os.path.join(wheel, "lib", "libnccl.so.2")] if wheel else [])
    return any(map(os.path.isfile, headers)) and any(map(os.path.isfile, libraries))


def wheel_nccl_version():
    for name in ("nvidia-nccl-cu13", "nvidia-nccl-cu12"):
        try:
            return tuple(int(part) for part in importlib.metadata.version(name).split(".")[:3])
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


# ---- CI: build and versions --------------------------------------------------------------

def test_build_reports_nccl_compiled_in_where_toolkit_and_wheel_exist():
    info = torch_ddp_lite.build_info()["nccl"]
    assert info["compiled_in"] is nccl_expected_here(), info
    if not info["compiled_in"]:
        with pytest.raises(RuntimeError, match="built without NCCL"):
            torch_ddp_lite.nccl_version()


def test_nccl_version_compiled_from_header_loaded_from_wheel():
    info = torch_ddp_lite.build_info()["nccl"]
    if not info["compiled_in"]:
        pytest.skip("this build has no NCCL (no CUDA torch or no nccl.h here)")
    versions = torch_ddp_lite.nccl_version()
    assert versions["compiled"] == info["version"] == nccl_header_version(info["include"])
    expected_loaded = wheel_nccl_version()
    if expected_loaded is not None:
        assert versions["loaded"] == expected_loaded
    assert versions["loaded"] == tuple(torch.cuda.nccl.version())  # the same libnccl.so.2 as torch
    assert versions["compatible"] is True


def test_this_machine_builds_nccl_2_28_9():
    """The development machine: CUDA 13.0 toolkit and nvidia-nccl-cu13 2.28.9."""
    if wheel_nccl_version() != (2, 28, 9) or not nccl_expected_here():
        pytest.skip("not the reference machine (nvidia-nccl-cu13 2.28.9 with a CUDA torch)")
    assert torch_ddp_lite.build_info()["nccl"]["compiled_in"] is True
    assert torch_ddp_lite.nccl_version()["compiled"] == (2, 28, 9)
    assert torch_ddp_lite.nccl_version()["loaded"] == (2, 28, 9)


def test_staging_knob_declared_once():
    names = [name for name, _, _ in torch_ddp_lite.env_knobs()]
    assert names.count("DDPLITE_CUDA_STAGING") == 1


def test_collect_env_prints_ddplite_nccl_versions():
    from torch_ddp_lite import collect_env
    line = collect_env.nccl_section()["ddplite NCCL"]
    if torch_ddp_lite.build_info()["nccl"]["compiled_in"]:
        versions = torch_ddp_lite.nccl_version()
        assert f"compiled {'.'.join(map(str, versions['compiled']))}" in line
        assert f"loaded {'.'.join(map(str, versions['loaded']))}" in line
    else:
        assert "not compiled in" in line


def test_docs_gpu_figures_name_their_command_and_data():
    text = open(os.path.join(REPO, "docs", "gpu.md")).read()
    figures = text.split("## Figures", 1)[1]
    assert "bash scripts/gpu_check.sh" in figures and "python -m torch_ddp_lite.bench" in figures
    links = re.findall(r"\]\((data/gpu/[^)]+)\)", figures)
    assert len(links) >= 3  # the benchmark table, its JSON, the DDP table, the test outcomes
    for link in links:
        assert os.path.isfile(os.path.join(REPO, "docs", link)), link
    assert "python -m pytest tests/test_cuda.py" in text


# ---- GPU: world size 1 against torch's NCCL ------------------------------------------------

def assert_clean(results, minimum):
    for result in results:
        assert result["failures"] == [], "\n".join(result["failures"][:20])
        assert result["checked"] >= minimum


@needs_cuda
def test_every_op_and_dtype_matches_nccl_at_world_size_1():
    assert_clean(run_ranks(cuda_workers.same_as_other_backend, 1, "nccl"), minimum=8 * 12)


@needs_cuda
def test_coalesced_and_fp8_at_world_size_1():
    assert_clean(run_ranks(cuda_workers.coalesced_and_fp8, 1), minimum=7)


@needs_cuda
def test_stream_semantics_without_explicit_sync():
    assert_clean(run_ranks(cuda_workers.stream_semantics, 1), minimum=3)


@needs_cuda
@pytest.mark.slow
def test_ddp_resnet18_matches_nccl_at_world_size_1():
    ddplite = run_ranks(cuda_workers.ddp_resnet18, 1)[0]
    nccl = run_ranks(cuda_workers.ddp_resnet18, 1, backend="nccl")[0]
    for name in ddplite:
        torch.testing.assert_close(ddplite[name], nccl[name], rtol=1e-4, atol=1e-5, msg=name)


# ---- GPU: two ranks on one GPU (host staging) -----------------------------------------------

@needs_cuda
def test_two_ranks_on_one_gpu_match_gloo():
    env = {} if torch.cuda.device_count() == 1 else {"DDPLITE_CUDA_STAGING": "always"}
    assert_clean(run_ranks(cuda_workers.same_as_other_backend, 2, "gloo", env=env), minimum=8 * 10)
    assert_clean(run_ranks(cuda_workers.coalesced_and_fp8, 2, env=env), minimum=5)
    assert_clean(run_ranks(cuda_workers.point_to_point, 2, env=env), minimum=1)


@needs_cuda
def test_shared_gpu_refused_when_staging_is_off():
    if torch.cuda.device_count() != 1:
        pytest.skip("needs exactly one GPU, so that both ranks share it")
    if torch_ddp_lite.build_info()["nccl"].get("multi_rank_gpu") and os.environ.get("NCCL_MULTI_RANK_GPU_ENABLE") == "1":
        pytest.skip("NCCL multi-rank mode is on: NCCL serves a shared GPU")
    with pytest.raises(RankFailed, match="NCCL cannot serve this group"):
        run_ranks(cuda_workers.shared_gpu_mode, 2, env={"DDPLITE_CUDA_STAGING": "never"}, timeout_s=120)


@needs_cuda
@pytest.mark.slow
def test_ddp_resnet18_two_ranks_on_one_gpu_matches_gloo():
    env = {} if torch.cuda.device_count() == 1 else {"DDPLITE_CUDA_STAGING": "always"}
    ddplite = run_ranks(cuda_workers.ddp_resnet18, 2, env=env)
    gloo = run_ranks(cuda_workers.ddp_resnet18, 2, backend="gloo")
    for name in ddplite[0]:
        torch.testing.assert_close(ddplite[0][name], ddplite[1][name], rtol=0, atol=0, msg=name)
        torch.testing.assert_close(ddplite[0][name], gloo[0][name], rtol=1e-4, atol=1e-5, msg=name)


# ---- GPU: several GPUs ---------------------------------------------------------------------

@needs_two_gpus
@pytest.mark.parametrize("world_size", [2, 3, 4])
def test_multi_gpu_matches_nccl(world_size):
    if torch.cuda.device_count() < world_size:
        pytest.skip(f"needs {world_size} GPUs")
    assert_clean(run_ranks(cuda_workers.same_as_other_backend, world_size, "nccl"), minimum=8 * 12)
    assert_clean(run_ranks(cuda_workers.coalesced_and_fp8, world_size), minimum=7)
    assert_clean(run_ranks(cuda_workers.point_to_point, world_size), minimum=1)
    assert_clean(run_ranks(cuda_workers.stream_semantics, world_size), minimum=3)


@needs_two_gpus
def test_watchdog_aborts_a_collective_a_peer_never_joins():
    results = run_ranks(cuda_workers.watchdog_timeout, 2, pg_timeout_s=5, timeout_s=180)
    assert results[0]["raised"] == "DistBackendError", results[0]
    assert "watchdog aborted the NCCL communicator" in results[0]["message"]
    assert "rank 0/2, allreduce #2" in results[0]["message"]


@needs_two_gpus
@pytest.mark.skipif(not hasattr(dist, "shrink_group"), reason="torch without shrink_group")
@pytest.mark.parametrize("world_size", [2, 3])
def test_shrink_group_keeps_the_cuda_path_of_the_survivors(world_size):
    if torch.cuda.device_count() < world_size:
        pytest.skip(f"needs {world_size} GPUs")
    results = run_ranks(cuda_workers.shrink_after_exit, world_size, timeout_s=300, may_exit={world_size - 1})
    assert_clean([r for r in results if r is not None], minimum=3)


# ---- GPU: the cases of the NCCL review -------------------------------------------------------

@needs_cuda
@pytest.mark.parametrize("world_size", [1, 2])
def test_review_cases_on_one_gpu(world_size):
    """World size 1 (NCCL) and two ranks on GPU 0 (staged, or NCCL where it serves a shared GPU)."""
    assert_clean(run_ranks(cuda_workers.review_cases, world_size, timeout_s=300), minimum=15)


@needs_cuda
@pytest.mark.parametrize("world_size", [1, 2])
def test_eager_connect_then_split_group(world_size):
    assert_clean(run_ranks(cuda_workers.eager_connect_and_split, world_size, timeout_s=300), minimum=3)


@needs_cuda
def test_unpaired_send_to_itself_fails_alone():
    if torch.cuda.device_count() < 1:
        pytest.skip("needs a GPU of its own")
    assert_clean(run_ranks(cuda_workers.unpaired_self_sends, 1, timeout_s=180), minimum=4)


@needs_cuda
def test_abort_with_pending_work_fails_every_work():
    (result,) = run_ranks(cuda_workers.abort_with_pending_work, 1, timeout_s=180)
    # a Work the abort overtook fails; one whose kernel finished first may have succeeded
    assert all(outcome in ("DistBackendError", "ok") for outcome in result["outcomes"]), result
