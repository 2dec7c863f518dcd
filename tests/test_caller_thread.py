"""Where a CPU collective runs, and the TCP transport's spin before it sleeps.

* A collective issued with async_op=False (torch sets opts.asyncOp) runs on the calling thread
  when the group's worker is idle: its caller blocks on it anyway, and the two thread hand-offs it
  saves are most of a small message's time between hosts (DDPLITE_SYNC_ON_CALLER, backend.cpp
  enqueue). An async op still returns at once while a peer is late, on every path.
* A small TCP transfer retries its sockets for DDPLITE_TCP_SPIN_US before it sleeps in poll():
  no result depends on it, and a peer that dies is still reported at once.
* A wait on the thread of a caller that blocks on its op spins up to DDPLITE_CALLER_SPIN_US
  before it sleeps; an async op's wait, on the worker, keeps DDPLITE_TCP_SPIN_US (wait_policy.hpp).
  Unless DDPLITE_CALLER_SPIN_TRIAL=0, the group tries spinning and sleeping by turns and keeps the
  spin only where it made the ops faster (backend/caller_spin_trial.hpp).
* A TCP send() hands the kernel at most DDPLITE_TCP_SEND_CHUNK_BYTES: no result depends on it,
  down to sends that split elements and headers' payloads at odd offsets.
"""

import os
import time

import pytest

import workers
from harness import run_ranks

LATE = 0.4  # seconds rank 1 arrives late at each op


def _late_peer_calls(rank, world_size):
    """Rank 0 times pg.allreduce itself (not wait()) for an async and a sync issue while rank 1
    arrives LATE seconds after it; every rank returns the values it got."""
    import torch
    import torch.distributed as dist

    group = dist.group.WORLD
    seen = {}
    for name, async_op in (("async", True), ("sync", False)):
        tensor = torch.arange(7, dtype=torch.float32) * (rank + 1)
        if rank == 1:
            time.sleep(LATE)
        opts = dist.AllreduceOptions()
        opts.asyncOp = async_op
        start = time.monotonic()
        work = group.allreduce([tensor], opts)
        returned_after = time.monotonic() - start
        done_on_return = work.is_completed()
        work.wait()
        seen[name] = {"returned_after": returned_after, "done_on_return": done_on_return, "values": tensor.tolist()}
    return seen


@pytest.mark.parametrize("transport", ["tcp", "auto"])
@pytest.mark.parametrize("on_caller", ["1", "0"])
def test_a_sync_op_runs_on_the_caller_and_an_async_op_stays_async(transport, on_caller):
    results = run_ranks(_late_peer_calls, 2, env={"DDPLITE_CPU_TRANSPORT": transport,
                                                   "DDPLITE_SYNC_ON_CALLER": on_caller})
    expected = [float(3 * i) for i in range(7)]  # closed form: (1 + 2) * i
    for rank in (0, 1):
        for name in ("async", "sync"):
            assert results[rank][name]["values"] == expected, (rank, name, results[rank][name])
    asynchronous, synchronous = results[0]["async"], results[0]["sync"]
    # async: handed to the worker, the call returns while rank 1 is still away
    assert asynchronous["returned_after"] < LATE / 2 and not asynchronous["done_on_return"], asynchronous
    if on_caller == "1":
        # sync: ran on this thread, so the call itself waited for rank 1 and returned a finished Work
        assert synchronous["returned_after"] > LATE * 0.6 and synchronous["done_on_return"], synchronous
    else:
        assert synchronous["returned_after"] < LATE / 2 and not synchronous["done_on_return"], synchronous


