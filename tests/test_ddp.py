"""Stock DistributedDataParallel + DistributedSampler through ddplite: the same parameters as gloo
and as one process on the full batch."""

import torch

import workers
from harness import run_ranks


def assert_params_close(actual, expected, rtol=1e-5, atol=1e-6):
    assert actual.keys() == expected.keys()
    for name in actual:
        torch.testing.assert_close(actual[name], expected[name], rtol=rtol, atol=atol, msg=name)


def test_ddp_matches_gloo_and_single_process():
    ddplite = run_ranks(workers.ddp_train, 2)
    gloo = run_ranks(workers.ddp_train, 2, backend="gloo")
    reference = workers.single_process_train(world_size=2)
    # both ranks end with identical parameters
    assert_params_close(ddplite[0], ddplite[1], rtol=0, atol=0)
    assert_params_close(ddplite[0], gloo[0])
    assert_params_close(ddplite[0], reference)
    # training moved the weights: the comparison is not between two untouched models
    untouched = dict(workers.make_cnn(seed=0).named_parameters())
    assert any(not torch.allclose(ddplite[0][n], untouched[n]) for n in untouched)


def test_ddp_three_ranks_matches_gloo():
    ddplite = run_ranks(workers.ddp_train, 3, 8)
    gloo = run_ranks(workers.ddp_train, 3, 8, backend="gloo")
    assert_params_close(ddplite[0], gloo[0])
    assert_params_close(ddplite[2], gloo[2])
