"""DDP's companions trained for real under ddplite and under gloo, with equal results asserted."""

import pytest
import torch

import companions
import torch_ddp_lite
from harness import run_ranks


def assert_same_params(ddplite, gloo, rtol=1e-5, atol=1e-6):
    assert ddplite.keys() == gloo.keys()
    for name in ddplite:
        torch.testing.assert_close(ddplite[name], gloo[name], rtol=rtol, atol=atol, msg=name)


def run_both(fn, world_size, *args):
    results = {backend: run_ranks(fn, world_size, *args, backend=backend) for backend in ("ddplite", "gloo")}
    return results["ddplite"], results["gloo"]


@pytest.mark.parametrize("world_size", [2, 3])
def test_ddp_find_unused_parameters(world_size):
    ddplite, gloo = run_both(companions.find_unused_parameters, world_size)
    for rank in range(world_size):
        assert_same_params(ddplite[rank], gloo[rank])
        assert_same_params(ddplite[rank], ddplite[0], rtol=0, atol=0)  # replicas stay identical


@pytest.mark.parametrize("hook", ["allreduce_hook", "fp16_compress_hook", "bf16_compress_hook"])
def test_ddp_comm_hooks(hook):
    ddplite, gloo = run_both(companions.comm_hook, 2, hook)
    for rank in range(2):
        assert_same_params(ddplite[rank], gloo[rank])


def test_join_with_uneven_inputs():
    ddplite, gloo = run_both(companions.join_uneven_inputs, 3)
    for rank in range(3):
        assert_same_params(ddplite[rank], gloo[rank])
        assert_same_params(ddplite[rank], ddplite[0], rtol=0, atol=0)


def test_zero_redundancy_optimizer():
    ddplite, gloo = run_both(companions.zero_redundancy, 3)
    for rank in range(3):
        assert_same_params(ddplite[rank], gloo[rank])
    assert torch.equal(ddplite[0]["adam_steps"], gloo[0]["adam_steps"])


def test_fsdp2_fully_shard_on_cpu():
    ddplite, gloo = run_both(companions.fsdp2_fully_shard, 2)
    assert_same_params(ddplite[0], gloo[0], rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("world_size", [1, 2, 3])
def test_object_collectives(world_size):
    for failures in run_ranks(companions.object_collectives, world_size):
        assert failures == []


def test_what_torch_itself_refuses_on_cpu():
    """Documented in docs/features.md ("DDP and its companions"): these limits are torch's, the
    same under gloo's group. torch 2.14+ passes dist.monitored_barrier to any backend with a CPU
    device: there it runs on ddplite."""
    for outcome in run_ranks(companions.what_torch_refuses_on_cpu, 2):
        assert "SyncBatchNorm expected input tensor to be on GPU" in outcome["sync_batchnorm"]
        if torch_ddp_lite.torch_has("monitored_barrier_any_backend"):
            assert outcome["monitored_barrier"] is None, outcome
        else:
            assert "monitored_barrier is only implemented for GLOO" in outcome["monitored_barrier"]
