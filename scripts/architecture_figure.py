"""Draws docs/img/architecture.png: the parts of csrc/ as boxes and which part includes which as
arrows (A -> B: a file of A includes a header of B). The figure's source is this file; the page that
explains it is docs/architecture.md.

    python3 scripts/architecture_figure.py [--out docs/img/architecture.png]

matplotlib only (no graphviz). The boxes and arrows below are written by hand from the #include
lines of csrc/; when a part starts including another, add the arrow here and in
docs/architecture.md ("The parts"), and rerun.
"""

import argparse
import os

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.patches import FancyArrowPatch, FancyBboxPatch  # noqa: E402
from matplotlib.path import Path  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Colours by role.
ENTRY = "#e4d7f5"     # Python and pybind
FRONT = "#cfe3f7"     # the c10d::Backend
CUDA = "#d5efd0"      # CUDA tensors
ORCHESTRA = "#fde3c4"  # the CPU path and the tensor-level collectives
DATAPATH = "#fff3b0"  # shared memory, hierarchy, send/recv
BLOCKS = "#dfe5ec"    # algorithms, transport, kernels
BAR = "#eeeeee"       # included by (almost) everyone

# Grid: three columns (A, B, C) with channels between them for the arrows, seven rows.
A, B, C = 0.6, 5.1, 9.6   # left edges; every column is 3.7 wide, the channels 0.8
W = 3.7
ROWS = {1: 9.0, 2: 7.55, 3: 6.2, 4: 4.8, 5: 3.4, 6: 2.0, 7: 0.6}  # bottom edge of each row
H = 0.8

# name: (x, y, width, height, colour, title, detail); x, y is the lower-left corner.
BOXES = {
    "python": (A, ROWS[1], W, 0.85, ENTRY, "torch_ddp_lite/",
               "Python; _ddplite_autoload.py registers\n\"ddplite\" for cpu and cuda"),
    "bindings": (B, ROWS[1], W, 0.85, ENTRY, "bindings.cpp",
                 "the user's surface (pybind); also pins,\nkernel sets, MPI init, interfaces"),
    "test_hooks": (C, ROWS[1], W, 0.85, ENTRY, "test_hooks.cpp",
                   "pybind used only by tests/; includes\nwhat it tests (shm, transport, ...)"),
    "backend": (A, ROWS[2], B + W - A, 0.95, FRONT, "backend/",
                "DdpliteBackend (backend.cpp), DdpliteWork, Worker, validation, coalescing, flight recorder,\n"
                "arrival recorder, monitored barrier, failures.cpp (shrink, failed_ranks), settings_agreement.cpp"),
    "cuda": (C, ROWS[2], W, 0.95, CUDA, "cuda/  (+ cuda/rules/)",
             "NcclPath, NcclComm, NcclWork, watchdog,\nStagedPath (a GPU two ranks share)"),
    "health": (10.2, ROWS[3], 3.1, H, FRONT, "health/",
               "the live status server: one\nlistener + thread per process"),
    "cpu_path": (B, ROWS[3], W, H, ORCHESTRA, "cpu/cpu_path",
                 "CpuPath: one per group; builds and owns\nthe meshes, segments, hierarchy, engine"),
    "collectives": (A, ROWS[4], W, H, ORCHESTRA, "cpu/collectives",
                    "tensors -> bytes; runCollective picks\nMPI, hierarchy, shm or a TCP algorithm"),
    "mpi": (C, ROWS[4], W, H, ORCHESTRA, "cpu/mpi_collectives",
            "MPI's own collectives\n(DDPLITE_CPU_TRANSPORT=mpi)"),
    "hierarchy": (A, ROWS[5], W, H, DATAPATH, "cpu/hierarchy/",
                  "HostHierarchy, *_hierarchical.cpp: a\nsegment per host, leaders over TCP"),
    "p2p": (C, ROWS[5], W, H, DATAPATH, "cpu/p2p/",
            "send/recv: P2pEngine (pumps), P2pLinks,\nShmChannels (rings in shared memory)"),
    "shm": (B, ROWS[6], W, H, DATAPATH, "cpu/shm/",
            "one host: ShmSegment, ShmGroup, arrival\ntree, futex, the one-host algorithms"),
    "reduce": (A, ROWS[7], W, H, BLOCKS, "cpu/reduce/",
               "reduction kernels: one body compiled\ngeneric, AVX2, AVX-512"),
    "algorithms": (B, ROWS[7], W, H, BLOCKS, "cpu/algorithms/",
                   "one algorithm per file over Transport;\nselector.cpp: the rule and the pins"),
    "transport": (C, ROWS[7], W, H, BLOCKS, "cpu/transport/",
                  "Transport, TcpTransport (at init or on\ndemand), fingerprint, auth, RankView"),
}

