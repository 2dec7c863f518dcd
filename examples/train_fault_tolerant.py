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
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
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
    return DataLoader(data, batch_size=args.batch_size, sampler=sampler, drop_last=True)


def recover(model, optimizer, args, epoch, step, global_step, error, started):
    """After a collective raised: agree on the lost ranks, shrink, and re-wrap the model."""
    import torch_ddp_lite

    noticed = time.monotonic() - started
    optimizer.zero_grad(set_to_none=True)  # this step's gradients may be half-reduced
    failed = torch_ddp_lite.failed_ranks()
    old_rank, old_size = dist.get_rank(), dist.get_world_size()
    dist.shrink_group(failed)
    print(f"rank {old_rank}/{old_size}: lost rank(s) {failed} at step {global_step} ({type(error).__name__} after "
          f"{noticed:.2f} s); carrying on as rank {dist.get_rank()}/{dist.get_world_size()} "
          f"{time.monotonic() - started:.2f} s after the step began", flush=True)
    if args.checkpoint_at_shrink and dist.get_rank() == 0:
        torch.save({"model": model.module.state_dict(), "optimizer": optimizer.state_dict(), "epoch": epoch,
                    "step": step, "global_step": global_step}, args.checkpoint_at_shrink)
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
    if args.resume:
        state = torch.load(args.resume, weights_only=True)
        module.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        epoch, first_step, global_step = state["epoch"], state["step"], state["global_step"]
    model = DistributedDataParallel(module)
    loss_fn = nn.CrossEntropyLoss()
    while epoch < args.epochs:
        step = first_step
        batches = list(loader_for(data, args, epoch))
        while step < len(batches):
            images, labels = batches[step]
            if rank == args.kill_rank and global_step == args.kill_at_step:
                os.kill(os.getpid(), signal.SIGKILL)
            started = time.monotonic()
            try:
                loss = loss_fn(model(images), labels)
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
            except dist.DistBackendError as error:
                model = recover(model, optimizer, args, epoch, step, global_step, error, started)
                batches = list(loader_for(data, args, epoch))  # re-sharded over the survivors
                continue  # the same step again, on the survivors' shards
            optimizer.step()
            step += 1
            global_step += 1
        epoch, first_step = epoch + 1, 0
        if dist.get_rank() == 0:
            print(f"epoch {epoch}: loss {loss.item():.4f} on {dist.get_world_size()} ranks", flush=True)
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


if __name__ == "__main__":
    arguments = parse_args()
    if arguments.worker:
        train(arguments)
    else:
        sys.exit(launch(arguments))
