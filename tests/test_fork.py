"""Forked children (DataLoader workers, os.fork) and a ddplite group.

fork() copies every descriptor: a child that keeps a copy of a rank's sockets keeps its connections
open after the rank dies, and its peers then see nothing until the child exits too (a DataLoader
worker notices a dead parent after about 5 s; gloo's peers wait that long). ddplite closes its
sockets in every forked child (common/fork_guard.hpp), and a child that inherits a group can neither
use it nor, on its way out, harm its parent's.
"""

import pytest
import torch

import fork_workers
from harness import run_ranks

TRANSPORTS = ["tcp", "auto"]  # auto: shared memory on this host


@pytest.mark.parametrize("collective", ["all_reduce", "recv"])
@pytest.mark.parametrize("transport", TRANSPORTS)
def test_a_killed_rank_is_noticed_at_once_while_its_dataloader_workers_live(tmp_path, transport, collective):
    """Rank 2 of 3 holds two persistent DataLoader workers (forked) and is SIGKILLed while the
    others wait for it. Its workers still run, yet each survivor raises DistBackendError naming
    rank 2 well before the workers could notice (about 5 s) and far from the 60 s group timeout."""
    results = run_ranks(fork_workers.killed_with_live_dataloader_workers, 3, 2, str(tmp_path / "killed_at"),
                        collective, pg_timeout_s=60, timeout_s=120, may_exit={2},
                        env={"DDPLITE_CPU_TRANSPORT": transport})
    for rank in (0, 1):
        outcome = results[rank]
        assert outcome["raised"] == "DistBackendError", (rank, outcome)
        assert "rank 2" in outcome["message"], (rank, outcome["message"])
        assert outcome["after_kill"] < 2.0, (rank, outcome)


def test_a_killed_rank_is_noticed_by_its_process_while_another_holds_its_sockets(tmp_path):
    """Rank 2 of 3 gives copies of all its sockets to a process it starts (pass_fds through exec:
    no fork handler closes them), then is SIGKILLed while the others wait in a shared-memory
    all_reduce. Its connections stay open, yet each survivor raises DistBackendError naming rank
    2 within 2 s: the segment's waits watch the peer's process (pidfd), not only its socket."""
    results = run_ranks(fork_workers.killed_while_another_process_holds_its_sockets, 3, 2, str(tmp_path / "killed_at"),
                        pg_timeout_s=60, timeout_s=120, may_exit={2}, env={"DDPLITE_CPU_TRANSPORT": "auto"})
    for rank in (0, 1):
        outcome = results[rank]
        assert outcome["sockets_held"] >= 2 and outcome["holder_alive"], (rank, outcome)
        assert outcome["raised"] == "DistBackendError", (rank, outcome)
        assert "rank 2" in outcome["message"] and "process ended" in outcome["message"], (rank, outcome["message"])
        assert outcome["after_kill"] < 2.0, (rank, outcome)


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_a_forked_child_cannot_use_the_group_and_leaves_the_parents_intact(transport):
    """Rank 0 forks a child that tries an all_reduce and a send on the inherited group (each raises
    DistBackendError saying why), then runs the interpreter-exit hook and destroy_process_group and
    exits 0. The parent's group is untouched: an all_reduce and a send/recv give their closed forms."""
    results = run_ranks(fork_workers.forked_child_uses_the_group, 2, pg_timeout_s=60, timeout_s=120,
                        env={"DDPLITE_CPU_TRANSPORT": transport})
    child = results[0]["child"]
    assert child["exit"] == 0, child
    assert len(child["calls"]) == 2, child
    for call, op in zip(child["calls"], ["allreduce", "send"]):
        assert call.startswith("DistBackendError: "), call
        assert f"ddplite rank 0/2, {op} #" in call, call
        assert "is a fork of the one that created the process group" in call and "Hint:" in call, call
    for rank, result in enumerate(results):
        assert torch.equal(result["sum"], torch.full((1001,), 3.0)), (rank, result["sum"][:4])
    assert torch.equal(results[1]["received"], torch.arange(7.0)), results[1]["received"]


def test_a_child_forked_while_a_pair_connects_on_demand_holds_none_of_its_sockets():
    """Sockets made on demand are registered with the fork guard when they are
    created (socket(), accept4()), not after the handshake: a child forked during the handshake
    (each side holds its hello a second, DDPLITE_TEST_HOOKS=tcp_hello_delay) holds none of them,
    else it would keep the connection open after its rank died."""
    env = {"DDPLITE_CPU_TRANSPORT": "tcp", "DDPLITE_CONNECT": "on_demand", "DDPLITE_TEST_HOOKS": "tcp_hello_delay=1000"}
    results = run_ranks(fork_workers.fork_during_a_handshake, 2, env=env, pg_timeout_s=30, timeout_s=120)
    for rank, outcome in enumerate(results):
        assert outcome["parent_held"] >= 1, (rank, outcome)  # forked while the handshake was under way
        assert outcome["child_held"] == 0, (rank, outcome)
        assert outcome["sum"] == 3.0, (rank, outcome)
