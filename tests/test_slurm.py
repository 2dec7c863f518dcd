"""A real Slurm cluster: Debian's slurm-wlm and munge, run as a site runs them.

slurmctld runs on a head host and one slurmd on each of two node hosts (2 CPUs each); each host
is a network namespace on one bridge (tests/test_multihost.py's, 10.231.0.0/24) with a host name and an /etc/hosts of its own
(a UTS and a mount namespace). They are entered with ``nsenter --net``, not ``ip netns exec``,
which remounts /sys and hides the cgroup tree slurmd reads. munged runs here with a key of its
own; slurm.conf uses auth/munge, select/cons_tres, proctrack/linuxproc and task/none, and
mpi.conf gives each node's PMIx a directory of its own (a bind mount: PMIx on a shared /tmp
collides). Jobs are submitted from the head host as a user would:

* ``srun -N2 --ntasks-per-node=2 python examples/train_cifar10.py``: one 4-rank job, equal bit for
  bit to the same training on one host whose all_reduce adds in the same order;
* ``sbatch`` of a script that runs one torchrun per node through ``srun``;
* ``srun --mpi=pmix`` with ``init_method="mpi://"``;
* a batch script that forgets ``srun``: it stops at once, saying so;
* gloo under srun: torch's own env:// error, as without torch-ddp-lite.

Needs root, ``ip netns``, ``unshare``/``nsenter`` and the Slurm and munge daemons
(``scripts/setup.sh`` installs slurmd, slurmctld, slurm-client and munge where apt-get works);
skipped with the reason otherwise. Everything is torn down, processes and namespaces, even when a
test fails.
"""

import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time

import pytest
import torch

from test_cifar10 import FEW_STEPS, REPO, command, load_checkpoint, rank_environment
from test_multihost import GOOD_NET as NET, Hosts

HOSTS = ["head", "node0", "node1"]  # the namespaces of Hosts(3), in order
PROGRAMS = ["ip", "unshare", "nsenter", "munged", "slurmctld", "slurmd", "srun", "sbatch", "sinfo"]

# Enters a host: its own UTS and mount namespaces (host name, /etc/hosts, bind mounts), then its
# network namespace. Arguments: host name, hosts file, netns, "SRC:DST ..." binds, command...
ENTER = ('set -e; hostname "$1"; mount --bind "$2" /etc/hosts; for b in $4; do mount --bind "${b%%:*}" "${b#*:}"; done; '
         'ns="$3"; shift 4; exec nsenter --net=/run/netns/"$ns" "$@"')


def unavailable():
    missing = [program for program in PROGRAMS if shutil.which(program) is None]
    if missing:
        return f"missing {', '.join(missing)} (scripts/setup.sh installs slurmd slurmctld slurm-client munge)"
    if os.geteuid() != 0:
        return "network namespaces and the Slurm daemons need root"
    probe = f"ddplslprobe{os.getpid()}"
    if subprocess.run(["ip", "netns", "add", probe], capture_output=True).returncode != 0:
        return "'ip netns add' is not permitted here"
    subprocess.run(["ip", "netns", "del", probe], capture_output=True)
    probe_mounts = "mount --bind /etc/hosts /etc/hosts && hostname ddplite-probe"
    if subprocess.run(["unshare", "--mount", "--uts", "sh", "-c", probe_mounts], capture_output=True).returncode != 0:
        return "'unshare --mount --uts' with a bind mount and a host name is not permitted here"
    if os.path.exists("/sys/fs/cgroup/cgroup.controllers") and not os.access("/sys/fs/cgroup", os.W_OK):
        return "cgroup v2 mounted read-only: slurmd cannot start its cgroup plugin"
    return None


_UNAVAILABLE = unavailable()
pytestmark = pytest.mark.skipif(_UNAVAILABLE is not None, reason=f"needs a Slurm cluster: {_UNAVAILABLE}")


