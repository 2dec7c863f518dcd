"""Training that survives a lost rank: the survivors shrink the group in place and finish.

    python examples/train_fault_tolerant.py --nproc 4 --kill-rank 2 --kill-at-step 6

torchrun ends every worker when one fails, so this script is its own launcher. It hosts the
store (a TCPStore in this process, so it outlives any rank) and starts --nproc ranks on this
host. Rank --kill-rank SIGKILLs itself at global step --kill-at-step, standing in for a crash or
an OOM kill. The others:

1. see DistBackendError in that step's backward (its gradients are dropped, no optimizer step);
2. agree on who is gone: torch_ddp_lite.failed_ranks() (the same list on every survivor);
3. shrink the default group: dist.shrink_group(failed) (ranks renumbered 0..N-2);
4. wrap the model in a new DistributedDataParallel and re-shard the DistributedSampler over the
   survivors, and carry on from the step that failed (same epoch, same step index).

--checkpoint-at-shrink PATH saves the state the survivors carry on from; --resume PATH starts a
fresh run (of --nproc ranks) from such a file. A 3-rank run resumed from the checkpoint of a 4-rank
run that lost a rank ends with bitwise the same parameters (tests/test_fault_tolerant_example.py).

The same training runs under torchrun, which ends every rank when one dies and, with
--max-restarts, starts them all again; --checkpoint makes rank 0 save after every step and a started
run resume from that file (scripts/recovery_cost.py compares the two ways on this job):

    torchrun --standalone --nproc-per-node 4 --max-restarts 1 examples/train_fault_tolerant.py \
        --worker --kill-rank 2 --kill-at-step 6 --checkpoint /tmp/every_step.pt

--loader-workers N gives each rank N forked DataLoader workers, alive when a rank dies.

    python examples/train_fault_tolerant.py --torchft --replicas 2 --kill-replica 1 --kill-at-step 6

--torchft runs the job as torchft replica groups instead (pip install torchft): this process hosts
torchft's lighthouse and starts --replicas replica groups of one rank each, whose collectives run on
torch_ddp_lite.torchft.ProcessGroupDdplite. Replica --kill-replica SIGKILLs itself at step
--kill-at-step; the launcher restarts it, as a per-replica torchrun --max-restarts would. The live
replica drops that step (its all_reduce failed), goes on alone while at least --min-replicas replicas
are in the quorum, and the restarted one heals: torchft's Manager copies a live replica's state into
it, and the two train on together. At the end every replica holds bitwise the same parameters.
With --min-replicas 2 the live replica waits for the restarted one instead, and the job ends with the
parameters of a run without the kill.
"""

import argparse
import os
import signal
import subprocess
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset


def say(line):
    """One write per line: the ranks share the terminal (and torchrun may run them unbuffered, where
    print writes the text and its newline apart and another rank's line can land between them)."""
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nproc", type=int, default=4, help="ranks to start")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=32, help="per rank")
    parser.add_argument("--samples", type=int, default=2048)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--kill-rank", type=int, default=-1, help="this rank SIGKILLs itself (-1: none)")
    parser.add_argument("--kill-at-step", type=int, default=6, help="global step (counted from 0)")
    parser.add_argument("--checkpoint-at-shrink", metavar="PATH", help="the new rank 0 saves the state it resumes from")
    parser.add_argument("--resume", metavar="PATH", help="start from a --checkpoint-at-shrink file")
    parser.add_argument("--save-params", metavar="PATH", help="the final rank 0 writes the final parameters here")
    parser.add_argument("--checkpoint", metavar="PATH",
                        help="rank 0 saves the state after every step; a (re)started run resumes from it if it exists "
                             "(for torchrun --max-restarts: scripts/recovery_cost.py)")
    parser.add_argument("--loader-workers", type=int, default=0,
                        help="DataLoader worker processes per rank (forked, kept alive for the epoch)")
    parser.add_argument("--report-times", action="store_true",
                        help="print the kill's and each rank's first step after it as wall-clock times")
    parser.add_argument("--torchft", action="store_true", help="run as torchft replica groups (see above)")
    parser.add_argument("--replicas", type=int, default=2, help="--torchft: replica groups to start")
    parser.add_argument("--min-replicas", type=int, default=1, help="--torchft: smallest quorum that trains")
    parser.add_argument("--steps", type=int, default=40, help="--torchft: steps to train")
    parser.add_argument("--kill-replica", type=int, default=-1, help="--torchft: this replica SIGKILLs itself")
    parser.add_argument("--min-step-seconds", type=float, default=0.25,
                        help="--torchft: pads each step to this long, as a real model's step would take (so that a "
                             "restarted replica is back before the job ends)")
    parser.add_argument("--process-group", choices=["ddplite", "gloo"], default="ddplite",
                        help="--torchft: ProcessGroupDdplite, or torchft's own ProcessGroupGloo (an oracle)")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--replica-id", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--lighthouse", help=argparse.SUPPRESS)
    parser.add_argument("--restarted", action="store_true", help=argparse.SUPPRESS)
    return parser.parse_args()


