#!/usr/bin/env python3
"""Mutation test of the quick suite: small, realistic bugs the tests must catch.

Each mutant changes one line of the C++ sources. The script clones the current commit into a
scratch folder (your checkout and its installed extension are not touched), builds the extension
there once, then for every mutant: applies it, rebuilds incrementally, runs the fast subset (or
the mutant's own tests of CI's suite, for code the subset does not reach) with ``-x`` (stop at
the first failure) and restores the file. A mutant is *killed* when a test fails,
*survived* when the whole subset passes. Every mutant must be killed.

    python3 scripts/mutants.py                     # all mutants, table to stdout and --table
    python3 scripts/mutants.py --only ring_send_segment min_wrong_operand
    python3 scripts/mutants.py --list

Takes about an hour on 2 cores (a build of the clone, then per mutant an incremental rebuild
and tests up to the first failure). Not part of CI. Latest table: docs/testing.md.
"""

import argparse
import dataclasses
import os
import re
import shutil
import signal
import subprocess
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# The fast subset: the sweeps against gloo and closed forms, mismatches, failures and timeouts,
# groups and point-to-point, the property test, the shared-memory path's own tests. Ordered so
# that the broad sweeps run first.
SUBSET = ["tests/test_collectives.py", "tests/test_mismatch.py", "tests/test_failures.py",
          "tests/test_p2p_groups.py", "tests/test_property.py", "tests/test_shm.py"]


@dataclasses.dataclass
class Mutant:
    name: str
    path: str      # under csrc/
    before: str    # must occur exactly once in the file
    after: str
    what: str      # the bug it stands for
    # The tests of CI's suite that must kill it (pytest arguments), when the fast subset cannot:
    # the code of connections on demand, shrink, the fork guard and the hierarchy is exercised by
    # tests of its own.
    tests: tuple = ()


