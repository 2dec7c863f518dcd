// What only the tests bind (pybind only; no logic here): introspection of a group's transport and
// bootstrap, the decisions of the CUDA path without a GPU (nccl_rules), the reduction kernels,
// address parsing, the arrival tree's shape and the like. They join the module torch_ddp_lite._C
// (bindings.cpp calls bindTestHooks last), under names no user-facing code uses.
#include "test_hooks.hpp"

#include "backend/backend.hpp"
#include "backend/caller_spin_trial.hpp"
#include "backend/coalescing.hpp"
#include "binding_helpers.hpp"
#include "common/numa.hpp"
#include "common/process_identity.hpp"
#include "cpu/algorithms/selector.hpp"
#include "cpu/reduce/reduce_kernels.hpp"
#include "cpu/shm/arrival_tree.hpp"
#include "cpu/shm/shm_algorithms.hpp"
#include "cpu/transport/auth.hpp"
#include "cpu/transport/net_iface.hpp"
#include "cpu/transport/tcp.hpp"
#include "cuda/rules/nccl_rules.hpp"
#include "rendezvous/bootstrap.hpp"

#include <pybind11/chrono.h>
#include <torch/extension.h>

namespace py = pybind11;

namespace ddplite {

namespace {

namespace rules = ddplite::nccl::rules;
using IdentityTuple = std::tuple<std::string, std::string, std::string, int, int, bool>;

rules::GpuIdentity toIdentity(const IdentityTuple& t) {
  return rules::GpuIdentity{std::get<0>(t), std::get<1>(t), std::get<2>(t), std::get<3>(t), std::get<4>(t), std::get<5>(t)};
}

std::vector<rules::GpuIdentity> toIdentities(const std::vector<IdentityTuple>& tuples) {
  std::vector<rules::GpuIdentity> out;
  for (const auto& t : tuples) out.push_back(toIdentity(t));
  return out;
}

void bindNcclRules(py::module_ m) {
  m.def("encode_identity", [](const IdentityTuple& t) { return rules::encodeIdentity(toIdentity(t)); },
        py::arg("identity"), "(host, bus_id, uuid, cc_major, cc_minor, multi_rank_gpu) -> the exchanged text.");
  m.def(
      "decode_identity",
      [](const std::string& text) {
        const rules::GpuIdentity id = rules::decodeIdentity(text);  // std::invalid_argument -> ValueError
        return IdentityTuple{id.host, id.busId, id.uuid, id.ccMajor, id.ccMinor, id.multiRankGpu};
      },
      py::arg("text"));
  m.def(
      "shared_gpu",
      [](const std::vector<IdentityTuple>& identities) {
        const rules::SharedGpuDecision decision = rules::sharedGpu(toIdentities(identities));
        return py::make_tuple(decision.sharedGpu, decision.ncclServes);
      },
      py::arg("identities"), "(description of the first pair of ranks on one GPU or '', whether NCCL serves the group).");
  m.def("min_compute_capability", [](const std::vector<IdentityTuple>& ids) { return rules::minComputeCapability(toIdentities(ids)); },
        py::arg("identities"));
  m.def("fp8_reduction_refusal", &rules::fp8ReductionRefusal, py::arg("nccl_has_fp8"), py::arg("min_comp_cap"),
        "'' when NCCL can reduce float8 on the group, else why not.");
  m.def("identity_key", &rules::identityKey, py::arg("ordinal"), py::arg("rank"));
  m.def("unique_id_key", &rules::uniqueIdKey, py::arg("ordinal"));
  m.def(
      "poll_while_in_progress",
      [](const std::vector<int>& codes, int inProgress, int success, int stepMs, int deadlineMs, int cancelAfter) {
        // A fake clock: it starts at 0 and each pause advances it by step_ms; query i answers
        // codes[i] (the last one repeated).
        using Clock = std::chrono::steady_clock;
        const Clock::time_point start{};
        Clock::time_point now = start;
        size_t asked = 0;
        const rules::PollResult result = rules::pollWhileInProgress(
            [&] { return codes.at(std::min(asked++, codes.size() - 1)); }, inProgress, success, [&] { return now; },
            start + std::chrono::milliseconds(deadlineMs), [&] { now += std::chrono::milliseconds(stepMs); },
            [&] { return cancelAfter >= 0 && static_cast<int>(asked) >= cancelAfter; });
        const char* outcome = result.outcome == rules::PollOutcome::kDone        ? "done"
                              : result.outcome == rules::PollOutcome::kFailed    ? "failed"
                              : result.outcome == rules::PollOutcome::kCancelled ? "cancelled"
                                                                                 : "timed out";
        const auto elapsed = std::chrono::duration_cast<std::chrono::milliseconds>(now - start).count();
        return py::make_tuple(outcome, result.lastCode, result.polls, elapsed);
      },
      py::arg("codes"), py::arg("in_progress"), py::arg("success"), py::arg("step_ms"), py::arg("deadline_ms"),
      py::arg("cancel_after") = -1,
      "(outcome, last code, polls, fake ms elapsed) of polling a scripted sequence of NCCL result codes; an abort "
      "is requested once cancel_after polls were made (-1: never).");
  m.def(
      "split_args",
      [](const std::vector<int>& members, int parentRank, int noColor) {
        const rules::SplitArgs args = rules::splitArgs(members, parentRank, noColor);
        return py::make_tuple(args.color, args.key);
      },
      py::arg("sorted_members"), py::arg("parent_rank"), py::arg("no_color"),
      "(color, key) this rank passes to ncclCommSplit in a split_group.");
  m.def(
      "shrink_plan",
      [](bool builtWithShrink, const std::tuple<int, int, int>& loaded, bool parentUsable, bool abortPending) {
        const auto [major, minor, patch] = loaded;
        const rules::ShrinkPlan plan = rules::shrinkPlan(builtWithShrink, rules::Version{major, minor, patch},
                                                         parentUsable, abortPending);
        return py::make_tuple(plan.how == rules::ShrinkComm::kShrinkParent ? "shrink parent" : "new communicator",
                              plan.ncclFlags, plan.why);
      },
      py::arg("built_with_shrink"), py::arg("loaded_version"), py::arg("parent_usable"), py::arg("abort_pending"),
      "(how, ncclCommShrink flags, why): how a shrunk group gets its communicator on a device.");
  m.def(
      "unpaired_self_ops",
      [](const std::vector<std::tuple<bool, int, size_t>>& ops) {
        std::vector<rules::SelfOp> selfOps;
        for (const auto& [send, device, bytes] : ops) selfOps.push_back(rules::SelfOp{send, device, bytes});
        return rules::unpairedSelfOps(selfOps);
      },
      py::arg("ops"),
      "Indices of the (send, device, bytes) self-ops of one NCCL group that the path fails unissued.");
  m.def(
      "teardown_for",
      [](const std::string& cause, bool broken) {
        const rules::TeardownCause c = cause == "shutdown" ? rules::TeardownCause::kShutdown
                                       : cause == "abort"  ? rules::TeardownCause::kAbort
                                       : cause == "destructor"
                                           ? rules::TeardownCause::kDestructor
                                           : throw std::invalid_argument("cause: shutdown, abort or destructor");
        return std::string(rules::teardownFor(c, broken) == rules::Teardown::kAbort ? "abort" : "drain then destroy");
      },
      py::arg("cause"), py::arg("group_broken"));
}

}  // namespace

void bindTestHooks(py::module_& m) {

  m.def(
      "group_transport",
      [](const c10::intrusive_ptr<c10d::Backend>& backend) {
        ddplite::DdpliteBackend& group = asDdplite(backend);
        return py::make_tuple(std::string(group.cpuTransportName()), std::string(group.bootstrap().name()));
      },
      py::arg("backend"), "(CPU collective transport, bootstrap) of a ddplite group: ('tcp'|'mpi'|'shm'|'hierarchical', 'store'|'mpi').");
  m.def(
      "group_p2p_path",
      [](const c10::intrusive_ptr<c10d::Backend>& backend) { return std::string(asDdplite(backend).p2pPathName()); },
      py::arg("backend"), "What carries a ddplite group's send/recv: 'shared-memory channels' or 'TCP'.");
  m.def(
      "bootstrap_broadcast",
      [](const c10::intrusive_ptr<c10d::Backend>& backend, const std::string& key, const std::string& blob, int root) {
        ddplite::DdpliteBackend& group = asDdplite(backend);
        std::string result;
        {
          py::gil_scoped_release release;
          result = group.bootstrap().broadcast(key, blob, root);
        }
        return py::bytes(result);
      },
      py::arg("backend"), py::arg("key"), py::arg("blob"), py::arg("root"),
      "Runs the group's set-up broadcast (what carries the NCCL unique id); collective over the group.");

  m.def(
      "this_process_identity",
      [] {
        const ddplite::ProcessIdentity self = ddplite::ProcessIdentity::ofThisProcess();
        return py::make_tuple(self.pid, self.startTicks, self.pidNamespace);
      },
      "(pid, start ticks, PID namespace) of this process, as shared-memory peers publish it (common/process_identity.hpp).");
  m.def(
      "process_state",
      [](uint32_t pid, uint64_t startTicks, uint64_t pidNamespace) {
        switch (ddplite::stateOf(ddplite::ProcessIdentity{pid, startTicks, pidNamespace})) {
          case ddplite::ProcessState::kRunning: return std::string("running");
          case ddplite::ProcessState::kEnded: return std::string("ended");
          case ddplite::ProcessState::kUnknown: break;
        }
        return std::string("unknown");
      },
      py::arg("pid"), py::arg("start_ticks"), py::arg("pid_namespace"),
      "'running', 'ended' or 'unknown': how a shared-memory peer sees the process of that identity.");

  m.def(
      "coalesced_work",
      [](const std::vector<c10::intrusive_ptr<c10d::Work>>& parts) {
        return ddplite::coalescedWork(ddplite::OpContext{0, 1, "coalesced", 0}, parts, /*timed=*/false);
      },
      py::arg("parts"),
      "The one Work endCoalescing returns for `parts` (backend/coalescing.hpp); for tests with Works of "
      "other kinds than ddplite's CPU Work (NCCL's, or Python ones).");
  m.def(
      "bootstrap_holds",
      [](const c10::intrusive_ptr<c10d::Backend>& backend, const std::string& key) -> py::object {
        auto* store = dynamic_cast<ddplite::StoreBootstrap*>(&asDdplite(backend).bootstrap());
        if (store == nullptr) return py::none();
        py::gil_scoped_release release;
        const bool held = store->holds(key);
        py::gil_scoped_acquire acquire;
        return py::bool_(held);
      },
      py::arg("backend"), py::arg("key"), "Whether a store bootstrap's key is still in the store (None: MPI bootstrap).");
  m.def(
      "caller_spin_trial",
      [](bool measured, const std::vector<std::tuple<uint64_t, double, double>>& ops) {
        ddplite::CallerSpinTrial trial(measured);
        std::vector<bool> spun;
        for (const auto& [seq, spinUs, sleepUs] : ops) {
          const bool spin = trial.spins(seq);
          trial.record(seq, spin, std::chrono::nanoseconds(static_cast<int64_t>((spin ? spinUs : sleepUs) * 1000)));
          spun.push_back(spin);
        }
        return spun;
      },
      py::arg("measured"), py::arg("ops"),
      "Runs backend/caller_spin_trial.hpp over ops (sequence number, us it takes spinning, us sleeping): "
      "whether each op spun.");
  bindNcclRules(m.def_submodule("nccl_rules", "The NCCL path's decisions (cuda/rules/nccl_rules.hpp), without a GPU."));
  m.def("automatic_algorithm", &ddplite::cpu::automaticChoiceByName, py::arg("collective"), py::arg("bytes"),
        py::arg("world_size"), "The algorithm the automatic rule picks (pins ignored); docs/algorithms.md.");
  m.def("shm_reduce_scatter_piece_count", &ddplite::cpu::shm::reduceScatterPieceCount, py::arg("chunk_bytes"),
        py::arg("world_size"), py::arg("element_size"),
        "Elements per piece of reduce_scatter through shared memory; 0: it goes over TCP (cpu/shm/).");
  m.def(
      "group_kernel_set",
      [](const c10::intrusive_ptr<c10d::Backend>& backend) { return asDdplite(backend).kernelSetName(); },
      py::arg("backend"), "The reduction kernel set a ddplite group uses ('generic', 'avx2', 'avx512').");
  m.def(
      "reduce_with_kernels",
      [](const std::string& set, const std::string& opName, const std::vector<at::Tensor>& sources) {
        using RedOpType = c10d::ReduceOp::RedOpType;
        RedOpType op = RedOpType::UNUSED;
        for (RedOpType candidate : {RedOpType::SUM, RedOpType::AVG, RedOpType::PRODUCT, RedOpType::MIN, RedOpType::MAX,
                                    RedOpType::BAND, RedOpType::BOR, RedOpType::BXOR, RedOpType::PREMUL_SUM}) {
          if (opName == ddplite::cpu::reduceOpName(candidate)) op = candidate;
        }
        if (op == RedOpType::UNUSED) throw std::invalid_argument("unknown reduce op name '" + opName + "'");
        if (sources.empty()) throw std::invalid_argument("reduce_with_kernels needs at least one source");
        const at::Tensor& first = sources.front();
        for (const auto& source : sources) {
          if (!source.device().is_cpu() || !source.is_contiguous() || source.scalar_type() != first.scalar_type() ||
              source.numel() != first.numel()) {
            throw std::invalid_argument("reduce_with_kernels needs contiguous CPU tensors of one dtype and size");
          }
        }
        ddplite::cpu::ReduceManyFn fold =
            ddplite::cpu::selectReduceManyFn(first.scalar_type(), op, ddplite::cpu::kernelSetNamed(set));
        if (fold == nullptr) throw std::invalid_argument(ddplite::cpu::reduceOpProblem(first.scalar_type(), op));
        std::vector<const void*> pointers;
        for (const auto& source : sources) pointers.push_back(source.data_ptr());
        at::Tensor out = at::empty_like(first);
        fold(out.data_ptr(), pointers.data(), static_cast<int>(pointers.size()), static_cast<size_t>(first.numel()));
        return out;
      },
      py::arg("set"), py::arg("op"), py::arg("sources"),
      "The fold of one kernel set over `sources` (left to right) into a new tensor; `op` is a ReduceOp name "
      "('SUM', 'MIN', ...). For tests.");
  m.def(
      "parse_endpoint",
      [](const std::string& hostPort) {
        ddplite::net::Endpoint endpoint;
        std::string problem;
        if (!ddplite::net::parseEndpoint(hostPort, 0, &endpoint, &problem)) throw py::value_error(problem);
        return ddplite::net::describeEndpoint(endpoint.get());
      },
      py::arg("host_port"),
      "How a rank reads a published address ('10.0.0.1:80', '[fd00::1]:80', '[fe80::1%eth0]:80'): the "
      "address as it prints it; ValueError with the problem for malformed text. For tests.");
  m.def("ifname_matches", &ddplite::net::ifnameMatches, py::arg("spec"), py::arg("ifname"),
        "Whether an interface name matches an NCCL-style DDPLITE_SOCKET_IFNAME spec.");
  m.def("exchange_ranks_over_new_mesh", &ddplite::exchangeRanksOverNewMesh, py::arg("store"), py::arg("rank"),
        py::arg("size"), py::arg("timeout"), py::call_guard<py::gil_scoped_release>(),
        "Builds a TCP mesh alone (store keys ddplite/mesh-check/...), swaps rank numbers with every peer, returns "
        "them by peer: a test of connection set-up and authentication.");
  m.def(
      "hmac_sha256",
      [](const py::bytes& key, const py::bytes& message) {
        const ddplite::auth::Digest digest = ddplite::auth::hmacSha256(key, message);
        return py::bytes(reinterpret_cast<const char*>(digest.data()), digest.size());
      },
      py::arg("key"), py::arg("message"), "HMAC-SHA256 as the TCP meshes' handshake computes it (cpu/transport/auth.hpp).");
  m.def("numa_node_of_this_process", &ddplite::numaNodeOfThisProcess,
        "The NUMA node every CPU of this process's affinity mask is on; -1 when they span several or "
        "this cannot be told (common/numa.hpp).");
  m.def(
      "arrival_tree_shape",
      [](int ranks, int fanIn, const std::vector<int>& domains) {
        if (ranks < 1 || ranks > 65536 || fanIn < 2 || fanIn > 64) {
          throw py::value_error("arrival_tree_shape: ranks must be 1 to 65536 and fan_in 2 to 64");
        }
        const ddplite::cpu::ArrivalTree tree(ranks, fanIn, domains);
        py::list leaves;  // the ranks arriving at each node of level 0, in position order
        py::list representatives;  // per level, the rank standing for each member (compareMembers)
        for (int level = 0; level < tree.levels(); ++level) {
          py::list row;
          for (int member = 0; member < tree.membersAt(level); ++member) {
            row.append(tree.representative(level, member));
          }
          representatives.append(row);
        }
        if (tree.levels() > 0) {
          for (int first = 0; first < tree.membersAt(0); first += fanIn) {
            py::list members;
            for (int position = first; position < first + tree.membersOf(0, first); ++position) {
              members.append(tree.rankAt(position));
            }
            leaves.append(members);
          }
        }
        py::dict shape;
        shape["levels"] = tree.levels();
        shape["node_count"] = tree.nodeCount();
        shape["capacity"] = ddplite::cpu::ArrivalTree::nodeCapacity(ranks, fanIn);
        shape["numa_nodes"] = tree.domainCount();
        shape["leaves"] = leaves;
        shape["representatives"] = representatives;
        return shape;
      },
      py::arg("ranks"), py::arg("fan_in"), py::arg("domains"),
      "The arrival tree a shared-memory group of `ranks` builds with `fan_in` and these NUMA nodes per rank "
      "(cpu/shm/arrival_tree.hpp): levels, nodes, the segment's capacity, the ranks of each level-0 node "
      "and each level's representatives (-1: a gap).");
}

}  // namespace ddplite