def dataset(samples, seed):
    """A learnable 4-class problem: 32 features, class-dependent means plus noise."""
    generator = torch.Generator().manual_seed(seed)
    means = torch.randn(4, 32, generator=generator) * 0.3
    labels = torch.randint(0, 4, (samples,), generator=generator)
    return TensorDataset(means[labels] + torch.randn(samples, 32, generator=generator), labels)


def make_model(seed):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 4))


def loader_for(data, args, epoch):
    """The DistributedSampler over the current group: re-made after a shrink."""
    sampler = DistributedSampler(data, num_replicas=dist.get_world_size(), rank=dist.get_rank(), shuffle=True,
                                 seed=args.seed, drop_last=True)
    sampler.set_epoch(epoch)
    return DataLoader(data, batch_size=args.batch_size, sampler=sampler, drop_last=True,
                      num_workers=args.loader_workers, persistent_workers=args.loader_workers > 0,
                      multiprocessing_context="fork" if args.loader_workers > 0 else None)


def save_checkpoint(path, module, optimizer, epoch, step, global_step):
    """Written whole or not at all (a rename), so a kill mid-save leaves the previous one."""
    torch.save({"model": module.state_dict(), "optimizer": optimizer.state_dict(), "epoch": epoch, "step": step,
                "global_step": global_step}, f"{path}.tmp")
    os.replace(f"{path}.tmp", path)


def recover(model, optimizer, args, epoch, step, global_step, error, started):
    """After a collective raised: agree on the lost ranks, shrink, and re-wrap the model."""
    import torch_ddp_lite

    noticed = time.monotonic() - started
    optimizer.zero_grad(set_to_none=True)  # this step's gradients may be half-reduced
    failed = torch_ddp_lite.failed_ranks()
    old_rank, old_size = dist.get_rank(), dist.get_world_size()
    dist.shrink_group(failed)
    say(f"rank {old_rank}/{old_size}: lost rank(s) {failed} at step {global_step} ({type(error).__name__} after "
        f"{noticed:.2f} s); carrying on as rank {dist.get_rank()}/{dist.get_world_size()} "
        f"{time.monotonic() - started:.2f} s after the step began")
    if args.checkpoint_at_shrink and dist.get_rank() == 0:
        save_checkpoint(args.checkpoint_at_shrink, model.module, optimizer, epoch, step, global_step)
    return DistributedDataParallel(model.module)


def train(args):
    import torch_ddp_lite  # noqa: F401  (registers the backend with older torch)

    host, port = os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])
    rank, size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    store = dist.TCPStore(host, port, is_master=False)  # hosted by the launcher: it outlives any rank
    dist.init_process_group("ddplite", store=store, rank=rank, world_size=size)
    torch.set_num_threads(1)
    data = dataset(args.samples, args.seed)
    module = make_model(args.seed)
    optimizer = torch.optim.SGD(module.parameters(), lr=0.05, momentum=0.9)
    epoch, first_step, global_step = 0, 0, 0
    restarts = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))  # torchrun's attempt number
    under_torchrun = "TORCHELASTIC_RUN_ID" in os.environ
    resume = args.resume or (args.checkpoint if args.checkpoint and os.path.exists(args.checkpoint) else None)
    recovering = restarts > 0  # report the first step of a restarted run
    if resume:
        state = torch.load(resume, weights_only=True)
        module.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        epoch, first_step, global_step = state["epoch"], state["step"], state["global_step"]
    model = DistributedDataParallel(module)
    loss_fn, loss = nn.CrossEntropyLoss(), None
    while epoch < args.epochs:
        step = first_step
        loader = loader_for(data, args, epoch)  # kept: its workers live for the epoch
        batches = list(loader)
        while step < len(batches):
            images, labels = batches[step]
            if rank == args.kill_rank and global_step == args.kill_at_step and restarts == 0:
                if args.report_times:
                    say(f"rank {rank}: SIGKILL at t={time.time():.3f}")
                os.kill(os.getpid(), signal.SIGKILL)
            started = time.monotonic()
            try:
                loss = loss_fn(model(images), labels)
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
            except dist.DistBackendError as error:
                if under_torchrun:
                    raise  # torchrun ends every rank and (--max-restarts) starts them again: no shrink
                model = recover(model, optimizer, args, epoch, step, global_step, error, started)
                loader = loader_for(data, args, epoch)  # re-sharded over the survivors
                batches, recovering = list(loader), True
                continue  # the same step again, on the survivors' shards
            optimizer.step()
            step += 1
            global_step += 1
            if args.checkpoint and dist.get_rank() == 0:
                save_checkpoint(args.checkpoint, model.module, optimizer, epoch, step, global_step)
            if recovering and args.report_times:
                say(f"rank {rank}: first step after the failure done at t={time.time():.3f}")
            recovering = False
        epoch, first_step = epoch + 1, 0
        if dist.get_rank() == 0 and loss is not None:
            say(f"epoch {epoch}: loss {loss.item():.4f} on {dist.get_world_size()} ranks")
    if args.save_params and dist.get_rank() == 0:
        torch.save([p.detach().clone() for p in model.module.parameters()], args.save_params)
    dist.destroy_process_group()


