"""The NCCL path's decisions, tested without a GPU.

csrc/cuda/rules/nccl_rules.hpp holds every decision of the CUDA path that does not need CUDA:
which ranks share a GPU and whether NCCL serves them, when float8 may be reduced, how set-up keys
are named per run, how a nonblocking communicator is polled against a deadline, and what happens
to communicators at teardown. Every build compiles it (torch_ddp_lite._C.nccl_rules), and
nccl_path.cpp only carries out its answers. The set-up keys' run numbers and cleanup are checked
on a real store with real processes.
"""

import datetime
import os
import tempfile

import pytest
import torch.distributed as dist

import torch_ddp_lite
from harness import run_ranks

rules = torch_ddp_lite._load_extension().nccl_rules

# NCCL result codes (nccl.h): what the poll sees
NCCL_SUCCESS, NCCL_SYSTEM_ERROR, NCCL_REMOTE_ERROR, NCCL_IN_PROGRESS = 0, 2, 6, 7


def gpu(host="node1:boot-a", bus="0000:3b:00.0", uuid="aa", cc=(9, 0), multi_rank=False):
    return (host, bus, uuid, cc[0], cc[1], multi_rank)


# ---- which ranks share a GPU, and whether NCCL serves them ----------------------------------

def test_distinct_gpus_are_served_by_nccl():
    described, served = rules.shared_gpu([gpu(bus="0000:3b:00.0", uuid="aa"), gpu(bus="0000:5e:00.0", uuid="bb")])
    assert (described, served) == ("", True)


def test_same_uuid_is_one_gpu_and_stages_before_nccl_2_30():
    described, served = rules.shared_gpu([gpu(uuid="aa"), gpu(bus="0000:5e:00.0", uuid="bb"), gpu(uuid="aa")])
    assert not served
    assert described.startswith("ranks 0 and 2 are both on GPU aa (PCI bus 0000:3b:00.0, host node1:boot-a)")


def test_mig_slices_differ_in_uuid_but_share_host_and_bus():
    """NCCL < 2.30 refuses same host + same bus id ("Duplicate GPU detected"), MIG slices too."""
    described, served = rules.shared_gpu([gpu(uuid="MIG-1"), gpu(uuid="MIG-2")])
    assert not served and "MIG-1 and MIG-2 (MIG slices of one GPU)" in described


def test_same_bus_on_two_hosts_is_two_gpus():
    described, served = rules.shared_gpu([gpu(host="node1:boot-a", uuid="aa"), gpu(host="node2:boot-b", uuid="bb")])
    assert (described, served) == ("", True)


def test_nccl_serves_a_shared_gpu_only_when_every_rank_enabled_multi_rank_mode():
    assert rules.shared_gpu([gpu(multi_rank=True), gpu(multi_rank=True)])[1] is True
    assert rules.shared_gpu([gpu(multi_rank=True), gpu(multi_rank=False)])[1] is False


def test_identity_survives_the_exchange():
    for identity in (gpu(), gpu(host="NCCL|HOSTID|with|bars", cc=(8, 6), multi_rank=True), gpu(host="", bus="", uuid="")):
        assert rules.decode_identity(rules.encode_identity(identity)) == identity
    for garbage in ("", "a|b|c", "h|b|u|9|1", "h|b|u|9.x|1", "h|b|u|9.0|2"):
        with pytest.raises(ValueError, match="bad GPU identity"):
            rules.decode_identity(garbage)


# ---- float8 reductions ----------------------------------------------------------------------

@pytest.mark.parametrize("ccs,refused", [
    ([(9, 0)], False), ([(10, 0), (9, 0)], False), ([(8, 0)], True), ([(8, 9)], True),  # A100, L4
    ([(9, 0), (8, 6)], True),  # NCCL checks the lowest capability of the communicator
])
def test_fp8_reductions_need_every_gpu_at_sm90(ccs, refused):
    low = rules.min_compute_capability([gpu(cc=cc) for cc in ccs])
    assert low == min(major * 10 + minor for major, minor in ccs)
    refusal = rules.fp8_reduction_refusal(True, low)
    assert bool(refusal) == refused
    if refused:
        assert f"the lowest in this group is {low // 10}.{low % 10}" in refusal