MUTANTS = [
    Mutant("ring_send_segment", "cpu/algorithms/allreduce_ring.cpp",
           "const int sendIndex = (rank - step + size) % size;",
           "const int sendIndex = (rank - step + 1 + size) % size;",
           "ring reduce-scatter step sends segment (rank - s + 1) instead of (rank - s)"),
    Mutant("segment_split_off_by_one", "cpu/algorithms/algorithm.hpp",
           "return (count / parts) * i + std::min(i, count % parts);",
           "return (count / parts) * i + std::min(i + 1, count % parts);",
           "balanced split: the remainder goes one part too early (off by one)"),
    Mutant("min_wrong_operand", "cpu/reduce/kernel_body.hpp",
           "static T apply(T a, T b) { return b < a ? b : a; }",
           "static T apply(T a, T b) { return b < a ? a : a; }",
           "MIN kernel compares the wrong operand (keeps its own value)"),
    Mutant("fold_drops_partner", "cpu/algorithms/algorithm_util.cpp",
           "    transport.recv(rank - 1, incoming, bytes, args.deadline);\n    args.reduce(args.data, incoming, args.count);",
           "    transport.recv(rank - 1, incoming, bytes, args.deadline);",
           "non-power-of-two fold: the folded partner's contribution is received but not reduced"),
    Mutant("tree_wrong_parent", "cpu/algorithms/algorithm_util.cpp",
           "position.parent = realRank((virtualRank - 1) / 2);",
           "position.parent = realRank(virtualRank / 2);",
           "binary tree: parent v/2 instead of (v-1)/2"),
    Mutant("alltoall_swapped_offsets", "cpu/algorithms/alltoall_pairwise.cpp",
           "const Span& out = args.sendSpans[to];",
           "const Span& out = args.sendSpans[from];",
           "alltoall sends the span meant for the rank it receives from"),
    Mutant("int8_as_uint8", "cpu/reduce/kernel_body.hpp",
           "case c10::kChar: return integral<int8_t>(op);",
           "case c10::kChar: return integral<uint8_t>(op);",
           "a dtype case dispatched to the wrong type (int8 reduced as uint8)"),
    Mutant("deadline_wrong_unit", "backend/backend.cpp",
           "const Deadline deadline = Clock::now() + run.timeout;",
           "const Deadline deadline = Clock::now() + run.timeout * 1000;",
           "collective deadline computed in the wrong unit (the timeout read as seconds, not ms)"),
    Mutant("butterfly_skips_last_step", "cpu/algorithms/allreduce_butterfly.cpp",
           "for (int distance = 1; distance < fold.p2; distance *= 2) {",
           "for (int distance = 1; distance < fold.p2 / 2; distance *= 2) {",
           "recursive doubling stops one exchange early"),
    Mutant("barrier_skips_last_round", "cpu/algorithms/barrier_dissemination.cpp",
           "for (int distance = 1; distance < size; distance *= 2) {",
           "for (int distance = 1; distance < size / 2; distance *= 2) {",
           "dissemination barrier stops one round early (ranks leave before the last arrives)"),
    Mutant("avg_floors", "cpu/collectives.cpp",
           'tensor.div_(worldSize, "trunc");',
           'tensor.div_(worldSize, "floor");',
           "integer AVG rounds toward minus infinity instead of toward zero"),
    Mutant("peer_closed_misreported", "cpu/transport/tcp.cpp",
           "if (error == 0 || error == ECONNRESET || error == EPIPE) {",
           "if (error == ECONNRESET || error == EPIPE) {",
           "end of stream from a dead peer reported as a generic I/O error"),
    Mutant("fingerprint_ignores_seq", "cpu/transport/fingerprint.cpp",
           "header.check == checksumOf(header) && header.seq == mine.seq &&",
           "header.check == checksumOf(header) &&",
           "the wire fingerprint does not compare sequence numbers"),
    Mutant("allgather_ring_wrong_block", "cpu/algorithms/allgather_ring.cpp",
           "const int recvBlock = (rank - step - 1 + size) % size;",
           "const int recvBlock = (rank - step + size) % size;",
           "ring allgather stores the received block in the slot of the one it sent"),
    Mutant("reduce_scatter_ring_wrong_block", "cpu/algorithms/reduce_scatter_ring.cpp",
           "args.reduce(block(rank - step - 2), incoming, args.count);",
           "args.reduce(block(rank - step - 1), incoming, args.count);",
           "ring reduce-scatter reduces into the block it just sent"),
    Mutant("broadcast_ring_last_chunk", "cpu/algorithms/broadcast_ring.cpp",
           "for (size_t k = 0; k + 1 < chunks; ++k) {",
           "for (size_t k = 0; k + 2 < chunks; ++k) {",
           "pipelined ring broadcast forwards one chunk too few"),
    Mutant("halving_keeps_wrong_half", "cpu/algorithms/algorithm_util.cpp",
           "const int keepLow = lower ? low : middle;",
           "const int keepLow = lower ? middle : low;",
           "recursive halving keeps the half it gave away"),
    Mutant("scatter_sends_wrong_span", "cpu/algorithms/exchange_direct.cpp",
           "    const Span& from = args.sendSpans[peer];\n    transport.send(peer,",
           "    const Span& from = args.sendSpans[(peer + 1) % transport.size()];\n    transport.send(peer,",
           "scatter: the root sends each rank the span meant for the next one"),
    # The shared-memory path (cpu/shm/, the default on one host) and its send/recv channels.
    Mutant("shm_reduce_drops_last_rank", "cpu/shm/shm_algorithms.hpp",
           "args.reduceMany(out, sources.data(), group.size(), count);",
           "args.reduceMany(out, sources.data(), group.size() - 1, count);",
           "shared-memory reductions leave out the last rank's buffer"),
    Mutant("shm_allreduce_copies_own_slice", "cpu/shm/allreduce.cpp",
           "std::memcpy(out + from * es, group.buffer(owner, step) + from * es, (to - from) * es);",
           "std::memcpy(out + from * es, group.buffer(rank, step) + from * es, (to - from) * es);",
           "large shared-memory all_reduce copies each slice out of its own buffer, not the owner's reduced one"),
    Mutant("shm_broadcast_reads_own_buffer", "cpu/shm/broadcast.cpp",
           "std::memcpy(args.data + offset, group.buffer(args.root, step), bytes);",
           "std::memcpy(args.data + offset, group.buffer(group.rank(), step), bytes);",
           "shared-memory broadcast: a non-root copies from its own buffer instead of the root's"),
    Mutant("shm_allgather_wrong_slot", "cpu/shm/allgather.cpp",
           "if (owner != rank) std::memcpy(args.data + owner * block + offset, group.buffer(owner, step), bytes);",
           "if (owner != rank) std::memcpy(args.data + rank * block + offset, group.buffer(owner, step), bytes);",
           "shared-memory all_gather stores every peer's block in this rank's slot"),
    Mutant("shm_reduce_scatter_wrong_piece", "cpu/shm/reduce_scatter.cpp",
           "reduceInRankOrder(group, args, mine + first * es, rank * bytes, count, step);",
           "reduceInRankOrder(group, args, mine + first * es, (size - 1 - rank) * bytes, count, step);",
           "shared-memory reduce_scatter reduces another rank's piece into this rank's block"),
    Mutant("shm_reduce_root_is_rank_zero", "cpu/shm/reduce.cpp",
           "const bool root = group.rank() == args.root;",
           "const bool root = group.rank() == 0;",
           "shared-memory reduce: rank 0 reduces whatever the root"),
    Mutant("shm_barrier_does_not_wait", "cpu/shm/barrier.cpp",
           "  group.waitAllPosted(step, 0, args.deadline);\n",
           "",
           "shared-memory barrier: a rank posts and leaves without waiting for the others"),
    Mutant("shm_fingerprint_unchecked", "cpu/shm/shm_group.cpp",
           "if (!agrees(header, current_, stepBytes)) {",
           "if (false && !agrees(header, current_, stepBytes)) {",
           "shared-memory steps do not compare the peer's fingerprint (mismatched collectives mix bytes)"),
    Mutant("channel_head_off_by_one", "cpu/p2p/channels.cpp",
           "const size_t at = static_cast<size_t>(head % ringBytes_);",
           "const size_t at = static_cast<size_t>((head + 1) % ringBytes_);",
           "send/recv channel: the producer writes one byte past the ring's head"),
    Mutant("channel_tail_off_by_one", "cpu/p2p/channels.cpp",
           "const size_t at = static_cast<size_t>(tail % ringBytes_);",
           "const size_t at = static_cast<size_t>((tail + 1) % ringBytes_);",
           "send/recv channel: the consumer reads one byte past the ring's tail"),
    # Connections on demand, the arrival tree, combining on arrival, the hierarchy's
    # offsets, shrink's agreement, process identity and the fork guard, each killed by its own tests.
    Mutant("on_demand_tie_break_reversed", "cpu/transport/tcp_on_demand.cpp",
           "(!state.connecting[static_cast<size_t>(peer)] || peer < setup.rank)",
           "(!state.connecting[static_cast<size_t>(peer)] || peer > setup.rank)",
           "two ranks connecting to each other at once keep the higher rank's connection",
           ("tests/test_on_demand.py",)),
    Mutant("on_demand_pending_cap_per_rank", "cpu/transport/tcp_on_demand.cpp",
           "acceptWaitingConnections(state.setup, state.listener, 0, pending);",
           "acceptWaitingConnections(state.setup, state.listener, size_, pending);",
           "on demand, P + 64 handshakes may be pending at once instead of 64",
           ("tests/test_auth.py", "-k", "silent_strangers")),
    Mutant("on_demand_listener_open_after_abort", "cpu/transport/tcp.cpp",
           "  // listener (its connect is refused: kPeerClosed within kRefusedMeansGone), not at its deadline.\n"
           "  stopAcceptor();",
           "  // listener (its connect is refused: kPeerClosed within kRefusedMeansGone), not at its deadline.\n",
           "after abort() the on-demand listener stays open and drops every handshake: a peer retries until its deadline",
           ("tests/test_departure.py",)),
    Mutant("on_demand_address_read_unbounded", "cpu/transport/tcp_on_demand.cpp",
           "setup.rendezvous.getBefore(setup.addressKey(peer), strCat(\"the address of rank \", peer), deadline, &aborted_);",
           "std::optional<std::string>(setup.rendezvous.get(setup.addressKey(peer), \"an address\"));",
           "a pair's first connect waits for the peer's address as long as the store allows, through abort()",
           ("tests/test_on_demand.py", "-k", "unpublished")),
    Mutant("shm_abort_not_departed", "cpu/shm/shm_group.cpp",
           "control(rank_).departed.compare_exchange_strong(none, static_cast<uint32_t>(why), std::memory_order_seq_cst);",
           "(void)none;",
           "a rank that aborts or leaves says so only in its own process: its peers wait for it in the segment",
           ("tests/test_departure.py",)),
    Mutant("tree_arrival_not_marked", "cpu/shm/shm_group.cpp",
           "    arrive(which, step);\n    markArrived(which, step);",
           "    arrive(which, step);",
           "a peer that arrived at the tree and then left is taken for one that died before its arrival",
           ("tests/test_shm_tree.py", "-k", "left_after_its_arrival")),
    Mutant("tree_node_completes_early", "cpu/shm/shm_group.cpp",
           "if (before + 1 < static_cast<uint32_t>(tree_.membersOf(level, member))) return;",
           "if (before + 2 < static_cast<uint32_t>(tree_.membersOf(level, member))) return;",
           "an arrival-tree node completes one arrival early (the step is released before the last rank posted)",
           ("tests/test_shm_tree.py",)),
    Mutant("combine_publishes_before_writing", "cpu/shm/shm_group.cpp",
           "  if (which == Flag::kPosted && combine_ != nullptr) combineAtRoot(step);\n"
           "  GroupWake& group = groupWake(which);\n"
           "  // seq_cst, then `sleepers`: the waiter's protocol in waitForTree (as publish's for flat waits).\n"
           "  group.treeReached.store(step, std::memory_order_seq_cst);",
           "  GroupWake& group = groupWake(which);\n"
           "  group.treeReached.store(step, std::memory_order_seq_cst);\n"
           "  if (which == Flag::kPosted && combine_ != nullptr) combineAtRoot(step);",
           "the rank that combines a small all_reduce on arrival releases the step before it wrote the result",
           ("tests/test_shm_tree.py", "-k", "flat_bits")),
    Mutant("alltoall_proxy_delivery_offset", "cpu/hierarchy/alltoall_hierarchical.cpp",
           "deliveryOffset_[at(j, peer)] = out;",
           "deliveryOffset_[at(j, peer)] = 0;",
           "all_to_all across hosts: a proxy puts every block it delivers to a local rank at the start of its delivery",
           ("tests/test_multihost.py", "-k", "hierarchical_collectives_across_hosts and 2+2-on-demand")),
    Mutant("allgather_hierarchical_rank_major", "cpu/hierarchy/allgather_hierarchical.cpp",
           "const size_t at = hosts.stagedOffset(owner, block);",
           "const size_t at = static_cast<size_t>(owner) * block;",
           "hierarchical all_gather reads the staged blocks in rank order where they are host-major",
           ("tests/test_multihost.py", "-k", "not_host_major")),
    Mutant("rails_gather_wrong_owner", "cpu/shm/allgather.cpp",
           "      const int owner = part % size;",
           "      const int owner = (part + 1) % size;",
           "all_reduce on rails: a host's ranks copy each part out of the buffer of a rank that does not own it",
           ("tests/test_multihost.py", "-k", "on_rails and 2+2")),
    Mutant("rails_part_numbered_by_transport", "cpu/hierarchy/host_hierarchy.cpp",
           "  fingerprint.part = static_cast<uint8_t>(claimedPart_ + rail);\n  fingerprint.partGiven = true;",
           "  fingerprint.part = static_cast<uint8_t>(claimedPart_ + rail);",
           "all_reduce on rails: each rank numbers its rails' wire parts by its own history in the op (a rank "
           "that carries two rails against one that carries one)",
           ("tests/test_multihost.py", "-k", "on_rails and 2+2+3")),
    Mutant("caller_spin_without_the_caller_mark", "backend/backend.cpp",
           "      if (spin) blocked.emplace();\n",
           "",
           "a sync op run on the calling thread is not marked as a blocked caller's, so its waits never spin longer",
           ("tests/test_caller_thread.py", "-k", "blocked_caller")),
    Mutant("caller_spin_trial_keeps_the_spin_whatever_it_measured", "backend/caller_spin_trial.cpp",
           "kSpinMargin * static_cast<double>(sleeping);",
           "kSpinMargin * static_cast<double>(sleeping) + 1e18;",
           "the caller spin trial keeps spinning after every trial, even where sleeping was faster",
           ("tests/test_caller_thread.py", "-k", "trial or first_op or period")),
    Mutant("caller_spin_trial_times_the_first_op_after_a_switch", "backend/caller_spin_trial.cpp",
           "  const bool follows = previous_.has_value() && *previous_ == spun;",
           "  const bool follows = true;",
           "the caller spin trial times the first op of each block, which also waits out the peers' previous "
           "op run the other way",
           ("tests/test_caller_thread.py", "-k", "trial or first_op or period")),
    Mutant("caller_spin_on_the_worker_too", "cpu/transport/wait_policy.hpp",
           "  if (own.count() == 0 || !callerBlocks()) return own;",
           "  if (own.count() == 0) return own;",
           "every wait spins DDPLITE_CALLER_SPIN_US, the worker's for async ops (DDP's buckets) too",
           ("tests/test_caller_thread.py", "-k", "blocked_caller")),
    Mutant("caller_spin_not_given_to_the_host_segment", "cpu/hierarchy/host_hierarchy.cpp",
           "  if (hierarchy->local_) hierarchy->local_->setCallerSpin(env::callerSpin());  // ShmGroup::setCallerSpin\n",
           "",
           "across hosts, a blocked caller's waits in its host's segment keep the short spin",
           ("tests/test_multihost.py", "-k", "blocked_callers")),
    Mutant("self_send_allowed_on_cpu", "backend/validation.cpp",
           "if (peer == ctx.rank && peer >= 0 && peer < ctx.size && !selfServed) {",
           "if (peer == ctx.rank && peer >= 0 && peer < ctx.size && false) {",
           "a rank's send to itself is let through on the CPU, where no transport pairs it",
           ("tests/test_p2p_groups.py", "-k", "p2p_errors")),
    Mutant("self_ops_pair_any_size", "cuda/rules/nccl_rules.cpp",
           "k < receives.size() && ops[sends[k]].bytes == ops[receives[k]].bytes;",
           "k < receives.size();",
           "a rank's send to itself in an NCCL group is paired with a receive of another size",
           ("tests/test_cuda_rules.py", "-k", "self_ops")),
    Mutant("status_answers_without_proof", "health/status_server.cpp",
           "if (!secret_.open && !auth::sameDigest(client.proof, expected)) {",
           "if (false) {",
           "the status listener answers a query whatever MAC it sends: a stranger reads the job's state",
           ("tests/test_status.py", "-k", "stranger")),
    Mutant("ledger_arrival_is_the_end", "backend/backend.cpp",
           "waits_->record(work.context().seq, work.stages().issued, work.stages().ran);",
           "waits_->record(work.context().seq, work.stages().ran, work.stages().ran);",
           "straggler ledger: a collective's arrival recorded as its end (no rank ever waits)",
           ("tests/test_stragglers.py", "-k", "slower and shm")),
    Mutant("shrink_ignores_decision", "backend/failures.cpp",
           "    const std::string decided = decide(agreed);\n    if (decided != agreed) throwAbandoned(decided);",
           "    decide(agreed);",
           "a survivor that agrees after the others abandoned a shrink builds the new group alone",
           ("tests/test_shrink.py",)),
    Mutant("split_numbers_sorted_ranks", "backend/backend.cpp",
           "  auto child = c10::make_intrusive<DdpliteBackend>(childStore, static_cast<int>(me - ranks.begin()),",
           "  auto child = c10::make_intrusive<DdpliteBackend>(childStore, static_cast<int>(std::find(sorted.begin(), sorted.end(), rank_) - sorted.begin()),",
           "split_group's new ranks numbered in sorted order where torch 2.14+ numbers them in the caller's order",
           ("tests/test_parity.py", "-k", "split_group")),
    Mutant("options_clone_sliced", "backend/backend.hpp",
           "    return c10::make_intrusive<DdpliteOptions>(*this);",
           "    return c10::make_intrusive<c10d::Backend::Options>(*this);",
           "torch 2.14+'s Options::clone() of ddplite's options returns torch's type",
           ("tests/test_registration.py", "-k", "options_keep")),
    Mutant("process_identity_ignores_pid_reuse", "common/process_identity.cpp",
           "  if (line.startTicks != peer.startTicks) return ProcessState::kEnded;  // the pid was handed on\n",
           "",
           "a rank's pid handed on to another process reads as the rank still running",
           ("tests/test_process_identity.py",)),
    Mutant("fork_guard_registers_late", "common/fork_guard.cpp",
           "      registry->emplace_back(fd, owner);\n    } catch (...) {",
           "      (void)owner;\n    } catch (...) {",
           "a socket made on demand is not registered with the fork guard at its creation",
           ("tests/test_fork.py", "-k", "while_a_pair_connects")),
]


