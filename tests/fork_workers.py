"""Rank bodies for tests/test_fork.py: ranks with forked children (DataLoader workers, os.fork)."""

import multiprocessing
import os
import signal
import time

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, TensorDataset


def killed_with_live_dataloader_workers(rank, world_size, victim, kill_time_path, collective):
    """`victim` starts two persistent DataLoader workers (forked: they hold copies of every
    descriptor it had), then SIGKILLs itself while the others wait in `collective`. Each survivor
    reports what it raised and how long after the kill."""
    tensor = torch.ones(256)
    dist.all_reduce(tensor)
    loader = None
    if rank == victim:
        # The harness's ranks are daemonic multiprocessing children, which multiprocessing forbids
        # to start children of their own; a training script's rank is not.
        multiprocessing.current_process()._config["daemon"] = False
        loader = DataLoader(TensorDataset(torch.arange(64.0)), batch_size=8, num_workers=2, persistent_workers=True,
                            multiprocessing_context="fork")
        next(iter(loader))  # the workers are up (and stay: persistent)
    dist.barrier()
    if rank == victim:
        time.sleep(0.5)  # the survivors are waiting in the collective by now
        with open(kill_time_path + ".tmp", "w") as out:
            out.write(repr(time.time()))
        os.rename(kill_time_path + ".tmp", kill_time_path)
        os.kill(os.getpid(), signal.SIGKILL)
    try:
        if collective == "all_reduce":
            dist.all_reduce(tensor)
        else:  # a recv from the victim (its send never comes)
            dist.recv(tensor, src=victim)
        return {"raised": None}
    except Exception as error:  # noqa: BLE001
        raised_at = time.time()
        for _ in range(100):  # the victim wrote the file before killing itself
            if os.path.exists(kill_time_path):
                break
            time.sleep(0.01)
        with open(kill_time_path) as source:
            killed_at = float(source.read())
        return {"raised": type(error).__name__, "message": str(error), "after_kill": raised_at - killed_at}


def killed_while_another_process_holds_its_sockets(rank, world_size, victim, kill_time_path):
    """`victim` starts a process that holds copies of all its sockets (`sleep`, given them with
    pass_fds: inherited through exec, where no fork handler runs), then SIGKILLs itself while the
    others wait in an all_reduce. Its connections stay open, so only its process tells that it
    is gone. Each survivor reports what it raised and how long after the kill; rank 0 then ends
    the holder."""
    import subprocess

    tensor = torch.ones(256)
    dist.all_reduce(tensor)
    if rank == victim:
        sockets = []
        for fd in os.listdir("/proc/self/fd"):
            try:
                if os.readlink(f"/proc/self/fd/{fd}").startswith("socket:"):
                    sockets.append(int(fd))
            except FileNotFoundError:  # the listing's own descriptor, closed by now
                pass
        holder = subprocess.Popen(["sleep", "120"], pass_fds=sockets)
        with open(kill_time_path + ".holder", "w") as out:
            out.write(f"{holder.pid} {len(sockets)}")
    dist.barrier()
    if rank == victim:
        time.sleep(0.5)
        with open(kill_time_path + ".tmp", "w") as out:
            out.write(repr(time.time()))
        os.rename(kill_time_path + ".tmp", kill_time_path)
        os.kill(os.getpid(), signal.SIGKILL)
    try:
        dist.all_reduce(tensor)
        outcome = {"raised": None}
    except Exception as error:  # noqa: BLE001
        raised_at = time.time()
        for _ in range(100):
            if os.path.exists(kill_time_path):
                break
            time.sleep(0.01)
        with open(kill_time_path) as source:
            killed_at = float(source.read())
        outcome = {"raised": type(error).__name__, "message": str(error), "after_kill": raised_at - killed_at}
    with open(kill_time_path + ".holder") as source:
        holder_pid, outcome["sockets_held"] = (int(word) for word in source.read().split())
    outcome["holder_alive"] = os.path.exists(f"/proc/{holder_pid}")
    if rank == 0:
        time.sleep(0.2)  # the other survivor has looked too
        os.kill(holder_pid, signal.SIGKILL)
    return outcome


def forked_child_uses_the_group(rank, world_size):
    """Rank 0 forks a child that (1) calls a collective and a send on the inherited group, (2) runs
    what destroy_process_group and interpreter exit run, and exits. The parent's group must be
    untouched: every rank then runs an all_reduce and a send/recv whose values are known."""
    child = None
    if rank == 0:
        read_end, write_end = os.pipe()
        child = os.fork()
        if child == 0:
            os.close(read_end)
            outcome = []
            for call in (lambda: dist.all_reduce(torch.ones(4)), lambda: dist.send(torch.ones(4), dst=1)):
                try:
                    call()
                    outcome.append("no error")
                except Exception as error:  # noqa: BLE001
                    outcome.append(f"{type(error).__name__}: {error}")
            import torch_ddp_lite

            torch_ddp_lite._C.stop_all_for_exit()  # what its atexit hook runs
            dist.destroy_process_group()
            os.write(write_end, "\x00".join(outcome).encode())
            os.close(write_end)
            os._exit(0)
        os.close(write_end)
        chunks = []
        while chunk := os.read(read_end, 65536):
            chunks.append(chunk)
        os.close(read_end)
        _, status = os.waitpid(child, 0)
        child_outcome = {"exit": os.waitstatus_to_exitcode(status), "calls": b"".join(chunks).decode().split("\x00")}
    dist.barrier()
    tensor = torch.full((1001,), float(rank + 1))
    dist.all_reduce(tensor)
    message = torch.arange(7.0) + 10 * rank
    if rank == 0:
        dist.send(message, dst=1)
        received = None
    elif rank == 1:
        received = torch.zeros(7)
        dist.recv(received, src=0)
    result = {"sum": tensor, "received": received}
    if rank == 0:
        result["child"] = child_outcome
    return result


def fork_during_a_handshake(rank, world_size):
    """DDPLITE_CONNECT=on_demand over TCP with DDPLITE_TEST_HOOKS=tcp_hello_delay=1000: the first
    all_reduce's connects (both ranks connect to each other) hold their hello for a second, while
    each rank's acceptor holds the peer's connection in its handshake. Each rank forks (as a
    DataLoader worker would) in that window. Returns the established TCP sockets the child held
    (fork_guard must have closed every one, registered since its socket() or accept4()), those the
    parent held then (the window was real), and the sum."""
    from scale_workers import _sockets

    tensor = torch.full((10,), float(rank + 1))
    work = dist.all_reduce(tensor, async_op=True)
    time.sleep(0.4)
    read_end, write_end = os.pipe()
    child = os.fork()
    if child == 0:  # one thread here: count, report, leave without running any cleanup
        try:
            os.write(write_end, str(_sockets()).encode())
        finally:
            os._exit(0)
    os.close(write_end)
    parent_held = _sockets()
    child_held = int(os.read(read_end, 64).decode())
    os.close(read_end)
    os.waitpid(child, 0)
    work.wait()
    return {"child_held": child_held, "parent_held": parent_held, "sum": tensor[0].item()}
