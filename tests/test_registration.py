"""The package face: autoload through the torch.backends entry point, registration, init methods,
the build check, and the interface-name matcher."""

import os
import subprocess
import sys
import textwrap

import pytest
import torch

import torch_ddp_lite

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

STOCK_SCRIPT = textwrap.dedent("""
    import sys
    import torch
    import torch.distributed as dist
    rank, world, init = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
    # note: no `import torch_ddp_lite` anywhere in this script
    dist.init_process_group(backend="ddplite", init_method=init, rank=rank, world_size=world)
    t = torch.full((4,), float(rank + 1))
    dist.all_reduce(t)
    print("RESULT", dist.get_backend(), t.tolist(), flush=True)
    dist.destroy_process_group()
""")


def run_script(tmp_path, source, world, init, env=None):
    script = tmp_path / "script.py"
    script.write_text(source)
    full_env = dict(os.environ, **(env or {}))
    procs = [subprocess.Popen([sys.executable, str(script), str(r), str(world), init], cwd=tmp_path,
                              env=full_env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for r in range(world)]
    outputs = [p.communicate(timeout=120)[0] for p in procs]
    return [p.returncode for p in procs], outputs


def test_autoload_without_import(tmp_path):
    codes, outputs = run_script(tmp_path, STOCK_SCRIPT, 2, f"file://{tmp_path}/store")
    assert codes == [0, 0], outputs
    for output in outputs:
        assert "RESULT ddplite [3.0, 3.0, 3.0, 3.0]" in output, output


def test_tcp_init_method(tmp_path):
    import socket
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    codes, outputs = run_script(tmp_path, STOCK_SCRIPT, 3, f"tcp://127.0.0.1:{port}")
    assert codes == [0, 0, 0], outputs
    assert all("RESULT ddplite [6.0, 6.0, 6.0, 6.0]" in o for o in outputs), outputs


def test_autoload_disabled_by_torch_switch(tmp_path):
    probe = ("import torch, torch.distributed as dist; print('BEFORE', 'DDPLITE' in dist.Backend._plugins); "
             "import torch_ddp_lite; print('AFTER', 'DDPLITE' in dist.Backend._plugins)")
    output = subprocess.run([sys.executable, "-c", probe], env=dict(os.environ, TORCH_DEVICE_BACKEND_AUTOLOAD="0"),
                            capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert output.returncode == 0, output.stderr
    assert "BEFORE False" in output.stdout and "AFTER True" in output.stdout


def test_registration_is_idempotent_and_never_raises():
    import _ddplite_autoload
    import torch.distributed as dist
    assert torch_ddp_lite.register_backend() is True
    _ddplite_autoload.register()
    assert dist.Backend.DDPLITE == "ddplite"
    assert dist.Backend.backend_capability["ddplite"] == ["cpu", "cuda"]


def test_build_is_checked_against_running_torch(monkeypatch):
    monkeypatch.setattr(torch_ddp_lite, "_extension", None)
    monkeypatch.setattr(torch, "__version__", "0.0.1-not-this-torch")
    with pytest.raises(ImportError, match=r"(?s)built against torch .* but torch 0.0.1-not-this-torch is running.*"
                                          r"pip install --no-build-isolation"):
        torch_ddp_lite._load_extension()


def test_options_keep_their_type_and_timeout_when_torch_clones_them():
    """torch 2.14+ clones the parent's options for each split (Options::clone); a clone sliced to
    torch's Options would lose the ddplite type. Older torches copy them in Python (deepcopy)."""
    import copy
    from datetime import timedelta

    options = torch_ddp_lite.Options(timeout=timedelta(seconds=42))
    copies = [copy.deepcopy(options), copy.copy(options)]
    if torch_ddp_lite.torch_has("options_clone"):
        copies.append(options._clone_as_torch_does())
    for made in copies:
        assert type(made).__name__ == "DdpliteOptions" and made is not options
        assert made._timeout == timedelta(seconds=42) and made.backend == "ddplite"


def test_torch_versions_list_is_the_one_setup_and_the_build_read():
    """The running torch is one of the supported releases, and the feature table agrees with
    what the extension was compiled with (csrc/common/compat.hpp keys the same releases)."""
    from torch_ddp_lite import torch_versions as tv

    assert tv.is_supported(torch.__version__), torch.__version__
    assert tv.release("2.15.0+cu132") == (2, 15, 0) and tv.release("2.9.0rc1") == (2, 9, 0)
    assert [tv.is_supported(v) for v in ("2.7.1", "2.8.0", "2.15.3", "2.16.0")] == [False, True, True, False]
    assert tv.torchvision_for("2.15.0") == "0.29.2" and tv.torchvision_for("2.8.0+cu128") == "0.23.0"
    assert tv.NEWEST == "2.15.0" and tv.OLDEST == "2.8.0"
    info = torch_ddp_lite.build_info()
    assert info["torch_features"] == {name: tv.has(name, torch.__version__) for name in tv.FEATURES}, info


@pytest.mark.parametrize("installed,requested,decision", [
    ("", "", ("install", "2.15.0")),                  # a fresh machine: the newest tested release
    ("2.13.0+cu130", "", ("keep", "2.13.0")),         # a supported torch is never replaced
    ("2.8.0", "", ("keep", "2.8.0")),
    ("2.14.0", "", ("keep", "2.14.0")),               # another patch of a supported minor
    ("2.15.0+cu132", "2.15.0", ("keep", "2.15.0")),
    ("2.13.0", "2.12.1", ("install", "2.12.1")),      # asked for: replaced
    ("2.7.1", "", ("refuse", None)),                  # too old: refused, not replaced
    ("2.16.0", "", ("refuse", None)),                 # newer than tested: refused, not replaced
    ("", "2.7.0", ("refuse", None)),
])
def test_setup_keeps_a_supported_torch_and_never_replaces_one_unasked(installed, requested, decision):
    from torch_ddp_lite import torch_versions as tv

    action, what = tv.decide(installed, requested)
    assert action == decision[0] and (decision[1] is None or what == decision[1]), (action, what)
    if action == "refuse":
        assert "2.8 to 2.15" in what
    # setup.sh acts on exactly this decision (the same function, run as a script)
    script = os.path.join(os.path.dirname(tv.__file__), "torch_versions.py")
    proc = subprocess.run([sys.executable, script, "decide", installed, requested], capture_output=True, text=True)
    assert proc.stdout.split(" ", 1)[0] == action and proc.returncode == (1 if action == "refuse" else 0)


def test_built_against_installed_torch():
    assert torch_ddp_lite.built_torch_version() == torch.__version__


def setup_function_named(name):
    """A top-level function of setup.py, defined alone (running setup.py would build)."""
    import ast
    source = open(os.path.join(REPO, "setup.py")).read()
    node = next(n for n in ast.parse(source).body if isinstance(n, ast.FunctionDef) and n.name == name)
    import shlex
    namespace = {"os": os, "subprocess": subprocess, "shlex": shlex}
    exec(compile(ast.Module(body=[node], type_ignores=[]), "setup.py", "exec"), namespace)
    return namespace[name]


def test_extension_imports_libstdcxx_rather_than_carrying_a_copy():
    """A copy of libstdc++.a inside the extension crashed its first `ostream << long` next to the
    libstdc++.so.6 torch loads (the GPU machine, 2026-11-30: env_knobs and build_info)."""
    library = torch_ddp_lite._load_extension().__file__
    needed = subprocess.run(["readelf", "-d", library], capture_output=True, text=True, check=True).stdout
    assert "[libstdc++.so.6]" in needed
    defined = subprocess.run(["nm", "-D", "--defined-only", library], capture_output=True, text=True, check=True).stdout
    assert "_ZNSo9_M_insertIlEERSoT_" not in defined  # std::ostream::_M_insert<long>, libstdc++'s own


def test_setup_links_the_loaded_libstdcxx_where_the_compiler_has_only_its_archive(tmp_path, monkeypatch):
    link_args = setup_function_named("libstdcxx_link_args")
    # a compiler without the development link answers -print-file-name with the bare name
    compiler = tmp_path / "c++"
    compiler.write_text('#!/bin/sh\necho "${1#-print-file-name=}"\n')
    compiler.chmod(0o755)
    monkeypatch.setenv("CXX", str(compiler))
    (loaded,) = link_args()
    assert os.path.basename(loaded).startswith("libstdc++.so.6") and os.path.isfile(loaded)
    with open("/proc/self/maps") as maps:
        assert any(line.split()[-1] == loaded for line in maps)  # the one this process runs
    monkeypatch.setenv("CXX", f"env {compiler}")  # a launcher in front of the compiler
    assert link_args() == [loaded]
    # a working development link: nothing to add
    monkeypatch.setenv("CXX", "g++")
    if os.path.isfile(subprocess.run(["g++", "-print-file-name=libstdc++.so"], capture_output=True,
                                     text=True).stdout.strip()):
        assert link_args() == []


def test_the_build_fails_on_a_library_that_carries_libstdcxx(tmp_path):
    check = setup_function_named("check_libstdcxx_not_copied")
    source = tmp_path / "copy.cpp"
    source.write_text('#include <sstream>\nstd::string text(long n) { std::ostringstream s; s << n; return s.str(); }\n')
    copied = tmp_path / "copied.so"
    subprocess.run(["g++", "-shared", "-fPIC", "-static-libstdc++", str(source), "-o", str(copied)], check=True)
    with pytest.raises(RuntimeError, match="carries a copy of libstdc\\+\\+"):
        check(str(copied))
    linked = tmp_path / "linked.so"
    subprocess.run(["g++", "-shared", "-fPIC", str(source), "-o", str(linked)], check=True)
    check(str(linked))
    check(torch_ddp_lite._load_extension().__file__)


def test_env_knobs_have_prefix_and_help():
    knobs = torch_ddp_lite.env_knobs()
    assert {"DDPLITE_SOCKET_IFNAME", "DDPLITE_DEBUG"} <= {name for name, _, _ in knobs}
    assert all(name.startswith("DDPLITE_") and help_text for name, _, help_text in knobs)


@pytest.mark.parametrize("spec,ifname,expected", [
    ("eth", "eth0", True), ("eth", "ens3", False), ("=eth0", "eth0", True), ("=eth0", "eth01", False),
    ("^lo,docker", "lo", False), ("^lo,docker", "docker0", False), ("^lo,docker", "eth0", True),
    ("ib,eth", "ib0", True), ("^=eth0", "eth0", False), ("^=eth0", "eth01", True),
])
def test_ifname_matches_nccl_syntax(spec, ifname, expected):
    assert torch_ddp_lite._load_extension().ifname_matches(spec, ifname) is expected



def _init_only(rank, world_size):
    return "initialised"


BAD_KNOB_VALUES = [
    ("DDPLITE_DEBUG", "VERBOSE", "use one of: WARN (the default), INFO, TRACE, DETAIL"),
    ("DDPLITE_RING_SEGMENT_BYTES", "12", "use a whole number of bytes >= 64 (the default is 262144)"),
    ("DDPLITE_RING_SEGMENT_BYTES", "64k", "use a whole number of bytes >= 64 (the default is 262144)"),
    ("DDPLITE_TREE_CHUNK_BYTES", "-1", "use a whole number of bytes >= 64 (the default is 262144)"),
    ("DDPLITE_SOCKET_BUFFER_BYTES", "lots", "use a whole number of bytes >= 0 (the default is 0)"),
    ("DDPLITE_CPU_TRANSPORT", "infiniband", "use one of: auto (the default), tcp, mpi, shm"),
    ("DDPLITE_SHM_CHUNK_BYTES", "100", "use a whole number of bytes >= 4096 and <= 1073741824 (the default is 524288)"),
    ("DDPLITE_SHM_INLINE_BYTES", "-1", "use a whole number of bytes >= 0 and <= 1073741824 (the default is 262144)"),
    ("DDPLITE_FINGERPRINT", "yes", "use one of: 1 (the default), 0"),
    ("DDPLITE_SYNC_ON_CALLER", "yes", "use one of: 1 (the default), 0"),
    ("DDPLITE_TCP_SPIN_US", "-1", "use a whole number of microseconds >= 0 and <= 100000 (the default is 50)"),
    ("DDPLITE_SHM_SPIN_US", "100001", "use a whole number of microseconds >= 0 and <= 100000 (the default is 50)"),
    ("DDPLITE_CALLER_SPIN_US", "1ms", "use a whole number of microseconds >= 0 and <= 100000 (the default is 0)"),
    ("DDPLITE_CALLER_SPIN_TRIAL", "on", "use one of: 1 (the default), 0"),
    ("DDPLITE_TCP_SEND_CHUNK_BYTES", "32k", "use 0 (no limit) or a whole number of bytes >= 4096 and <= 1073741824 (the default is 32768)"),
    ("DDPLITE_TCP_SEND_CHUNK_BYTES", "100", "use 0 (no limit) or a whole number of bytes >= 4096 and <= 1073741824 (the default is 32768)"),
    ("DDPLITE_TCP_SEND_CHUNK_BYTES", "4095", "use 0 (no limit) or a whole number of bytes >= 4096 and <= 1073741824 (the default is 32768)"),
    ("DDPLITE_TCP_SEND_CHUNK_BYTES", "1073741825", "use 0 (no limit) or a whole number of bytes >= 4096 and <= 1073741824 (the default is 32768)"),
    ("DDPLITE_RAILS_BYTES", "2M", "use a whole number of bytes >= 0 (the default is 2097152)"),
    ("DDPLITE_SHM_SYNC", "star", "use one of: auto (the default), flat, tree"),
    ("DDPLITE_SHM_TREE_FANIN", "1", "use a whole number of arrivals >= 2 and <= 64 (the default is 8)"),
    ("DDPLITE_CUDA_STAGING", "sometimes", "use one of: auto (the default), always, never"),
    ("DDPLITE_TRACE_BUFFER_SIZE", "lots", "use a whole number of ops >= 0 and <= 1000000 (the default is 2000)"),
    ("TORCH_FR_BUFFER_SIZE", "-5", "use a whole number of ops >= 0 and <= 1000000 (the default is 2000)"),
    ("DDPLITE_TRACE_STACKS", "yes", "use one of: 0 (the default), 1"),
    ("DDPLITE_STRAGGLER_WINDOW", "big", "use a whole number of ops >= 0 and <= 65536 (the default is 512)"),
    ("DDPLITE_STATUS", "on", "use one of: 1 (the default), 0"),
    ("DDPLITE_STRAGGLER_REPORT", "soon", "use a whole number of seconds >= 0 and <= 604800 (the default is 0)"),
    ("DDPLITE_TRACE_SIGNAL", "USR1", "use one of: 0 (the default), 1"),
]


@pytest.mark.parametrize("knob, value, allowed", BAD_KNOB_VALUES)
def test_every_knob_rejects_a_bad_value_the_same_way(knob, value, allowed):
    """A typo in any DDPLITE_* knob fails init_process_group on every rank with a ValueError that
    names the knob, the value and the allowed values (none falls back silently)."""
    from harness import RankFailed, run_ranks

    with pytest.raises(RankFailed) as failure:
        run_ranks(_init_only, 2, env={knob: value})
    for rank in (0, 1):
        assert f"ValueError: ddplite rank {rank}/2, init #0: {knob}='{value}' is not a valid value; {allowed}" \
            in str(failure.value)


def test_knob_defaults_are_the_documented_ones():
    """env_knobs() reports the defaults the readers use (written once in env.cpp): a run with
    every knob explicitly set to its reported default initialises fine."""
    knobs = {name: default for name, default, _ in torch_ddp_lite._load_extension().env_knobs()}
    assert knobs["DDPLITE_RING_SEGMENT_BYTES"] == "262144" and knobs["DDPLITE_DEBUG"] == "WARN"
    from harness import run_ranks

    explicit = {name: default for name, default in knobs.items() if default}
    assert run_ranks(_init_only, 2, env=explicit) == ["initialised"] * 2


# The rule as docs/algorithms.md ("The automatic rule") states it, at both sides of each threshold.
DOCUMENTED_RULE = [
    ("allreduce", 128 << 10, 2, "butterfly"), ("allreduce", (128 << 10) + 4, 2, "ring"),
    ("allreduce", 16 << 10, 3, "butterfly"), ("allreduce", (16 << 10) + 4, 3, "ring"),
    ("allreduce", 16 << 10, 5, "butterfly"), ("allreduce", 64 << 10, 4, "ring"),
    ("allreduce", (16 << 10) + 4, 7, "ring"), ("allreduce", 64 << 10, 8, "butterfly"),
    ("allreduce", (64 << 10) + 4, 8, "ring"), ("allreduce", 512 << 10, 64, "butterfly"),
    ("allreduce", (512 << 10) + 4, 64, "ring"), ("allreduce", (512 << 10) + 4, 1024, "ring"),
    ("broadcast", 256 << 10, 4, "tree"), ("broadcast", (256 << 10) + 1, 4, "ring"),
    ("reduce", 1 << 30, 3, "tree"),
    ("allgather", 64 << 10, 3, "doubling"), ("allgather", (64 << 10) + 4, 3, "ring"),
    ("reduce_scatter", 64 << 10, 3, "halving"), ("reduce_scatter", (64 << 10) + 4, 2, "ring"),
    ("barrier", 0, 5, "dissemination"),
]


@pytest.mark.parametrize("collective, nbytes, world_size, expected", DOCUMENTED_RULE)
def test_automatic_rule_is_the_documented_one(collective, nbytes, world_size, expected):
    assert torch_ddp_lite._load_extension().automatic_algorithm(collective, nbytes, world_size) == expected


def test_automatic_rule_names_every_collective_in_the_docs():
    """Every collective the selector knows has a row in the docs' rule table, and no other."""
    docs = open(os.path.join(os.path.dirname(__file__), "..", "docs", "algorithms.md")).read()
    rule = docs.split("## The automatic rule")[1].split("##")[0]
    documented = {line.split("|")[1].strip() for line in rule.splitlines()
                  if line.startswith("| ") and not line.startswith("| collective")}
    known = {name for name, _ in torch_ddp_lite._load_extension().available_algorithms()}
    assert documented == known
    with pytest.raises(ValueError, match="unknown collective 'allgatherv'"):
        torch_ddp_lite._load_extension().automatic_algorithm("allgatherv", 8, 2)