def run(command, cwd, env=None, timeout=None, log=None):
    """(exit code or None on timeout, output, seconds). On timeout the whole process group is
    killed: the test ranks and the forkserver too."""
    started = time.monotonic()
    process = subprocess.Popen(command, cwd=cwd, env=env, text=True, stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, start_new_session=True)
    try:
        output, _ = process.communicate(timeout=timeout)
        code = process.returncode
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        output, _ = process.communicate()
        code = None
    if log:
        with open(log, "a") as handle:
            handle.write(f"$ {' '.join(command)}\n{output}\n")
    return code, output, time.monotonic() - started


def clone(workdir):
    if os.path.exists(workdir):
        shutil.rmtree(workdir)
    subprocess.run(["git", "clone", "--quiet", "--local", REPO, workdir], check=True)
    head = subprocess.check_output(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, text=True).strip()
    subprocess.run(["git", "checkout", "--quiet", head], cwd=workdir, check=True)
    return head


def environment(workdir):
    env = dict(os.environ)
    env["PYTHONPATH"] = workdir + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env.setdefault("MAX_JOBS", "2")
    env["TORCH_DEVICE_BACKEND_AUTOLOAD"] = "0"  # the build must not import the extension it replaces
    return env


def build(workdir, log):
    code, output, seconds = run([sys.executable, "setup.py", "build_ext", "--inplace"], workdir,
                                environment(workdir), timeout=3600, log=log)
    return code == 0, seconds