def test_fp8_reductions_need_nccl_2_24():
    assert "NCCL >= 2.24" in rules.fp8_reduction_refusal(False, 90)


# ---- polling a nonblocking communicator against a deadline -----------------------------------

def test_poll_returns_once_nccl_settles():
    assert rules.poll_while_in_progress([NCCL_IN_PROGRESS] * 3 + [NCCL_SUCCESS], NCCL_IN_PROGRESS, NCCL_SUCCESS,
                                        step_ms=10, deadline_ms=1000) == ("done", NCCL_SUCCESS, 4, 30)


def test_poll_reports_an_error_at_once():
    assert rules.poll_while_in_progress([NCCL_IN_PROGRESS, NCCL_REMOTE_ERROR], NCCL_IN_PROGRESS, NCCL_SUCCESS,
                                        step_ms=10, deadline_ms=1000) == ("failed", NCCL_REMOTE_ERROR, 2, 10)


def test_poll_gives_up_at_the_deadline_when_a_rank_never_comes():
    outcome, code, polls, elapsed = rules.poll_while_in_progress([NCCL_IN_PROGRESS], NCCL_IN_PROGRESS, NCCL_SUCCESS,
                                                                 step_ms=7, deadline_ms=100)
    assert (outcome, code) == ("timed out", NCCL_IN_PROGRESS)
    assert 100 <= elapsed < 107 and polls == elapsed // 7 + 1


def test_poll_stops_when_an_abort_is_requested_meanwhile():
    """abort() of a communicator whose launch is waiting on ncclInProgress ends the wait at once,
    not at the op's deadline (the abort itself waits for the launch to release the handle)."""
    assert rules.poll_while_in_progress([NCCL_IN_PROGRESS], NCCL_IN_PROGRESS, NCCL_SUCCESS, step_ms=10,
                                        deadline_ms=60_000, cancel_after=3) == ("cancelled", NCCL_IN_PROGRESS, 3, 20)


def test_poll_of_a_finished_call_asks_once():
    assert rules.poll_while_in_progress([NCCL_SUCCESS], NCCL_IN_PROGRESS, NCCL_SUCCESS, 10, 0) == ("done", 0, 1, 0)


# ---- split_group: ncclCommSplit's color and key ----------------------------------------------

NOCOLOR = -1


def test_split_args_pair_the_members_of_each_new_group():
    """Members of one new group share a color, distinct from every other group's (their lowest
    parent rank; the groups are disjoint); the key is the member's position in the list as given
    (torch 2.14+ keeps the caller's order; earlier torches pass the list sorted)."""
    splits = [[0, 2, 5], [1, 3], [4]]
    args = {rank: rules.split_args(group, rank, NOCOLOR) for group in splits for rank in group}
    assert args == {0: (0, 0), 2: (0, 1), 5: (0, 2), 1: (1, 0), 3: (1, 1), 4: (4, 0)}
    unsorted = [[5, 0, 2], [3, 1], [4]]
    args = {rank: rules.split_args(group, rank, NOCOLOR) for group in unsorted for rank in group}
    assert args == {5: (0, 0), 0: (0, 1), 2: (0, 2), 3: (1, 0), 1: (1, 1), 4: (4, 0)}


def test_ranks_outside_every_new_group_still_take_part_without_a_color():
    assert rules.split_args([], 3, NOCOLOR) == (NOCOLOR, 0)        # in no new group (or refused)
    assert rules.split_args([0, 1], 3, NOCOLOR) == (NOCOLOR, 0)    # a list without this rank


# ---- teardown --------------------------------------------------------------------------------

@pytest.mark.parametrize("cause,broken,expected", [
    ("shutdown", False, "drain then destroy"),  # destroy_process_group lets queued work finish
    ("shutdown", True, "abort"),                # nothing queued will finish on a failed group
    ("destructor", False, "abort"),             # never shut down: abort, as ProcessGroupNCCL does
    ("abort", False, "abort"),
])
def test_teardown(cause, broken, expected):
    assert rules.teardown_for(cause, broken) == expected


# ---- set-up keys: per run, deleted once read ---------------------------------------------------

