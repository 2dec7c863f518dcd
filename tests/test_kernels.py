"""The CPU reduction kernels (csrc/cpu/reduce/), one compilation per instruction set: every set
this CPU runs folds the same sources to the same bits, and those bits are torch's own left fold
(half and bfloat16: accumulated in float32 over all sources, rounded once, as torch's sum of a
stacked tensor). In-process: the kernels are called directly through a test binding."""

import pytest
import torch

import torch_ddp_lite
import workers

EXT = torch_ddp_lite._load_extension()
ACTIVE, RUNNABLE = EXT.kernel_sets()

FLOATS = [torch.float32, torch.float64, torch.float16, torch.bfloat16]
INTEGERS = [torch.int8, torch.uint8, torch.int16, torch.uint16, torch.int32, torch.uint32, torch.int64, torch.uint64]
# torch has no add or compare for uint16/32/64: the reference folds their bits as the signed
# type of the same width (the same bits for +, *, &, |, ^) and compares with the sign bit flipped.
SIGNED_TWIN = {torch.uint16: torch.int16, torch.uint32: torch.int32, torch.uint64: torch.int64}
OPS = {dtype: ["SUM", "AVG", "PRODUCT", "MIN", "MAX"] + (["PREMUL_SUM"] if dtype.is_floating_point
                                                          else ["BAND", "BOR", "BXOR"])
       for dtype in FLOATS + INTEGERS}
OPS[torch.bool] = ["SUM", "PRODUCT", "MIN", "MAX", "BAND", "BOR", "BXOR"]
# 0, 1, odd, one element short of and past a 4 KiB block (kernel_body.hpp), several blocks.
COUNTS = [0, 1, 7, 1023, 1025, 4099, 20011]
SOURCES = [1, 2, 3, 5]


def sources_for(dtype, count, n, seed):
    """n inputs with awkward values: random mantissas (inexact half sums), signs, zeros, and for
    floats subnormals, infinities and NaNs; integers across their whole range (wrap-around)."""
    generator = torch.Generator().manual_seed(seed)
    out = []
    for k in range(n):
        if dtype == torch.bool:
            out.append(torch.randint(0, 2, (count,), generator=generator).bool())
        elif dtype.is_floating_point:
            values = torch.randn(count, generator=generator, dtype=torch.float64) * 3
            if count > 10:
                info = torch.finfo(dtype)
                values[3] = info.tiny / 4  # subnormal
                values[4] = float("inf") if k % 2 else -float("inf")
                values[5] = 0.0 if k % 2 else -0.0
                values[6 + k] = float("nan")
                values[8] = info.max if k == 0 else values[8]  # overflows when summed
            out.append(values.to(dtype))
        else:
            twin = SIGNED_TWIN.get(dtype, dtype)
            info = torch.iinfo(twin)
            values = torch.randint(info.min, info.max, (count,), generator=generator, dtype=torch.int64).to(twin)
            out.append(values.view(dtype))
    return out


def torch_fold(op, sources):
    """The left fold in torch: ((s0 op s1) op s2) ..., half types in float32 and rounded once.
    MIN/MAX keep gloo's choice on NaN: MIN(a, b) = b < a ? b : a, MAX(a, b) = a < b ? b : a."""
    dtype = sources[0].dtype
    if dtype in SIGNED_TWIN:
        return unsigned_fold(op, sources, SIGNED_TWIN[dtype]).view(dtype)
    widen = dtype in (torch.float16, torch.bfloat16)
    values = [s.float() if widen else s for s in sources]
    acc = values[0].clone()
    for s in values[1:]:
        if dtype == torch.bool:
            acc = {"SUM": acc | s, "MAX": acc | s, "BOR": acc | s, "PRODUCT": acc & s, "MIN": acc & s,
                   "BAND": acc & s, "BXOR": acc ^ s}[op]
        elif op in ("SUM", "AVG", "PREMUL_SUM"):
            acc = acc + s
        elif op == "PRODUCT":
            acc = acc * s
        elif op == "MIN":
            acc = torch.where(s < acc, s, acc)
        elif op == "MAX":
            acc = torch.where(acc < s, s, acc)
        else:
            acc = {"BAND": acc & s, "BOR": acc | s, "BXOR": acc ^ s}[op]
    return acc.to(dtype) if widen else acc


def unsigned_fold(op, sources, twin):
    """torch_fold of unsigned sources, on their bits viewed as the signed `twin`."""
    flip = torch.iinfo(twin).min  # the sign bit: x ^ flip orders unsigned values as signed ones
    values = [s.view(twin) for s in sources]
    acc = values[0].clone()
    for s in values[1:]:
        if op in ("MIN", "MAX"):
            below = (s ^ flip) < (acc ^ flip) if op == "MIN" else (acc ^ flip) < (s ^ flip)
            acc = torch.where(below, s, acc)
        else:
            acc = {"SUM": acc + s, "AVG": acc + s, "PRODUCT": acc * s, "BAND": acc & s, "BOR": acc | s,
                   "BXOR": acc ^ s}[op]
    return acc