def run_subset(workdir, log, timeout_s, tests=()):
    """The fast subset, or `tests` (a mutant's own): "killed" at the first failure."""
    env = environment(workdir)
    env.pop("TORCH_DEVICE_BACKEND_AUTOLOAD")
    command = [sys.executable, "-m", "pytest", "-x", "-q", "-m", "not slow", "-p", "no:cacheprovider", "-rf",
               *(tests or SUBSET)]
    code, output, seconds = run(command, workdir, env, timeout=timeout_s, log=log)
    if code is None:
        return "killed", f"(timed out after {timeout_s} s)", seconds
    failed = re.findall(r"^FAILED (\S+)", output, re.MULTILINE)
    if code == 0:
        return "survived", "", seconds
    if code == 1 and failed:
        return "killed", failed[0].split(" ")[0], seconds
    return "error", f"pytest exit {code}", seconds


def check_imports_clone(workdir):
    code, output, _ = run([sys.executable, "-c", "import torch_ddp_lite; print(torch_ddp_lite.__file__)"],
                          "/", environment(workdir) | {"TORCH_DEVICE_BACKEND_AUTOLOAD": "1"})
    if code != 0 or not output.strip().splitlines()[-1].startswith(workdir):
        sys.exit(f"the clone's package is not the one imported: {output}")