def test_key_names_carry_the_device_and_the_rank():
    assert rules.unique_id_key(0) == "nccl/device0/uid"
    assert rules.identity_key(1, 3) == "nccl/device1/identity/rank3"
    keys = {rules.unique_id_key(d) for d in range(3)} | {rules.identity_key(d, r) for d in range(3) for r in range(4)}
    assert len(keys) == 15


def bootstrap_runs(rank, world_size, store_path, runs):
    """`runs` groups made one after the other on one persistent FileStore under one prefix (a store
    a job hands init_process_group again): each connects (no stale listener address from the run
    before), its set-up broadcast returns this run's blob (not the last run's id under the same
    key), the key is gone once every rank has read it, and the run counter says which run it was."""
    extension = torch_ddp_lite._load_extension()
    store = dist.FileStore(store_path, world_size)
    job = dist.PrefixStore("persistent-job", store)
    out = []
    for run in range(runs):
        backend = extension.create_backend(job, rank, world_size, datetime.timedelta(seconds=60))
        blob = extension.bootstrap_broadcast(backend, rules.unique_id_key(0), f"id of run {run}".encode(), 0)
        dist.barrier()  # every rank has read it (the default group: another store prefix)
        held = extension.bootstrap_holds(backend, rules.unique_id_key(0))
        out.append((blob.decode(), held, job.add(f"ddplite/runs/size{world_size}", 0)))
        backend.shutdown()
        dist.barrier()
    return out


@pytest.mark.parametrize("world_size", [1, 2, 3])
def test_each_run_on_a_reused_store_gets_its_own_keys_and_leaves_none(world_size):
    with tempfile.TemporaryDirectory(prefix="ddplite-bootstrap-") as folder:
        results = run_ranks(bootstrap_runs, world_size, os.path.join(folder, "store"), 3)
    for rank_runs in results:
        assert rank_runs == [(f"id of run {run}", False, (run + 1) * world_size) for run in range(3)], rank_runs


def test_rules_are_in_every_build():
    """The CPU-only build has them too (setup.py compiles csrc/cuda/rules always)."""
    assert "nccl_rules" in dir(torch_ddp_lite._load_extension())


# ---- shrink_group: ncclCommShrink or a new communicator ---------------------------------------

@pytest.mark.parametrize("built,loaded,usable,abort,expected", [
    (True, (2, 28, 3), True, False, ("shrink parent", 0)),      # NCCL_SHRINK_DEFAULT
    (True, (2, 27, 0), True, True, ("shrink parent", 1)),       # SHRINK_ABORT -> NCCL_SHRINK_ABORT
    (False, (2, 28, 3), True, False, ("new communicator", 0)),  # built against nccl.h < 2.27
    (True, (2, 26, 5), True, False, ("new communicator", 0)),   # torch's libnccl < 2.27 at run time
    (True, (3, 0, 0), True, False, ("shrink parent", 0)),
    (True, (2, 28, 3), False, True, ("new communicator", 0)),   # parent aborted (watchdog) or failed
])
def test_shrink_plan(built, loaded, usable, abort, expected):
    how, flags, why = rules.shrink_plan(built, loaded, usable, abort)
    assert (how, flags) == expected and why


# ---- a rank's sends to itself in one NCCL group ---------------------------------------------

@pytest.mark.parametrize("ops,unpaired", [
    ([(True, 0, 20), (False, 0, 20)], []),                       # torch's ring at world size 1
    ([(False, 0, 20), (True, 0, 20)], []),                       # the receive first: still one pair
    ([(True, 0, 20)], [0]),                                      # no receive: NCCL would fail the group
    ([(False, 0, 20)], [0]),
    ([(True, 0, 20), (False, 0, 24)], [0, 1]),                   # sizes differ
    ([(True, 0, 8), (True, 0, 16), (False, 0, 8)], [1]),         # the second send has no receive
    ([(True, 0, 8), (True, 0, 16), (False, 0, 16), (False, 0, 8)], [0, 1, 2, 3]),  # paired in order only
    ([(True, 0, 8), (False, 1, 8)], [0, 1]),                     # two GPUs: two communicators
    ([(True, 0, 8), (True, 1, 8), (False, 1, 8), (False, 0, 8)], []),
    ([], []),
])
def test_self_ops_pair_in_order_per_gpu_and_size(ops, unpaired):
    assert rules.unpaired_self_ops(ops) == unpaired
