"""Command line of the benchmark; see the package docstring (``python -m torch_ddp_lite.bench -h``)."""

import argparse
import os
import sys

import torch

from torch_ddp_lite.bench import collectives, ddp
from torch_ddp_lite.bench.launch import BACKEND_VARIANTS, MEMCPY, launcher_ranks, run_ranks
from torch_ddp_lite.bench.sweep import EXTRA_OPS, OPS, parse_size, parse_size_list, size_sweep


def comma_list(text):
    return [item.strip() for item in text.split(",") if item.strip()]


def size_list(text):
    try:
        return parse_size_list(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def common_options():
    """Options shared by the collectives and the ddp benchmarks."""
    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("--backends", type=comma_list, default=None,
                        help="comma list, the first is compared with the others "
                             "(default: ddplite,gloo on cpu; ddplite,nccl,gloo on cuda). ddplite-mpi is ddplite "
                             "with DDPLITE_CPU_TRANSPORT=mpi (MPI's collectives; launch with mpirun); "
                             "ddplite-unchecked is ddplite with DDPLITE_FINGERPRINT=0 (to measure the check); "
                             "ddplite-generic is ddplite with DDPLITE_CPU_KERNELS=generic (baseline reduction kernels); "
                             "ddplite-shm is ddplite with DDPLITE_CPU_TRANSPORT=shm (shared memory); ddplite-flat "
                             "and ddplite-tree pin DDPLITE_SHM_SYNC (how shared-memory steps synchronise); ddplite-ondemand and "
                             "ddplite-atinit pin DDPLITE_CONNECT (across hosts: gather, scatter and all_to_all through "
                             "the hosts' leaders, or flat over TCP); ddplite-handoff hands every op to the worker "
                             "thread and sleeps in poll() at once on TCP (DDPLITE_SYNC_ON_CALLER=0, "
                             "DDPLITE_TCP_SPIN_US=0); ddplite-leaders carries every all_reduce across hosts "
                             "through the hosts' leaders, never on rails (DDPLITE_RAILS_BYTES=0); ddplite-wholesend hands "
                             "the kernel a whole buffer per send() on TCP (DDPLITE_TCP_SEND_CHUNK_BYTES=0); ddplite-xspin and "
                             "ddplite-nospin set both waits' spins (DDPLITE_SHM_SPIN_US, DDPLITE_TCP_SPIN_US) to 3000 "
                             "and 0 us; memcpy is the "
                             "reference: every rank copies the same bytes between two of its own buffers at once "
                             "(algbw = busbw = bytes / time)")
    parser.add_argument("--world-size", type=int, default=2,
                        help="ranks to launch (ignored under torchrun or mpirun, which set it)")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                        help="where the tensors live; cuda ranks share the visible GPUs round-robin")
    parser.add_argument("--algo", default=None,
                        help="pins ddplite's algorithms by setting DDPLITE_ALGO, e.g. allreduce:ring,broadcast:tree")
    parser.add_argument("--json", metavar="FILE", help="write the result rows to FILE as JSON")
    parser.add_argument("--timeout", type=float, default=900, help="process-group timeout in seconds")
    return parser


def add_collectives(subcommands, common):
    parser = subcommands.add_parser(
        "collectives", parents=[common], prog="python -m torch_ddp_lite.bench [collectives]",
        help="collectives swept over sizes (the default subcommand)",
        description="Collectives swept over sizes on several backends in one run, nccl-tests style.")
    parser.add_argument("--ops", type=comma_list, default=list(OPS), help=f"comma list of: {', '.join(OPS)} (the default); also {', '.join(EXTRA_OPS)}")
    parser.add_argument("--min-bytes", "-b", type=parse_size, default=8, help="smallest size (K/M/G suffixes)")
    parser.add_argument("--max-bytes", "-e", type=parse_size, default=parse_size("256M"), help="largest size")
    parser.add_argument("--step-factor", "-f", type=int, default=2, help="multiply the size by this each step")
    parser.add_argument("--sizes", type=size_list, default=None, metavar="LIST",
                        help="comma list of sizes to measure instead of the -b/-e/-f sweep, e.g. 8,64K,1M,16M")
    parser.add_argument("--dtype", default="float32", help="torch dtype name (float32, bfloat16, int64, ...)")
    parser.add_argument("--min-iters", type=int, default=5, help="fewest measured iterations per point and backend")
    parser.add_argument("--max-iters", type=int, default=1000, help="most measured iterations per point and backend")
    parser.add_argument("--time-per-point", type=float, default=0.25,
                        help="seconds of measured iterations per point and backend (within the bounds above)")
    parser.add_argument("--warmup-iters", type=int, default=5,
                        help="most warm-up iterations per point and backend (within a quarter of --time-per-point)")
    parser.add_argument("--rounds", type=int, default=10, help="interleaved rounds the iterations are split into")
    parser.add_argument("--plot", metavar="FILE.png", help="write busbw and latency against size to FILE.png")
    parser.add_argument("--breakdown", action="store_true",
                        help="after the tables, where a ddplite all_reduce's time goes at each size: the "
                             "Python call, the hand-off to the thread that runs it, the collective itself, "
                             "the completion and the return (medians over the slowest rank's iterations)")
    parser.set_defaults(parser=parser, check=check_collectives, entry=collectives.run)