def launch(args):
    """Hosts the store and starts the ranks; returns 0 when every rank but the killed one finished."""
    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(store.port), WORLD_SIZE=str(args.nproc))
    command = [sys.executable, os.path.abspath(__file__), "--worker", *sys.argv[1:]]
    started = time.monotonic()
    ranks = [subprocess.Popen(command, env=dict(env, RANK=str(rank))) for rank in range(args.nproc)]
    codes = [rank.wait() for rank in ranks]
    finished = [rank for rank, code in enumerate(codes) if code == 0]
    lost = [rank for rank, code in enumerate(codes) if code != 0]
    print(f"done: ranks {finished} finished, rank(s) {lost} lost (exit codes {[codes[r] for r in lost]}), "
          f"wall={time.monotonic() - started:.1f}s", flush=True)
    expected_lost = [args.kill_rank] if 0 <= args.kill_rank < args.nproc else []
    return 0 if lost == expected_lost else 1


def replica_batch(data, args, replica, step):
    """Replica ``replica``'s batch at ``step``: a function of the step alone, so that a step the
    quorum dropped is retried on the same data, and a healed replica takes the step its peers take."""
    generator = torch.Generator().manual_seed(args.seed * 1_000_003 + step * 1009 + replica)
    indices = torch.randint(0, len(data), (args.batch_size,), generator=generator)
    return data[indices]


def make_torchft_process_group(args, timeout):
    if args.process_group == "gloo":
        from torchft.process_group import ProcessGroupGloo

        return ProcessGroupGloo(timeout=timeout)
    from torch_ddp_lite.torchft import ProcessGroupDdplite

    return ProcessGroupDdplite(timeout=timeout)


