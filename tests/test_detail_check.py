"""The DETAIL check (DDPLITE_DEBUG=DETAIL, TORCH_DISTRIBUTED_DEBUG=DETAIL): ranks that disagree about
a collective's op, order, dtype, shape, numel, root or reduce op all raise the same ValueError,
naming the ranks on each side, before anything is sent; the group stays usable."""

import pytest

import mismatch_workers as mw
from harness import run_ranks

DETAIL = {"DDPLITE_DEBUG": "DETAIL"}


def sides(world_size, majority, odd):
    others = list(range(world_size - 1))
    label = "rank 0" if len(others) == 1 else "ranks " + ", ".join(map(str, others))
    return f"'{majority}' on {label}; '{odd}' on rank {world_size - 1}"


EXPECTED = {
    "op": lambda n: f"op: {sides(n, 'allreduce', 'broadcast')}",
    "dtype": lambda n: f"dtype: {sides(n, 'Float', 'Double')}",
    "numel": lambda n: f"numel: {sides(n, '4', '5')}",
    "shape": lambda n: f"shape: {sides(n, '[4]', '[2, 2]')}",
    "root": lambda n: f"root: {sides(n, '0', '1')}",
    "reduce_op": lambda n: f"reduce op: {sides(n, 'SUM', 'MAX')}",
}


def assert_detail_error(step, rank, seq, line):
    assert step.get("error") == "ValueError", (rank, step)
    message = step["message"]
    assert f"the ranks called different collectives at #{seq}" in message, message
    assert line in message, f"rank {rank}: {line!r} not in\n{message}"


@pytest.mark.parametrize("world_size", [2, 3])
@pytest.mark.parametrize("kind", sorted(EXPECTED))
def test_every_rank_names_the_difference_and_the_group_stays_usable(kind, world_size):
    results = run_ranks(mw.detail_mismatch, world_size, kind, env=DETAIL, pg_timeout_s=60)
    for rank, steps in enumerate(results):
        assert steps["first"]["value"] == [float(world_size)] * 4
        assert_detail_error(steps["mismatch"], rank, 2, EXPECTED[kind](world_size))
        if kind == "shape":  # same numel: only the shape differs
            assert "numel:" not in steps["mismatch"]["message"]
        assert steps["after"]["value"] == [float(world_size)] * 3, (rank, steps["after"])


def test_order_swapped_on_one_rank():
    results = run_ranks(mw.detail_mismatch, 4, "order", env=DETAIL, pg_timeout_s=60)
    for rank, steps in enumerate(results):
        assert_detail_error(steps["mismatch"], rank, 2, "op: 'broadcast' on ranks 0, 1, 2; 'allreduce' on rank 3")
        assert_detail_error(steps["mismatch_2"], rank, 3, "op: 'allreduce' on ranks 0, 1, 2; 'broadcast' on rank 3")
        assert steps["after"]["value"] == [4.0] * 3


def test_torch_debug_detail_turns_it_on_behind_torchs_wrapper():
    """torch 2.11 wraps ddplite in its ProcessGroupWrapper under TORCH_DISTRIBUTED_DEBUG=DETAIL,
    which compares ops, shapes and dtypes but not reduce ops: ddplite's check catches that one."""
    results = run_ranks(mw.detail_mismatch, 2, "reduce_op", env={"TORCH_DISTRIBUTED_DEBUG": "DETAIL"},
                        pg_timeout_s=60)
    for rank, steps in enumerate(results):
        assert_detail_error(steps["mismatch"], rank, 2, EXPECTED["reduce_op"](2))
        assert steps["after"]["value"] == [2.0] * 3



def test_two_ranks_that_each_think_they_are_the_root():
    """Without DETAIL this waits for the timeout (no message crosses); with it, both raise at once."""
    results = run_ranks(mw.detail_two_roots, 2, env=DETAIL, pg_timeout_s=60)
    for rank, steps in enumerate(results):
        assert_detail_error(steps["mismatch"], rank, 1, "root: '0' on rank 0; '1' on rank 1")
        assert steps["after"]["value"] == [2.0] * 3