def stale(root, mutant):
    """Why `mutant` cannot be applied to the sources under `root`, or ""."""
    with open(os.path.join(root, "csrc", mutant.path)) as handle:
        occurrences = handle.read().count(mutant.before)
    if occurrences != 1:
        return (f"mutant {mutant.name}: its line occurs {occurrences} times in csrc/{mutant.path} "
                "(the sources changed; update the mutant)")
    return ""


def apply(workdir, mutant):
    path = os.path.join(workdir, "csrc", mutant.path)
    if stale(workdir, mutant):
        sys.exit(stale(workdir, mutant))
    with open(path) as handle:
        text = handle.read()
    with open(path, "w") as handle:
        handle.write(text.replace(mutant.before, mutant.after))
    return text


def merged_table(path, lines, head):
    """The table at `path` with the rows of `lines` (a run with --only) put in: a mutant's new row
    replaces its old one, new mutants are appended; the first line says which commit each part is
    from, and the count is recomputed."""
    with open(path) as handle:
        old = handle.read().splitlines()
    rows = {}
    for line in old + lines:
        if line.startswith("| `"):
            rows[line.split("`")[1]] = line
    order = [m.name for m in MUTANTS if m.name in rows]
    killed = sum(1 for name in order if "| killed |" in rows[name])
    first = old[0] if old and old[0].startswith("Mutants of commit") else lines[0]
    reruns = [line for line in old if line.startswith("Rerun at commit")]  # earlier --only runs stay named
    updated = ", ".join(line.split("`")[1] for line in lines if line.startswith("| `"))
    return "\n".join([first, *reruns, f"Rerun at commit `{head}` with `--only` for: {updated}.", "", *lines[2:4],
                      *(rows[name] for name in order), "", f"{killed} of {len(order)} killed."]) + "\n"


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", nargs="+", metavar="NAME", help="run these mutants only")
    parser.add_argument("--list", action="store_true", help="list the mutants and exit")
    parser.add_argument("--check", action="store_true",
                        help="only check that every mutant still applies to this checkout's sources")
    parser.add_argument("--workdir", default="/tmp/ddplite-mutants", help="scratch clone (replaced)")
    parser.add_argument("--in-place", action="store_true",
                        help="mutate and rebuild this checkout instead of a clone (no full build of a clone: each "
                             "mutant costs an incremental build); csrc/ must have no uncommitted change, every file "
                             "is restored and the extension rebuilt at the end")
    parser.add_argument("--timeout", type=int, default=1800, help="seconds of tests per mutant")
    parser.add_argument("--skip-baseline", action="store_true", help="do not run the subset on the unmutated build")
    parser.add_argument("--table", default=os.path.join(REPO, "docs", "data", "mutants.md"),
                        help="where to write the markdown table")
    args = parser.parse_args()
    if args.list:
        for mutant in MUTANTS:
            print(f"{mutant.name:34} csrc/{mutant.path}: {mutant.what}")
        return 0
    if args.check:
        problems = [stale(REPO, m) for m in MUTANTS if stale(REPO, m)]
        print("\n".join(problems) or f"all {len(MUTANTS)} mutants apply")
        return 1 if problems else 0
    chosen = [m for m in MUTANTS if not args.only or m.name in args.only]
    unknown = set(args.only or []) - {m.name for m in MUTANTS}
    if unknown:
        parser.error(f"unknown mutant(s) {sorted(unknown)}; see --list")
    if args.in_place:
        if subprocess.run(["git", "diff", "--quiet", "HEAD", "--", "csrc"], cwd=REPO).returncode != 0:
            sys.exit("--in-place needs csrc/ as committed: commit or stash its changes first")
        args.workdir = REPO
        head = subprocess.check_output(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, text=True).strip()
        log = os.path.join("/tmp", "ddplite-mutants-in-place.log")
    else:
        head = clone(args.workdir)
        log = os.path.join(args.workdir, "mutants.log")
    print(f"commit {head}, clone {args.workdir}, log {log}", flush=True)
    ok, seconds = build(args.workdir, log)
    if not ok:
        sys.exit(f"the unmutated clone does not build; see {log}")
    check_imports_clone(args.workdir)
    print(f"baseline build {seconds:.0f} s", flush=True)
    if not args.skip_baseline:
        for tests in dict.fromkeys(m.tests for m in chosen):  # the fast subset (), and each mutant's own tests
            outcome, test, seconds = run_subset(args.workdir, log, args.timeout, tests)
            print(f"baseline tests {' '.join(tests or ['(fast subset)'])}: {outcome} {test} ({seconds:.0f} s)",
                  flush=True)
            if outcome != "survived":
                sys.exit("these tests fail without any mutant; fix that first")
    rows = []
    for mutant in chosen:
        original = apply(args.workdir, mutant)
        try:
            built, build_s = build(args.workdir, log)
            if built:
                outcome, test, test_s = run_subset(args.workdir, log, args.timeout, mutant.tests)
            else:
                outcome, test, test_s = "build failed", "", 0.0
        finally:
            with open(os.path.join(args.workdir, "csrc", mutant.path), "w") as handle:
                handle.write(original)
        rows.append((mutant, outcome, test, build_s, test_s))
        print(f"{mutant.name:34} {outcome:9} {test} (build {build_s:.0f} s, tests {test_s:.0f} s)", flush=True)
    build(args.workdir, log)  # leave the clone unmutated
    lines = [f"Mutants of commit `{head}`, fast subset `{' '.join(SUBSET)}` with `-m 'not slow' -x` "
             f"(command: `python3 scripts/mutants.py`).", "",
             "| mutant | bug it stands for | outcome | first failing test | tests (s) |",
             "|---|---|---|---|---|"]
    for mutant, outcome, test, _, test_s in rows:
        own = f"; its tests: `{' '.join(mutant.tests)}`" if mutant.tests else ""
        lines.append(f"| `{mutant.name}` | {mutant.what} (csrc/{mutant.path}{own}) | {outcome} | `{test}` | {test_s:.0f} |")
    killed = sum(1 for row in rows if row[1] == "killed")
    lines += ["", f"{killed} of {len(rows)} killed."]
    table = "\n".join(lines) + "\n"
    print(table)
    if args.table and args.only and os.path.exists(args.table):
        table = merged_table(args.table, lines, head)
    if args.table:
        os.makedirs(os.path.dirname(args.table), exist_ok=True)
        with open(args.table, "w") as handle:
            handle.write(table)
    return 0 if killed == len(rows) else 1


if __name__ == "__main__":
    sys.exit(main())
