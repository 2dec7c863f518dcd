"""How a shared-memory peer tells that a rank's process has ended, without a descriptor per peer
(common/process_identity.hpp): its (pid, start time, PID namespace), checked in /proc/<pid>/stat.
Real processes: a live one, a zombie, a reaped one, a pid with another start time (what a reused
pid looks like), a name that holds ') ' (the field parsing), another namespace."""

import ctypes
import multiprocessing
import os
import time

import pytest

import torch_ddp_lite

extension = torch_ddp_lite._load_extension()


def state(identity):
    return extension.process_state(*identity)


def identity_of(pid):
    """What the child would publish: the same namespace as ours (a fork), its own start time."""
    with open(f"/proc/{pid}/stat") as file:
        fields = file.read().rsplit(")", 1)[1].split()
    _, _, namespace = extension.this_process_identity()
    return pid, int(fields[19]), namespace


def test_this_process_is_running():
    pid, start_ticks, namespace = extension.this_process_identity()
    assert pid == os.getpid() and start_ticks > 0 and namespace != 0
    assert state((pid, start_ticks, namespace)) == "running"


def test_a_zombie_and_then_a_reaped_process_have_ended():
    pid = os.fork()
    if pid == 0:
        os._exit(0)
    identity = identity_of(pid)
    deadline = time.monotonic() + 10
    while state(identity) != "ended" and time.monotonic() < deadline:  # running until it exits
        time.sleep(0.01)
    with open(f"/proc/{pid}/stat") as file:
        assert file.read().rsplit(")", 1)[1].split()[0] == "Z"  # not reaped yet
    assert state(identity) == "ended"
    os.waitpid(pid, 0)
    assert not os.path.exists(f"/proc/{pid}")
    assert state(identity) == "ended"


def _sleep_named(name, ready):
    libc = ctypes.CDLL(None)
    libc.prctl(15, name, 0, 0, 0)  # PR_SET_NAME: the comm field of /proc/<pid>/stat
    ready.set()
    time.sleep(60)


def test_a_live_process_whatever_its_name_and_a_reused_pid():
    context = multiprocessing.get_context("fork")
    ready = context.Event()
    child = context.Process(target=_sleep_named, args=(b"a) b (c) 1 2", ready), daemon=True)
    child.start()
    try:
        assert ready.wait(10)
        with open(f"/proc/{child.pid}/comm") as file:
            assert file.read().strip() == "a) b (c) 1 2"
        pid, start_ticks, namespace = identity_of(child.pid)
        assert state((pid, start_ticks, namespace)) == "running"
        # The same pid with another start time: the process we knew ended and its pid was reused.
        assert state((pid, start_ticks - 1, namespace)) == "ended"
        # Another PID namespace: the pid means another process there; nothing can be told here.
        assert state((pid, start_ticks, namespace ^ 1)) == "unknown"
        assert state((pid, 0, namespace)) == "unknown"  # a peer that could not read its start time
    finally:
        child.kill()
        child.join()
    assert state((pid, start_ticks, namespace)) == "ended"


def test_no_descriptor_is_kept_per_check():
    pid, start_ticks, namespace = extension.this_process_identity()
    before = len(os.listdir("/proc/self/fd"))
    for _ in range(100):
        state((pid, start_ticks, namespace))
    assert len(os.listdir("/proc/self/fd")) == before


def test_a_process_whose_main_thread_exited_but_another_runs_is_running():
    """The leader's stat says Z as soon as the main thread ends (pthread_exit; or an exit_group
    still ending the other threads, which hold the process's descriptors): not ended until the
    leader is all that is left. A fresh interpreter (no torch), so that nothing in the process
    catches pthread_exit's unwinding."""
    import subprocess
    import sys

    code = ("import ctypes, sys, threading, time\n"
            "threading.Thread(target=time.sleep, args=(60,)).start()\n"
            "print('ready', flush=True)\n"
            "ctypes.CDLL(None).pthread_exit(None)\n")
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "ready"
        identity = identity_of(child.pid)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            with open(f"/proc/{child.pid}/stat") as file:
                if file.read().rsplit(")", 1)[1].split()[0] == "Z":
                    break
            time.sleep(0.01)
        else:
            pytest.skip("the child's main thread did not exit through pthread_exit here")
        assert state(identity) == "running"
    finally:
        child.kill()
        child.wait()
    assert state(identity) == "ended"


def test_a_pid_namespace_whose_proc_shows_other_pids_publishes_no_start_time():
    """unshare --pid without --mount-proc: getpid() is 1 there, but /proc is still the outer
    namespace's, where 1 is another process. The rank then publishes no start time, so its peers
    say "unknown" and watch its TCP socket instead of a stranger's process."""
    import shutil
    import subprocess
    import sys

    if shutil.which("unshare") is None:
        pytest.skip("no unshare(1)")
    code = ("import os, torch_ddp_lite; e = torch_ddp_lite._load_extension(); p, t, n = e.this_process_identity(); "
            "print(os.getpid(), t, e.process_state(p, t, n))")
    done = subprocess.run(["unshare", "--pid", "--fork", sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120)
    if done.returncode != 0 and "Operation not permitted" in done.stderr:
        pytest.skip("unshare --pid is not permitted here")
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split()[-3:] == ["1", "0", "unknown"], done.stdout