def _collectives_against_closed_forms(rank, world_size):
    """all_reduce (sum, max), broadcast and all_gather of 0, 1, odd and past-the-spin-limit element
    counts in float32 and int64, each checked against its closed form; bitwise gloo agreement for
    the int64 sums."""
    import torch
    import torch.distributed as dist

    gloo = dist.new_group(backend="gloo")
    failures = []
    for dtype in (torch.float32, torch.int64):
        for count in (0, 1, 1001, 70001):  # 70001 * 4 and * 8 bytes: above the 256 KiB spin limit
            base = torch.arange(count, dtype=dtype) % 97
            total = base * (world_size * (world_size + 1) // 2)
            tensor = base * (rank + 1)
            dist.all_reduce(tensor)
            if not torch.equal(tensor, total):
                failures.append(f"all_reduce sum {dtype} {count}")
            if dtype == torch.int64:
                oracle = base * (rank + 1)
                dist.all_reduce(oracle, group=gloo)
                if not torch.equal(oracle, tensor):
                    failures.append(f"gloo disagrees {count}")
            tensor = base + rank
            dist.all_reduce(tensor, op=dist.ReduceOp.MAX)
            if not torch.equal(tensor, base + world_size - 1):
                failures.append(f"all_reduce max {dtype} {count}")
            tensor = base * (rank + 1)
            dist.broadcast(tensor, src=world_size - 1)
            if not torch.equal(tensor, base * world_size):
                failures.append(f"broadcast {dtype} {count}")
            gathered = [torch.empty_like(base) for _ in range(world_size)]
            dist.all_gather(gathered, base + rank)
            if any(not torch.equal(g, base + r) for r, g in enumerate(gathered)):
                failures.append(f"all_gather {dtype} {count}")
            # point to point around the ring (both ways on one socket at 2 ranks)
            received = torch.full_like(base, -1)
            requests = [dist.isend(base * (rank + 1), (rank + 1) % world_size),
                        dist.irecv(received, (rank - 1) % world_size)]
            for request in requests:
                request.wait()
            if not torch.equal(received, base * ((rank - 1) % world_size + 1)):
                failures.append(f"send/recv {dtype} {count}")
    dist.barrier(group=gloo)
    return failures


@pytest.mark.parametrize("spin_us", ["0", "100000"])
@pytest.mark.parametrize("world_size", [2, 3])
def test_tcp_results_do_not_depend_on_the_spin(spin_us, world_size):
    """0: every wait sleeps in poll() at once; 100000: waits of small transfers spin to the end."""
    results = run_ranks(_collectives_against_closed_forms, world_size,
                        env={"DDPLITE_CPU_TRANSPORT": "tcp", "DDPLITE_TCP_SPIN_US": spin_us})
    assert results == [[]] * world_size, results


@pytest.mark.parametrize("chunk_bytes", ["0", "4099"])
@pytest.mark.parametrize("world_size", [2, 3])
def test_tcp_results_do_not_depend_on_the_send_chunk(chunk_bytes, world_size):
    """0: one send() per remaining buffer; 4099: sends that end mid-element (every dtype's size
    divides 4096, not 4099), so a receive completes elements from two sends; with 64 KiB socket
    buffers, which the largest messages (280 and 560 KB) fill, so that the kernel at times takes
    less than a send() offers (an strace of the 2-rank case: 4 short writes and 14 EAGAIN in 1450
    sends) and the cursor must advance by what the kernel took. Nothing here counts them."""
    env = {"DDPLITE_CPU_TRANSPORT": "tcp", "DDPLITE_TCP_SEND_CHUNK_BYTES": chunk_bytes}
    if chunk_bytes != "0":
        env["DDPLITE_SOCKET_BUFFER_BYTES"] = "65536"
    results = run_ranks(_collectives_against_closed_forms, world_size, env=env)
    assert results == [[]] * world_size, results


def test_a_peer_that_exits_is_reported_at_once_while_spinning():
    """Rank 0 spins (up to 0.1 s per wait) for bytes rank 1 never sends: the end of the stream
    ends the spin as it ends a poll()."""
    results = run_ranks(workers.receiver_sees_exit, 2, pg_timeout_s=60, timeout_s=120, may_exit={1},
                        env={"DDPLITE_CPU_TRANSPORT": "tcp", "DDPLITE_TCP_SPIN_US": "100000"})
    result = results[0]
    assert result["type"] == "DistBackendError", result
    assert "rank 1" in result["message"] and "closed the connection" in result["message"], result["message"]
    assert result["seconds"] < 5.0, result


def _ticks_during_a_sync_wait(rank, world_size):
    """How often another Python thread of rank 0 ran while its dist.all_reduce (async_op=False, run
    on the calling thread) waited LATE seconds for rank 1."""
    import threading

    import torch
    import torch.distributed as dist

    ticks, stop = [0], threading.Event()

    def ticker():
        while not stop.is_set():
            ticks[0] += 1
            time.sleep(0.01)

    thread = threading.Thread(target=ticker)
    thread.start()
    tensor = torch.ones(4)
    if rank == 1:
        time.sleep(LATE)
    before = ticks[0]
    dist.all_reduce(tensor)
    during = ticks[0] - before
    stop.set()
    thread.join()
    return {"ticks": during, "values": tensor.tolist()}


@pytest.mark.parametrize("transport", ["tcp", "auto"])
def test_a_sync_op_run_on_the_caller_does_not_hold_the_gil(transport):
    """The op waits for its peer with the GIL released (torch's bindings release it before the
    backend is called), so the process's other Python threads keep running: 0.4 s at a 10 ms tick
    is about 40 ticks."""
    results = run_ranks(_ticks_during_a_sync_wait, 2, env={"DDPLITE_CPU_TRANSPORT": transport})
    assert results[0]["values"] == [2.0] * 4 and results[1]["values"] == [2.0] * 4, results
    assert results[0]["ticks"] >= 10, results[0]


def _stages_of_ops(rank, world_size):
    """work_stages of a finished sync op, of an async op still waiting for rank 1, and of a gloo
    op (rank 1 is LATE at the async one)."""
    import torch
    import torch.distributed as dist
    import torch_ddp_lite

    extension = torch_ddp_lite._load_extension()
    group = dist.group.WORLD
    opts = dist.AllreduceOptions()
    opts.asyncOp = False
    work = group.allreduce([torch.ones(3)], opts)
    work.wait()
    finished = extension.work_stages(work)
    if rank == 1:
        time.sleep(LATE)
    pending = group.allreduce([torch.ones(3)])  # async: handed to the worker
    try:
        extension.work_stages(pending) if rank == 0 else None
        early = "no error"
    except ValueError as error:
        early = str(error)
    pending.wait()
    gloo = dist.new_group(backend="gloo")
    gloo_work = gloo.allreduce([torch.ones(3)])
    gloo_work.wait()
    return {"finished": list(finished), "early": early, "gloo": extension.work_stages(gloo_work)}


def test_work_stages_are_ordered_and_only_read_once_the_op_completed():
    results = run_ranks(_stages_of_ops, 2, env={"DDPLITE_CPU_TRANSPORT": "tcp"})
    for result in results:
        issued, running, ran, finished = result["finished"]
        assert 0 < issued <= running <= ran <= finished, result
        assert result["gloo"] is None, result
    assert "has not completed yet; call work.wait() first" in results[0]["early"], results[0]


# The thread's run time, which tells a spin from a sleep (CONFIG_SCHED_INFO; absent in some sandboxes).
needs_schedstat = pytest.mark.skipif(not os.path.exists("/proc/thread-self/schedstat"),
                                     reason="no /proc/<pid>/task/<tid>/schedstat on this kernel")


@needs_schedstat
@pytest.mark.parametrize("caller_spin_us", ["100000", "0"])
def test_a_blocked_caller_spins_through_a_late_peer_and_the_worker_sleeps(caller_spin_us):
    """Rank 1 comes 5 ms late to each of 20 all_reduces over TCP. A sync op runs on rank 0's
    thread, which spins up to DDPLITE_CALLER_SPIN_US (always: DDPLITE_CALLER_SPIN_TRIAL=0): with 100 ms it runs through the wait (its
    CPU time per op is most of the 5 ms; 5.3 ms here) and does not sleep; with 0 (the async spin,
    50 us) it sleeps in poll() once per op and runs 0.2 ms. The async ops run on the worker, which
    keeps the 50 us spin whatever the caller's (0.04-0.12 ms per op here; with
    DDPLITE_TCP_SPIN_US=100000 it ran 5.2 ms, so the measure sees a spinning worker): that check
    tells something only with the caller's spin set."""
    late_s = 0.005
    results = run_ranks(workers.sleeps_while_a_peer_is_late, 2, 1, late_s,
                        env={"DDPLITE_CPU_TRANSPORT": "tcp", "DDPLITE_CALLER_SPIN_US": caller_spin_us,
                             "DDPLITE_CALLER_SPIN_TRIAL": "0"})
    assert all(result["right"] for result in results), results
    sync, asynchronous = results[0]["sync"], results[0]["async"]
    if caller_spin_us == "0":
        assert sync["sleeps"] >= 0.9 and sync["cpu_s"] < 0.2 * late_s, sync
    else:
        assert sync["sleeps"] <= 0.5 and sync["cpu_s"] > 0.15 * late_s, sync
    assert asynchronous["cpu_s"] < 0.2 * late_s, asynchronous


@needs_schedstat
def test_the_trial_keeps_a_blocked_caller_sleeping_where_spinning_does_not_make_ops_faster():
    """As above with DDPLITE_CALLER_SPIN_US=100000 and the trial on (its default), rank 1 100 ms
    late to every op: a spin does not bring the late rank sooner, so the trial, over the first 30
    sync ops (it fills by the 26th), finds spinning no faster (its median within 0.9x of
    sleeping's) and the 10 ops after it sleep once each and run for a fraction of the 100 ms, as
    with no caller spin at all. 100 ms: a wake-up that a loaded machine delays by 2-8 ms stays far
    inside the 10% margin (with 20 ms, one busy process beside the test made the trial keep the
    spin in 3 runs of 8)."""
    late_s = 0.1
    results = run_ranks(workers.sleeps_while_a_peer_is_late, 2, 1, late_s, 10, 30,
                        env={"DDPLITE_CPU_TRANSPORT": "tcp", "DDPLITE_CALLER_SPIN_US": "100000"})
    assert all(result["right"] for result in results), results
    sync = results[0]["sync"]
    assert sync["sleeps"] >= 0.9 and sync["cpu_s"] < 0.1 * late_s, sync


def _trial(measured, ops):
    import torch_ddp_lite

    return torch_ddp_lite._load_extension().caller_spin_trial(measured, ops)


PERIOD, BLOCK, TRIAL_OPS = 256, 8, 8  # backend/caller_spin_trial.hpp


def _thue_morse_spins(seq):
    return bin(seq // BLOCK).count("1") % 2 == 0


def test_the_trial_takes_turns_in_blocks_and_keeps_the_faster_side():
    """Ops 1..PERIOD-1 of one period, every op timed 100 us spinning and 200 us sleeping: the trial
    runs its blocks by the Thue-Morse rule until each side has TRIAL_OPS timed ops that followed
    one of the same side (the first op of a block is not timed), then every op spins; with the
    times swapped every op after the trial sleeps."""
    for spin_us, sleep_us, kept in ((100.0, 200.0, True), (200.0, 100.0, False)):
        seqs = list(range(1, PERIOD))
        spun = _trial(True, [(seq, spin_us, sleep_us) for seq in seqs])
        timed = {True: 0, False: 0}
        end = None
        for index, seq in enumerate(seqs):
            if end is None:
                assert spun[index] == _thue_morse_spins(seq), (seq, spun[:index + 1])
                if index > 0 and spun[index - 1] == spun[index]:
                    timed[spun[index]] += 1
                if min(timed.values()) >= TRIAL_OPS:
                    end = index + 1
        assert end is not None and end < 6 * BLOCK, end
        assert all(choice == kept for choice in spun[end:]), (kept, spun[end:])


def test_the_trial_keeps_sleeping_within_its_margin_and_without_measurement_always_spins():
    """Spinning at 0.95x sleeping's time is not enough (the margin is 0.9x); at 0.85x it is. With
    measured=False (DDPLITE_CALLER_SPIN_TRIAL=0) every op spins whatever the times."""
    seqs = range(1, PERIOD)
    assert not any(_trial(True, [(seq, 95.0, 100.0) for seq in seqs])[6 * BLOCK:])
    assert all(_trial(True, [(seq, 85.0, 100.0) for seq in seqs])[6 * BLOCK:])
    assert all(_trial(False, [(seq, 500.0, 1.0) for seq in seqs]))


def test_the_first_op_after_a_switch_is_not_timed():
    """The first op of each block waits out the peers' previous op, run the other way: it is not
    timed. From sequence number 1, with sleeping faster: spinning's 8th timed op is seq 26 (block 0
    times seqs 2-7, block 3 from seq 25), so seqs 25 and 26 still spin by their block's turn and
    every op after them sleeps. Timing every op would have ended the trial at seq 24 (seqs 1-7 and
    24), and seqs 25-26 would sleep."""
    spun = _trial(True, [(seq, 200.0, 100.0) for seq in range(1, PERIOD)])
    assert spun[:26] == [_thue_morse_spins(seq) for seq in range(1, 27)], spun[:26]
    assert spun[24] and spun[25]
    assert not any(spun[26:]), spun[26:]


def test_each_period_tries_again_and_a_period_of_few_ops_takes_turns_throughout():
    """Period 1 finds spinning faster and spins after its trial; period 3 finds sleeping faster and
    sleeps after its trial. Period 2 has one op per block, too few to fill a trial: every one of
    them takes its block's turn."""
    ops = [(seq, 100.0, 200.0) for seq in range(PERIOD, 2 * PERIOD)]
    sparse = [(seq, 100.0, 200.0) for seq in range(2 * PERIOD + 3, 3 * PERIOD, BLOCK)]
    ops += sparse
    ops += [(seq, 300.0, 100.0) for seq in range(3 * PERIOD, 4 * PERIOD)]
    spun = _trial(True, ops)
    assert all(spun[6 * BLOCK:PERIOD]), spun[:PERIOD]
    assert spun[PERIOD:PERIOD + len(sparse)] == [_thue_morse_spins(seq) for seq, _, _ in sparse]
    third = spun[PERIOD + len(sparse):]
    assert not any(third[6 * BLOCK:]), third