# (from, to, kind, route): "main" = files of A include B's headers; "api" = A uses B's types or one
# header only; "back" = against the flow. The route is the polyline, arrowhead at its end.
ARROWS = [
    ("python", "bindings", "main", [(4.3, 9.42), (5.1, 9.42)]),
    ("bindings", "test_hooks", "main", [(8.8, 9.42), (9.6, 9.42)]),
    ("bindings", "backend", "main", [(6.95, 9.0), (6.95, 8.5)]),
    ("test_hooks", "backend", "api", [(10.4, 9.0), (10.4, 8.75), (8.2, 8.75), (8.2, 8.5)]),
    ("backend", "cuda", "main", [(8.8, 8.25), (9.6, 8.25)]),
    ("cuda", "backend", "back", [(10.0, 7.55), (10.0, 7.33), (8.45, 7.33), (8.45, 7.55)]),
    ("backend", "cpu_path", "main", [(6.95, 7.55), (6.95, 7.0)]),
    ("backend", "health", "main", [(8.65, 7.55), (8.65, 7.15), (11.6, 7.15), (11.6, 7.0)]),
    ("health", "transport", "api", [(13.3, 6.6), (13.5, 6.6), (13.5, 1.0), (13.3, 1.0)]),
    ("backend", "collectives", "main", [(1.6, 7.55), (1.6, 5.6)]),
    ("backend", "reduce", "api", [(A, 7.7), (0.22, 7.7), (0.22, 1.0), (A, 1.0)]),
    ("backend", "algorithms", "api", [(A, 7.85), (0.4, 7.85), (0.4, 1.58), (5.4, 1.58), (5.4, 1.4)]),
    ("backend", "p2p", "api", [(8.8, 8.05), (9.1, 8.05), (9.1, 3.9), (9.6, 3.9)]),
    ("backend", "transport", "api", [(8.8, 7.85), (9.25, 7.85), (9.25, 1.72), (10.0, 1.72), (10.0, 1.4)]),
    ("cpu_path", "collectives", "main", [(5.1, 6.75), (3.6, 6.75), (3.6, 5.6)]),
    ("cpu_path", "mpi", "main", [(8.8, 6.3), (9.9, 6.3), (9.9, 5.6)]),
    ("cpu_path", "hierarchy", "main", [(5.1, 6.4), (4.5, 6.4), (4.5, 3.8), (4.3, 3.8)]),
    ("cpu_path", "shm", "main", [(6.95, 6.2), (6.95, 2.8)]),
    ("cpu_path", "p2p", "main", [(8.3, 6.2), (8.3, 4.5), (11.0, 4.5), (11.0, 4.2)]),
    ("cpu_path", "transport", "main", [(8.8, 6.55), (9.4, 6.55), (9.4, 1.86), (10.4, 1.86), (10.4, 1.4)]),
    ("collectives", "mpi", "main", [(4.3, 5.25), (9.6, 5.25)]),
    ("collectives", "hierarchy", "main", [(1.6, 4.8), (1.6, 4.2)]),
    ("collectives", "shm", "main", [(4.3, 5.0), (4.7, 5.0), (4.7, 2.5), (5.1, 2.5)]),
    ("collectives", "algorithms", "main", [(4.3, 4.9), (4.9, 4.9), (4.9, 1.72), (5.8, 1.72), (5.8, 1.4)]),
    ("mpi", "algorithms", "api", [(9.6, 5.0), (8.95, 5.0), (8.95, 1.58), (8.4, 1.58), (8.4, 1.4)]),
    ("hierarchy", "shm", "main", [(4.3, 3.65), (5.6, 3.65), (5.6, 2.8)]),
    ("hierarchy", "algorithms", "main", [(2.6, 3.4), (2.6, 1.86), (6.3, 1.86), (6.3, 1.4)]),
    ("hierarchy", "transport", "main", [(4.3, 3.5), (9.52, 3.5), (9.52, 2.0), (10.8, 2.0), (10.8, 1.4)]),
    ("p2p", "shm", "api", [(10.3, 3.4), (10.3, 3.1), (8.2, 3.1), (8.2, 2.8)]),
    ("p2p", "transport", "main", [(12.4, 3.4), (12.4, 1.4)]),
    ("shm", "algorithms", "api", [(6.95, 2.0), (6.95, 1.4)]),
    ("shm", "transport", "main", [(8.8, 2.2), (11.4, 2.2), (11.4, 1.4)]),
    ("algorithms", "reduce", "main", [(5.1, 1.0), (4.3, 1.0)]),
    ("algorithms", "transport", "main", [(8.8, 1.0), (9.6, 1.0)]),
    ("transport", "reduce", "api", [(12.8, 0.6), (12.8, 0.35), (2.45, 0.35), (2.45, 0.6)]),
]