def train_torchft(args):
    """One replica group of one rank: torchft's Manager, DistributedDataParallel and optimizer
    wrapper around the same model as the shrink mode; the step counter is the Manager's."""
    from datetime import timedelta

    from torchft import Manager
    from torchft.ddp import DistributedDataParallel as FaultTolerantDDP
    from torchft.optim import OptimizerWrapper

    torch.set_num_threads(1)
    replica = args.replica_id
    data = dataset(args.samples, args.seed)
    module = make_model(args.seed)
    optimizer = torch.optim.SGD(module.parameters(), lr=0.05, momentum=0.9)
    # The replica group's own store (a group of one rank here); torchft prefixes it per quorum.
    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    manager = Manager(
        pg=make_torchft_process_group(args, timedelta(seconds=10)),
        min_replica_size=args.min_replicas,
        load_state_dict=lambda state: (module.load_state_dict(state["model"]),
                                       optimizer.load_state_dict(state["optimizer"])),
        state_dict=lambda: {"model": module.state_dict(), "optimizer": optimizer.state_dict()},
        replica_id=f"replica_{replica}",
        store_addr="127.0.0.1", store_port=store.port, rank=0, world_size=1,
        lighthouse_addr=args.lighthouse,
        timeout=timedelta(seconds=10), quorum_timeout=timedelta(seconds=60),
    )
    if not args.restarted:  # the first quorum has every replica (as a scheduler starts a job's replicas together)
        start_line = dist.TCPStore("127.0.0.1", int(os.environ["DDPLITE_EXAMPLE_START_PORT"]), is_master=False,
                                   timeout=timedelta(seconds=60))
        if start_line.add("ready", 1) == args.replicas:
            start_line.set("ready/all", "1")
        start_line.wait(["ready/all"])
    model = FaultTolerantDDP(manager, module)
    wrapped = OptimizerWrapper(manager, optimizer)
    loss_fn = nn.CrossEntropyLoss()
    while manager.current_step() < args.steps:
        step = manager.current_step()
        began = time.monotonic()
        images, labels = replica_batch(data, args, replica, step)
        wrapped.zero_grad()  # starts this step's quorum
        loss = loss_fn(model(images), labels)
        if replica == args.kill_replica and step == args.kill_at_step and not args.restarted:
            manager.wait_quorum()  # dies inside the quorum: the others' all_reduce of this step fails
            os.kill(os.getpid(), signal.SIGKILL)
        loss.backward()
        time.sleep(max(0.0, args.min_step_seconds - (time.monotonic() - began)))
        wrapped.step()  # commits only if every replica in the quorum reduced this step's gradients
        committed = manager.current_step() > step
        outcome = "committed" if committed else "not committed (a replica failed, or too few in the quorum): retried"
        if committed and manager.current_step() > step + 1:
            outcome = f"healed from a live replica, now at step {manager.current_step()}"
        sys.stdout.write(f"replica {replica} step {step}: loss {loss.item():.4f}, {manager.num_participants()} "
                         f"replica(s) in the quorum, {outcome}\n")  # one write: replicas share the terminal
        sys.stdout.flush()
    if args.save_params:
        torch.save([p.detach().clone() for p in module.parameters()], f"{args.save_params}.replica{replica}")
    manager.shutdown(wait=False)


def launch_torchft(args):
    """Hosts torchft's lighthouse, starts the replica groups and restarts a killed one once;
    returns 0 when every replica finished and all hold bitwise the same parameters."""
    from torchft._torchft import LighthouseServer

    import tempfile

    # join_timeout: how long a quorum waits for a replica that heartbeats but has not asked to join
    # (one starting up); heartbeat_timeout: how soon a dead one is left out.
    lighthouse = LighthouseServer(bind="[::]:0", min_replicas=args.min_replicas, join_timeout_ms=3000,
                                  heartbeat_timeout_ms=1000)
    scratch = tempfile.TemporaryDirectory(prefix="ddplite-torchft-")
    if not args.save_params:  # the replicas' parameters are compared at the end in any case
        args.save_params = os.path.join(scratch.name, "params")
        sys.argv += ["--save-params", args.save_params]
    start_line = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    env = dict(os.environ, DDPLITE_EXAMPLE_START_PORT=str(start_line.port))
    command = [sys.executable, os.path.abspath(__file__), "--worker", *sys.argv[1:],
               "--lighthouse", lighthouse.address()]
    started = time.monotonic()
    replicas = {i: subprocess.Popen(command + ["--replica-id", str(i)], env=env) for i in range(args.replicas)}
    codes, restarted = {}, set()
    while len(codes) < args.replicas:
        for replica, process in replicas.items():
            code = process.poll()
            if code is None or replica in codes:
                continue
            if code == -signal.SIGKILL and replica not in restarted:
                print(f"launcher: replica {replica} was killed; restarting it", flush=True)
                restarted.add(replica)
                replicas[replica] = subprocess.Popen(command + ["--replica-id", str(replica), "--restarted"], env=env)
            else:
                codes[replica] = code
        time.sleep(0.05)
    lighthouse.shutdown()
    agree = False
    if all(code == 0 for code in codes.values()):
        params = [torch.load(f"{args.save_params}.replica{i}", weights_only=True) for i in range(args.replicas)]
        agree = all(torch.equal(a, b) for other in params[1:] for a, b in zip(params[0], other))
        print(f"replicas hold bitwise the same parameters: {'yes' if agree else 'NO'}", flush=True)
    scratch.cleanup()
    print(f"done: exit codes {[codes[i] for i in range(args.replicas)]}, restarted {sorted(restarted)}, "
          f"wall={time.monotonic() - started:.1f}s", flush=True)
    return 0 if agree else 1


if __name__ == "__main__":
    arguments = parse_args()
    if arguments.worker:
        train_torchft(arguments) if arguments.torchft else train(arguments)
    else:
        sys.exit(launch_torchft(arguments) if arguments.torchft else launch(arguments))