def add_ddp(subcommands, common):
    parser = subcommands.add_parser(
        "ddp", parents=[common], prog="python -m torch_ddp_lite.bench ddp", help="DDP training step time",
        description="DDP training step time and images/s of the same models and data under each backend.")
    parser.add_argument("--models", type=comma_list, default=list(ddp.MODELS),
                        help=f"comma list of: {', '.join(ddp.MODELS)}")
    parser.add_argument("--batch-size", type=int, default=32, help="images per rank and step")
    parser.add_argument("--steps", type=int, default=20, help="measured steps per model and backend")
    parser.add_argument("--warmup-steps", type=int, default=3, help="unmeasured steps first (at least 1)")
    parser.add_argument("--rounds", type=int, default=2, help="interleaved rounds the steps are split into")
    parser.set_defaults(parser=parser, check=check_ddp, entry=ddp.run)


SUBCOMMANDS = ("collectives", "ddp")


def build_parser():
    parser = argparse.ArgumentParser(
        prog="python -m torch_ddp_lite.bench",
        description="ddplite against other torch.distributed backends, measured in one interleaved run. "
                    "'collectives' (the default when no subcommand is given) sweeps collectives over sizes; "
                    "'ddp' times DDP training steps. '<subcommand> -h' lists each one's options.")
    subcommands = parser.add_subparsers(dest="command", metavar="{collectives,ddp}")
    common = common_options()
    add_collectives(subcommands, common)
    add_ddp(subcommands, common)
    return parser


def known_backends(device):
    """The backends (and ddplite variants) --backends may name on `device`, with why others are out."""
    import torch.distributed as dist

    import torch_ddp_lite

    known = ["ddplite", "gloo", "ddplite-tcp", "ddplite-shm", "ddplite-unchecked", "ddplite-generic", "ddplite-flat",
             "ddplite-tree", "ddplite-ondemand", "ddplite-atinit", "ddplite-handoff", "ddplite-leaders",
             "ddplite-wholesend", "ddplite-xspin", "ddplite-nospin", "ddplite-callerspin", "ddplite-spintrial", MEMCPY]
    if torch_ddp_lite.build_info()["mpi"]:
        known.append("ddplite-mpi")
    if dist.is_mpi_available():
        known.append("mpi")
    if device == "cuda":
        known.append("nccl")
    assert set(known) - {"ddplite", "gloo", "mpi", "nccl", MEMCPY} <= set(BACKEND_VARIANTS)
    return known


def check_launch(parser, options):
    """--backends names backends that exist here, each once; --world-size is a positive count."""
    if options.backends is not None:
        known = known_backends(options.device)
        if hasattr(options, "models"):
            known.remove(MEMCPY)  # the ddp benchmark trains models: no memcpy reference there
        unknown = [name for name in options.backends if name not in known]
        if unknown:
            parser.error(f"--backends: {', '.join(unknown)} not available here; choose from {', '.join(known)} "
                         "(nccl needs --device cuda, ddplite-mpi a ddplite built with MPI, mpi a torch built with MPI)")
        if not options.backends or len(set(options.backends)) != len(options.backends):
            parser.error("--backends: name at least one backend, each once")
    if launcher_ranks() is None and options.world_size < 1:
        parser.error(f"--world-size {options.world_size}: need at least 1 rank")


def check_output_folders(parser, options):
    """Refuses output files in missing folders now, not after the whole measurement."""
    for path in (options.json, getattr(options, "plot", None)):
        if path and not os.path.isdir(os.path.dirname(os.path.abspath(path))):
            parser.error(f"the folder of {path} does not exist")


def check_collectives(parser, options):
    unknown = [op for op in options.ops if op not in OPS + EXTRA_OPS]
    if unknown:
        parser.error(f"unknown op(s) {', '.join(unknown)}; known: {', '.join(OPS + EXTRA_OPS)}")
    if options.sizes is None:
        try:
            size_sweep(options.min_bytes, options.max_bytes, options.step_factor)
        except ValueError as error:
            parser.error(str(error))
    if not isinstance(getattr(torch, options.dtype, None), torch.dtype):
        parser.error(f"--dtype {options.dtype} is not a torch dtype")
    if options.plot and options.ops == ["barrier"]:
        parser.error("--plot needs an op with a size axis (barrier is a single latency)")
    if not 1 <= options.min_iters <= options.max_iters or options.rounds < 1 or options.warmup_iters < 1:
        parser.error("need 1 <= --min-iters <= --max-iters, --rounds >= 1 and --warmup-iters >= 1")


def check_ddp(parser, options):
    unknown = [model for model in options.models if model not in ddp.MODELS]
    if unknown:
        parser.error(f"unknown model(s) {', '.join(unknown)}; known: {', '.join(ddp.MODELS)}")
    if options.steps < 1 or options.warmup_steps < 1 or options.rounds < 1:
        parser.error("need --steps, --warmup-steps and --rounds >= 1")


def main(argv):
    parser = build_parser()
    if not argv or argv[0] not in (*SUBCOMMANDS, "-h", "--help"):
        argv = ["collectives", *argv]  # the default subcommand
    options = parser.parse_args(argv)
    # what the subcommand set; not part of the options the ranks receive (they are pickled)
    subparser, check, entry = options.parser, options.check, options.entry
    del options.parser, options.check, options.entry
    check(subparser, options)
    check_launch(subparser, options)
    check_output_folders(subparser, options)
    if options.backends is None:
        options.backends = ["ddplite", "gloo"] if options.device == "cpu" else ["ddplite", "nccl", "gloo"]
    return run_ranks(entry, options)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
