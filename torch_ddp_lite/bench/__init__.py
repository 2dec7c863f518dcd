"""Benchmarks of ddplite side by side with gloo (and NCCL), measured in one run.

Collectives, nccl-tests style (all seven ops, 8 B to 256 MB in x2 steps, 2 ranks it launches)::

    python -m torch_ddp_lite.bench
    python -m torch_ddp_lite.bench --sizes 16,64K,1M,16M --backends ddplite,ddplite-tcp,gloo,memcpy
    python -m torch_ddp_lite.bench --ops all_reduce --world-size 3 --json ar.json --plot ar.png
    torchrun --nproc-per-node 4 -m torch_ddp_lite.bench --backends ddplite,gloo -b 1K -e 64M -f 4

DDP training step time and images/s (an MLP of 25M parameters and ResNet-18 on 32x32 inputs)::

    python -m torch_ddp_lite.bench ddp --world-size 2

The headline of docs/benchmarks.md (every op and the DDP step, every CPU path, 2 and 4 ranks) is
``python scripts/bench_today.py``, which runs this tool.

How it measures: every backend under test has its own group over all ranks; the default group
(gloo) only synchronises. For each op and size the backends share buffers and take turns in
interleaved rounds, so a change in the machine's load hits all of them. Each iteration is timed
on every rank, the slowest rank's time is kept (as nccl-tests reports), and the median over the
iterations is reported. Bandwidths follow nccl-tests' conventions (see :mod:`.sweep`).

Modules: ``sweep`` (sizes, shapes, bandwidth factors: pure), ``control`` (agreement and
timing across ranks), ``launch`` (ranks, groups, devices), ``collectives`` and ``ddp`` (the two
benchmarks), ``report`` (table, JSON, plot).
"""
