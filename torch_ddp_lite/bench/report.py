"""Output of the benchmark: nccl-tests-style tables, the JSON rows, the plot.

Table (one per op, printed row by row as sizes are measured)::

    # all_reduce
    #                                                    ddplite                      gloo  ddplite/gloo
    #        size       count     type      time   algbw   busbw      time   algbw   busbw   time  busbw
    #         (B)  (elements)               (us)  (GB/s)  (GB/s)      (us)  (GB/s)  (GB/s)  ratio  ratio
           65536       16384  float32      79.8   0.821   0.821     346.1   0.189   0.189   0.23   4.34

The ratio columns compare the first backend with each other one: time ratio below 1 and busbw
ratio above 1 mean the first backend is faster (at equal size the two are reciprocals).
A backend that does not support an op shows ``-`` and a note under the table.

JSON (``--json FILE``): a list of rows, one per op x backend x size, with exactly the keys of
:data:`ROW_KEYS`; algbw and busbw are null for barrier.

Plot (``--plot FILE.png``): one row of two panels per op with a size axis (barrier, a single
latency, is in the table only): busbw against size and time against size, log axes, one line per
backend.
"""

import json

from torch_ddp_lite.bench.sweep import format_size

ROW_KEYS = ("op", "backend", "world_size", "device", "dtype", "bytes", "count", "time_us", "algbw", "busbw")

_TIME = 10
_BW = 10  # room for 99999.999 GB/s (a GPU copy at one rank)
_RATIO = 7


def make_row(op, backend, world_size, device, dtype, shape, seconds, bandwidth):
    """One JSON row; `bandwidth` is the (algbw, busbw) pair for this size and time."""
    algbw, busbw = bandwidth
    values = (op, backend, world_size, device, dtype, shape.nbytes, shape.count, seconds * 1e6, algbw, busbw)
    return dict(zip(ROW_KEYS, values))


def table_header(op, backends):
    """The column heads of one op's table."""
    reference, others = backends[0], backends[1:]
    block = _TIME + 2 * _BW
    ratio_block = 2 * _RATIO
    names = "".join(f"{name:>{block}}" for name in backends)
    names += "".join(f"{' ' + reference + '/' + other:>{ratio_block}}" for other in others)
    heads = "".join(f"{'time':>{_TIME}}{'algbw':>{_BW}}{'busbw':>{_BW}}" for _ in backends)
    heads += "".join(f"{'time':>{_RATIO}}{'busbw':>{_RATIO}}" for _ in others)
    units = "".join(f"{'(us)':>{_TIME}}{'(GB/s)':>{_BW}}{'(GB/s)':>{_BW}}" for _ in backends)
    units += "".join(f"{'ratio':>{_RATIO}}{'ratio':>{_RATIO}}" for _ in others)
    return "\n".join([
        f"# {op}",
        f"#{'':>12}{'':>12}{'':>9}{names}",
        f"#{'size':>12}{'count':>12}{'type':>9}{heads}",
        f"#{'(B)':>12}{'(elements)':>12}{'':>9}{units}",
    ])


def table_line(rows_by_backend, backends):
    """One size: `rows_by_backend` maps each measured backend to its row (unsupported ones are absent)."""
    any_row = next(iter(rows_by_backend.values()))
    line = f" {any_row['bytes']:>12}{any_row['count']:>12}{any_row['dtype']:>9}"
    for backend in backends:
        row = rows_by_backend.get(backend)
        if row is None:
            line += f"{'-':>{_TIME}}{'-':>{_BW}}{'-':>{_BW}}"
        else:
            line += f"{row['time_us']:>{_TIME}.1f}{_bw_text(row['algbw']):>{_BW}}{_bw_text(row['busbw']):>{_BW}}"
    reference = rows_by_backend.get(backends[0])
    for other in backends[1:]:
        row = rows_by_backend.get(other)
        both = reference is not None and row is not None
        time_ratio = _ratio(reference["time_us"], row["time_us"]) if both else None
        busbw_ratio = _ratio(reference["busbw"], row["busbw"]) if both else None
        line += f"{_ratio_text(time_ratio):>{_RATIO}}{_ratio_text(busbw_ratio):>{_RATIO}}"
    return line


def table_footer(rows, notes, backends):
    """Average busbw per backend (as nccl-tests' last line) and one line per unsupported backend."""
    lines = []
    averages = []
    for backend in backends:
        values = [row["busbw"] for row in rows if row["backend"] == backend and row["busbw"] is not None]
        if values:
            averages.append(f"{backend} {sum(values) / len(values):.3f}")
    if averages:
        lines.append("# avg busbw (GB/s): " + "  ".join(averages))
    lines += [f"# {backend}: not measured, unsupported here ({reason})" for backend, reason in notes]
    return "\n".join(lines)


def _ratio(numerator, denominator):
    """numerator / denominator, or None when either is missing or the denominator is 0."""
    if numerator is None or not denominator:
        return None
    return numerator / denominator


def _bw_text(value):
    return "-" if value is None else f"{value:.3f}"


def _ratio_text(value):
    return "-" if value is None else f"{value:.2f}"


def write_json(path, rows):
    with open(path, "w") as handle:
        json.dump(rows, handle, indent=1)
        handle.write("\n")


def write_plot(path, rows, title):
    """busbw and time against size, log axes, one line per backend, one row of panels per op."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter, LogLocator

    ops = list(dict.fromkeys(row["op"] for row in rows if row["busbw"] is not None))
    figure, axes = plt.subplots(len(ops), 2, figsize=(11, 3.4 * len(ops)), squeeze=False, layout="constrained")
    for op, (bandwidth_axis, time_axis) in zip(ops, axes):
        op_rows = [row for row in rows if row["op"] == op]
        for backend in dict.fromkeys(row["backend"] for row in op_rows):
            points = sorted((row["bytes"], row["busbw"], row["time_us"])
                            for row in op_rows if row["backend"] == backend)
            sizes = [p[0] for p in points]
            bandwidth_axis.plot(sizes, [p[1] for p in points], marker=".", label=backend)
            time_axis.plot(sizes, [p[2] for p in points], marker=".", label=backend)
        bandwidth_axis.set(title=f"{op}: bus bandwidth", ylabel="busbw (GB/s)", yscale="log")
        time_axis.set(title=f"{op}: time per op", ylabel="time (us)", yscale="log")
        for axis in (bandwidth_axis, time_axis):
            axis.set_xscale("log", base=2)
            axis.xaxis.set_major_locator(LogLocator(base=16))
            axis.xaxis.set_major_formatter(FuncFormatter(lambda x, _: format_size(int(round(x)))))
            axis.set_xlabel("size")
            axis.grid(True, which="major", alpha=0.4)
            axis.legend()
    figure.suptitle(title)
    figure.savefig(path, dpi=110)
    plt.close(figure)