def same_values(actual, expected):
    """Equal element for element; NaN where the other has NaN (any payload); +0 and -0 told apart."""
    if actual.dtype != expected.dtype or actual.shape != expected.shape:
        return False
    if not actual.dtype.is_floating_point:
        return torch.equal(actual, expected)
    nan = actual.isnan()
    if not torch.equal(nan, expected.isnan()):
        return False
    a, e = actual[~nan], expected[~nan]
    return torch.equal(a, e) and torch.equal(torch.signbit(a), torch.signbit(e))


def first_difference(actual, expected):
    wrong = (actual != expected) & ~(actual.isnan() & expected.isnan()) if actual.dtype.is_floating_point \
        else actual != expected
    at = wrong.nonzero().flatten()[:3].tolist()
    return f"at {at}: {actual[at].tolist()} vs {expected[at].tolist()}"


def test_the_widest_set_this_cpu_runs_is_active():
    """Without DDPLITE_CPU_KERNELS the widest runnable set is chosen; generic always runs."""
    assert RUNNABLE[0] == "generic" and ACTIVE == RUNNABLE[-1]
    assert set(RUNNABLE) <= {"generic", "avx2", "avx512"}


@pytest.mark.parametrize("kernel_set", RUNNABLE)
@pytest.mark.parametrize("dtype", FLOATS + INTEGERS + [torch.bool], ids=str)
def test_every_set_folds_like_torch(kernel_set, dtype):
    checked = 0
    for op in OPS[dtype]:
        for count in COUNTS:
            for n in SOURCES:
                sources = sources_for(dtype, count, n, seed=count * 7 + n)
                actual = EXT.reduce_with_kernels(kernel_set, op, sources)
                expected = torch_fold(op, sources)
                assert same_values(actual, expected), \
                    f"{kernel_set} {dtype} {op} count={count} sources={n}: {first_difference(actual, expected)}"
                checked += 1
    assert checked == len(OPS[dtype]) * len(COUNTS) * len(SOURCES)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
def test_half_types_round_once_after_all_sources(dtype):
    """Three sources whose pairwise-rounded sum differs from the once-rounded one: the fold gives
    the once-rounded value (torch's stacked sum), not gloo's step-by-step rounding."""
    one = torch.tensor([1.0], dtype=dtype)
    half_ulp = torch.tensor([torch.finfo(dtype).eps / 2], dtype=dtype)
    # 1 + eps/2 rounds to 1 (ties to even); + eps/2 again rounds to 1: pairwise gives 1, once gives 1 + eps
    sources = [one, half_ulp, half_ulp]
    once = (one.float() + half_ulp.float() + half_ulp.float()).to(dtype)
    pairwise = ((one.float() + half_ulp.float()).to(dtype).float() + half_ulp.float()).to(dtype)
    assert not torch.equal(once, pairwise)
    for kernel_set in RUNNABLE:
        assert torch.equal(EXT.reduce_with_kernels(kernel_set, "SUM", sources), once), kernel_set
        assert torch.equal(torch.stack(sources).sum(0), once)  # what torch itself does


def test_unknown_or_unrunnable_set_is_refused():
    with pytest.raises(ValueError, match="no kernel set 'sse9' this CPU runs; it runs: generic"):
        EXT.reduce_with_kernels("sse9", "SUM", [torch.ones(3)])
    with pytest.raises(ValueError, match="ReduceOp.BAND is not defined for Float tensors"):
        EXT.reduce_with_kernels("generic", "BAND", [torch.ones(3)])
    with pytest.raises(ValueError, match=r"Float8_e5m2 tensors can be moved \(.*\) but not reduced on CPU"):
        EXT.reduce_with_kernels("generic", "SUM", [torch.ones(3, dtype=torch.float8_e5m2)])


@pytest.mark.parametrize("kernel_set", RUNNABLE)
def test_pinned_set_runs_collectives(kernel_set):
    """DDPLITE_CPU_KERNELS pins a set for the whole process; collectives give the same result."""
    from harness import run_ranks

    results = run_ranks(workers.kernel_set_and_half_sum, 2, env={"DDPLITE_CPU_KERNELS": kernel_set})
    assert results == [(kernel_set, [3.0] * 5)] * 2


def test_pinning_a_set_this_cpu_lacks_fails_init():
    """A set this CPU cannot run is a ValueError at init_process_group (not a SIGILL later)."""
    from harness import RankFailed, run_ranks

    missing = [name for name in ("avx2", "avx512") if name not in RUNNABLE]
    value = missing[0] if missing else "neon"
    with pytest.raises(RankFailed) as failure:
        run_ranks(workers.kernel_set_and_half_sum, 2, env={"DDPLITE_CPU_KERNELS": value})
    reason = " on this CPU (it lacks the instructions)" if missing else ""
    assert (f"DDPLITE_CPU_KERNELS='{value}' is not a valid value{reason}; use one of: auto (the default), "
            f"{', '.join(RUNNABLE)}") in str(failure.value)