class SlurmCluster:
    """The cluster above, in `folder`; `run` and `start` execute on the head host."""

    def __init__(self, folder):
        self.folder = folder
        self.daemons = []
        self.network = Hosts(len(HOSTS), dead_end=False)  # eth0 only: Open MPI's TCP tries every interface
        self.netns = dict(zip(HOSTS, self.network.names))
        try:
            self._configure()
            self._start_daemons()
        except BaseException:
            self.destroy()
            raise

    def path(self, *parts):
        return os.path.join(self.folder, *parts)

    def _configure(self):
        os.makedirs(self.path("bin"), exist_ok=True)
        if not os.path.exists(self.path("bin", "python")):
            os.symlink(sys.executable, self.path("bin", "python"))
        for folder in ["munge", "state", "log", "pmix", "pmix/node0", "pmix/node1", "spool/node0", "spool/node1"]:
            os.makedirs(self.path(folder), exist_ok=True)
        os.chmod(self.path("munge"), 0o711)
        with open(self.path("munge", "munge.key"), "wb") as key:
            key.write(os.urandom(1024))
        os.chmod(self.path("munge", "munge.key"), 0o600)
        with open(self.path("hosts"), "w") as hosts:
            hosts.write("127.0.0.1 localhost\n" + "".join(f"{NET}.{i + 1} {host}\n" for i, host in enumerate(HOSTS)))
        nodes = "".join(f"NodeName={host} NodeAddr={NET}.{i + 1} CPUs=2 State=UNKNOWN\n"
                        for i, host in enumerate(HOSTS) if host != "head")
        with open(self.path("slurm.conf"), "w") as conf:
            conf.write(textwrap.dedent(f"""\
                ClusterName=ddplite
                SlurmctldHost=head({NET}.1)
                AuthType=auth/munge
                AuthInfo=socket={self.path("munge", "munge.sock")}
                CredType=cred/munge
                SlurmUser=root
                SlurmdUser=root
                StateSaveLocation={self.path("state")}
                SlurmdSpoolDir={self.path("spool")}/%n
                SlurmctldPidFile={self.path("slurmctld.pid")}
                SlurmdPidFile={self.path("slurmd-%n.pid")}
                SlurmctldLogFile={self.path("log", "slurmctld.log")}
                SlurmdLogFile={self.path("log", "slurmd-%n.log")}
                ProctrackType=proctrack/linuxproc
                TaskPlugin=task/none
                JobAcctGatherType=jobacct_gather/none
                AccountingStorageType=accounting_storage/none
                SelectType=select/cons_tres
                SelectTypeParameters=CR_Core
                MpiDefault=none
                ReturnToService=2
                KillWait=2
                SlurmdParameters=config_overrides
                """) + nodes + "PartitionName=debug Nodes=node0,node1 Default=YES MaxTime=INFINITE State=UP\n")
        with open(self.path("cgroup.conf"), "w") as conf:  # cgroup v2 without systemd's dbus: carry on
            conf.write("IgnoreSystemdOnFailure=yes\n")
        with open(self.path("mpi.conf"), "w") as conf:  # the path each node's bind mount covers
            conf.write(f"PMIxCliTmpDirBase={self.path('pmix', 'here')}\n")
        os.makedirs(self.path("pmix", "here"), exist_ok=True)

    def command(self, host, cmd, binds=()):
        return ["unshare", "--mount", "--uts", "sh", "-c", ENTER, "sh", host, self.path("hosts"), self.netns[host],
                " ".join(binds), *cmd]

    def environment(self, **extra):
        env = rank_environment()
        # `python` (the recipes' word) is this interpreter, and torchrun is its own
        env["PATH"] = os.pathsep.join([self.path("bin"), os.path.dirname(sys.executable), env.get("PATH", "")])
        return {**env, "SLURM_CONF": self.path("slurm.conf"), "OMP_NUM_THREADS": "1", **extra}

    def sbatch(self, script, *args, output, **extra_env):
        """sbatch --wait of `script` (a path in the repository) with `args`; (result, its output)."""
        result = self.run(["sbatch", "--wait", f"--chdir={REPO}", f"--output={output}",
                           os.path.join(REPO, script), *args], **extra_env)
        return result, (open(output).read() if os.path.exists(output) else "")

    def _daemon(self, host, cmd, binds=()):
        log = open(self.path("log", f"{os.path.basename(cmd[0])}-{host}.out"), "w")
        self.daemons.append(subprocess.Popen(self.command(host, cmd, binds), stdout=log, stderr=subprocess.STDOUT,
                                             env=self.environment(), start_new_session=True))

    def _start_daemons(self):
        self.daemons.append(subprocess.Popen(
            ["munged", "--foreground", "--force", f"--socket={self.path('munge', 'munge.sock')}",
             f"--key-file={self.path('munge', 'munge.key')}", f"--pid-file={self.path('munge', 'munged.pid')}",
             f"--seed-file={self.path('munge', 'seed')}", f"--log-file={self.path('log', 'munged.log')}"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True))
        self._wait_for(lambda: os.path.exists(self.path("munge", "munge.sock")), "munged's socket")
        conf = self.path("slurm.conf")
        self._daemon("head", ["slurmctld", "-D", "-f", conf])
        for node in ("node0", "node1"):
            self._daemon(node, ["slurmd", "-D", "-N", node, "-f", conf],
                         binds=[f"{self.path('pmix', node)}:{self.path('pmix', 'here')}"])
        self._wait_for(self._nodes_idle, "both nodes idle in sinfo")

    def _nodes_idle(self):
        result = self.run(["sinfo", "--noheader", "--format=%T %D"], timeout=20)
        return result.returncode == 0 and result.stdout.split() == ["idle", "2"]

    def _wait_for(self, condition, what, seconds=60):
        deadline = time.monotonic() + seconds
        while not condition():
            if time.monotonic() > deadline:
                raise RuntimeError(f"the Slurm cluster did not come up: no {what} within {seconds} s; logs in "
                                   f"{self.path('log')}:\n" + self.logs())
            time.sleep(0.2)

    def logs(self):
        text = ""
        for name in sorted(os.listdir(self.path("log"))):
            with open(self.path("log", name), errors="replace") as log:
                text += f"--- {name} ---\n{log.read()[-3000:]}\n"
        return text

    def run(self, cmd, timeout=240, **extra_env):
        """`cmd` on the head host (srun, sbatch, ...); a timeout kills its whole process group."""
        process = subprocess.Popen(self.command("head", cmd), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                   cwd=REPO, env=self.environment(**extra_env), start_new_session=True)
        try:
            stdout, stderr = process.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            stdout, stderr = process.communicate()
            # its job would hold the nodes and keep the next test's job pending
            subprocess.run(self.command("head", ["scancel", "--user=root"]), env=self.environment(), timeout=30)
            raise AssertionError(f"{cmd} did not finish within {timeout} s:\n{stdout}\n{stderr}\n{self.logs()}")
        return subprocess.CompletedProcess(cmd, process.returncode, stdout, stderr)

    def destroy(self):
        for daemon in self.daemons:
            try:
                os.killpg(daemon.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            daemon.wait()
        self.network.destroy()  # and every task the daemons left in the namespaces


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    built = SlurmCluster(str(tmp_path_factory.mktemp("slurm")))
    yield built
    names = [built.network.switch, *built.network.names]
    built.destroy()
    leftover = set(subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout.split()) & set(names)
    assert not leftover, f"namespaces left behind: {leftover}"


@pytest.fixture(scope="module")
def synthetic_dir(tmp_path_factory):
    return str(tmp_path_factory.mktemp("generated-cifar10"))


@pytest.fixture(scope="module")
def one_host_paired_sums(tmp_path_factory, synthetic_dir):
    """The reference of 2 nodes x 2 ranks: their all_reduce is (a0 + a1) + (a2 + a3) (each node in
    rank order, then the two leaders), which butterfly on 4 ranks over TCP on one host adds in the
    same order (tests/test_multihost.py), so the parameters must be the same bit for bit."""
    if _UNAVAILABLE is not None:
        pytest.skip(_UNAVAILABLE)
    run_dir = str(tmp_path_factory.mktemp("one-host"))
    result = subprocess.run(command(run_dir, synthetic_dir, *FEW_STEPS, nproc=4), capture_output=True, text=True,
                            timeout=300, cwd=REPO, env=rank_environment(DDPLITE_CPU_TRANSPORT="tcp",
                                                                        DDPLITE_ALGO="allreduce:butterfly",
                                                                        OMP_NUM_THREADS="1"))
    assert result.returncode == 0, result.stdout + result.stderr[-5000:]
    return load_checkpoint(run_dir)


def done_line(text):
    done = [line for line in text.splitlines() if line.startswith("done:")]
    assert len(done) == 1, text  # one job: only its rank 0 reports
    return done[0]


def test_srun_runs_the_example_as_one_job_across_two_nodes(cluster, tmp_path, synthetic_dir, one_host_paired_sums):
    """examples/slurm/srun.sbatch: srun of the CIFAR example on 2 nodes x 2 tasks, nothing else set."""
    run_dir = str(tmp_path)
    arguments = command(run_dir, synthetic_dir, *FEW_STEPS, nproc=None)[2:]  # the script's arguments
    result, text = cluster.sbatch("examples/slurm/srun.sbatch", *arguments, output=str(tmp_path / "job.out"),
                                  DDPLITE_DEBUG="INFO")
    assert result.returncode == 0, result.stdout + result.stderr + text[-5000:] + cluster.logs()
    assert "launcher=srun world_size=4" in text, text[-5000:]
    assert "the group spans 2 hosts: ranks 0,1 | 2,3" in text, text[-5000:]
    done_line(text)
    reached = load_checkpoint(run_dir)
    assert reached["model"].keys() == one_host_paired_sums["model"].keys()
    for name, tensor in one_host_paired_sums["model"].items():
        assert torch.equal(reached["model"][name], tensor), name


def test_sbatch_with_one_torchrun_per_node(cluster, tmp_path):
    """examples/slurm/torchrun.sbatch: srun starts one torchrun per node, c10d rendezvous on node0."""
    result, text = cluster.sbatch("examples/slurm/torchrun.sbatch", "--epochs", "1", output=str(tmp_path / "job.out"))
    assert result.returncode == 0, result.stdout + result.stderr + text[-5000:] + cluster.logs()
    done = done_line(text)
    assert "backend=ddplite world_size=4" in done and "params_in_sync=True" in done, text


def pmix_unavailable():
    import torch_ddp_lite

    if not torch_ddp_lite.build_info()["mpi"]:
        return "this ddplite was built without MPI"
    if not any(os.path.exists(os.path.join(folder, "libpmix.so"))
               for folder in ("/usr/lib/x86_64-linux-gnu/pmix2/lib", "/usr/lib/x86_64-linux-gnu")):
        return "no libpmix.so for Slurm's mpi/pmix plugin (Debian: libpmix-dev, which libopenmpi-dev brings)"
    return None


def test_srun_with_pmix_and_the_mpi_rendezvous(cluster, tmp_path):
    if pmix_unavailable():
        pytest.skip(pmix_unavailable())
    """examples/slurm/pmix.sbatch: srun --mpi=pmix, init_method="mpi://"; and the same rendezvous
    checked against the closed form, with each rank on its node."""
    result, text = cluster.sbatch("examples/slurm/pmix.sbatch", "--epochs", "1", output=str(tmp_path / "job.out"))
    assert result.returncode == 0, result.stdout + result.stderr + text[-5000:] + cluster.logs()
    done = done_line(text)
    assert "backend=ddplite world_size=4" in done and "params_in_sync=True" in done, text
    result = cluster.run(["srun", "-N2", "--ntasks-per-node=2", "--mpi=pmix", sys.executable, "-c", MPI_JOB])
    assert result.returncode == 0, result.stdout + result.stderr[-5000:] + cluster.logs()
    lines = sorted(line.split() for line in result.stdout.splitlines() if line.startswith("rank "))
    assert lines == [["rank", str(r), "4", "node0" if r < 2 else "node1", "[10.0,", "10.0,", "10.0]"] for r in range(4)]


MPI_JOB = ("import os, torch, torch.distributed as dist\n"
           "dist.init_process_group('ddplite', init_method='mpi://')\n"
           "t = torch.full((3,), float(dist.get_rank() + 1)); dist.all_reduce(t)\n"
           "print('rank', dist.get_rank(), dist.get_world_size(), os.uname().nodename, t.tolist(), flush=True)\n"
           "dist.destroy_process_group()\n")


def test_a_batch_script_that_forgets_srun_stops_at_once(cluster, tmp_path):
    script = tmp_path / "no-srun.sbatch"
    script.write_text("#!/bin/bash\n#SBATCH --ntasks=2\n"
                      f"{sys.executable} -c \"import torch.distributed as dist; dist.init_process_group('ddplite')\"\n")
    output = tmp_path / "job.out"
    started = time.monotonic()
    result = cluster.run(["sbatch", "--wait", f"--chdir={REPO}", f"--output={output}", str(script)])
    assert result.returncode != 0
    text = output.read_text() if output.exists() else ""
    assert "ValueError: ddplite env:// rendezvous: this process is Slurm job" in text, text + cluster.logs()
    assert "Hint: start the tasks with srun" in text
    assert time.monotonic() - started < 60


def test_gloo_under_srun_gets_torchs_own_env_rendezvous(cluster):
    code = "import torch.distributed as dist; dist.init_process_group('gloo')"
    result = cluster.run(["srun", "-N1", "-n1", sys.executable, "-c", code])
    assert result.returncode != 0
    errors = [line for line in result.stderr.splitlines() if line.startswith("ValueError")]
    assert errors == ["ValueError: Error initializing torch.distributed using env:// rendezvous: environment "
                      "variable RANK expected, but not set"], result.stderr[-2000:]