ARROW_STYLE = {
    "main": dict(color="#333333", lw=1.5, ls="-"),
    "api": dict(color="#8a8a8a", lw=1.2, ls=(0, (4, 3))),
    "back": dict(color="#c0392b", lw=1.5, ls=(0, (2, 2))),
}


def draw(out):
    fig = plt.figure(figsize=(16, 10), dpi=100)
    ax = fig.add_axes([0.0, 0.0, 1.0, 1.0])
    ax.set_xlim(0, 16)
    ax.set_ylim(-0.3, 10.2)
    ax.axis("off")

    for x, y, w, h, colour, title, detail in BOXES.values():
        box = FancyBboxPatch((x, y), w, h, boxstyle="round,pad=0.02,rounding_size=0.08", fc=colour, ec="#444444",
                             lw=1.2, zorder=2)
        ax.add_patch(box)
        ax.text(x + 0.12, y + h - 0.1, title, ha="left", va="top", fontsize=13, fontweight="bold",
                family="DejaVu Sans Mono", zorder=3)
        ax.text(x + 0.12, y + h - 0.42, detail, ha="left", va="top", fontsize=10, zorder=3, linespacing=1.15)

    for source, target, kind, route in ARROWS:
        polyline(ax, route, ARROW_STYLE[kind])

    # Two parts everything leans on, as bars instead of a dozen arrows each.
    bar(ax, 13.75, "rendezvous/", "c10d store keys, Bootstrap\n(store or MPI), MPI init,\nhost layout",
        "included by backend, cuda,\ncpu_path, mpi_collectives,\nhierarchy, shm, transport")
    bar(ax, 14.95, "common/", "errors, env knobs (env.cpp),\nlogging, compat, thread\nnames, profiling, fork guard",
        "included by every\npart; includes\nno other part")

    legend = [
        ("main", "A -> B: files of A include B's headers"),
        ("api", "only B's types, or one header of B"),
        ("back", "back edge: StagedPath makes a DdpliteWork"),
    ]
    for x, (kind, label) in zip((5.3, 8.9, 12.0), legend):  # along the bottom edge
        polyline(ax, [(x, -0.18), (x + 0.45, -0.18)], ARROW_STYLE[kind])
        ax.text(x + 0.55, -0.18, label, va="center", fontsize=9.2)
    ax.text(0.3, 10.05, "ddplite: the parts of csrc/ and which may include which", fontsize=15, fontweight="bold",
            va="center")
    ax.text(0.3, -0.18, "source: scripts/architecture_figure.py; explained in docs/architecture.md", fontsize=9,
            color="#555555", va="center")

    os.makedirs(os.path.dirname(out), exist_ok=True)
    fig.savefig(out, dpi=100)
    plt.close(fig)


def polyline(ax, points, style):
    codes = [Path.MOVETO] + [Path.LINETO] * (len(points) - 1)
    ax.add_patch(FancyArrowPatch(path=Path(points, codes), arrowstyle="-|>", mutation_scale=15,
                                 color=style["color"], lw=style["lw"], linestyle=style["ls"], shrinkA=0, shrinkB=0,
                                 joinstyle="miter", zorder=1))


def bar(ax, x, title, detail, users):
    ax.add_patch(FancyBboxPatch((x, 0.05), 1.0, 9.8, boxstyle="round,pad=0.02,rounding_size=0.08", fc=BAR,
                                ec="#444444", lw=1.2, zorder=2))
    ax.text(x + 0.5, 9.7, title, ha="center", va="top", fontsize=10.5, fontweight="bold", family="DejaVu Sans Mono",
            zorder=3)
    ax.text(x + 0.5, 5.6, detail, ha="center", va="center", fontsize=9, rotation=90, zorder=3)
    ax.text(x + 0.5, 1.9, users, ha="center", va="center", fontsize=9, rotation=90, color="#555555", zorder=3)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=os.path.join(ROOT, "docs", "img", "architecture.png"))
    args = parser.parse_args()
    draw(args.out)
    print(args.out)


if __name__ == "__main__":
    main()
