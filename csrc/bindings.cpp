// Python bindings of the user's surface (pybind only; no logic here). What only the tests use is
// bound by test_hooks.cpp, into the same module.
#include "backend/backend.hpp"
#include "binding_helpers.hpp"
#include "test_hooks.hpp"
#include "common/compat.hpp"
#include "common/env.hpp"
#include "cpu/algorithms/selector.hpp"
#include "cpu/reduce/reduce_kernels.hpp"
#include "cpu/transport/net_iface.hpp"
#include "health/status_server.hpp"
#include "rendezvous/mpi.hpp"

#if DDPLITE_WITH_NCCL
#include "cuda/nccl_errors.hpp"
#endif

#include <pybind11/chrono.h>
#include <torch/extension.h>

#ifndef DDPLITE_TORCH_VERSION
#error "setup.py defines DDPLITE_TORCH_VERSION as the torch version the extension is built against"
#endif
#ifndef DDPLITE_BUILD_FLAGS
#define DDPLITE_BUILD_FLAGS "unknown (not built by setup.py)"
#endif

namespace py = pybind11;

namespace {

// build_info()["cpu_transports"]: the values DDPLITE_CPU_TRANSPORT accepts in this build.
std::vector<std::string> cpuTransports() {
  std::vector<std::string> names{"tcp"};
  if (ddplite::mpi::compiledIn()) names.emplace_back("mpi");
  names.emplace_back("shm");  // POSIX shared memory: every Linux build
  return names;
}

// build_info()["nccl"]: whether the CUDA path is compiled in, and against which NCCL.
py::dict ncclBuildInfo() {
#if DDPLITE_WITH_NCCL
  const auto compiled = ddplite::nccl::compiledVersion();
  return py::dict(py::arg("compiled_in") = true,
                  py::arg("version") = py::make_tuple(compiled.major, compiled.minor, compiled.patch),
                  py::arg("include") = std::string(DDPLITE_NCCL_INCLUDE),
                  py::arg("library") = std::string(DDPLITE_NCCL_LIBRARY),
                  py::arg("fp8") = static_cast<bool>(DDPLITE_NCCL_HAS_FP8),
                  py::arg("multi_rank_gpu") = static_cast<bool>(DDPLITE_NCCL_HAS_MULTI_RANK_GPU));
#else
  return py::dict(py::arg("compiled_in") = false, py::arg("version") = py::none());
#endif
}

// build_info()["torch_features"]: what common/compat.hpp found in the torch headers built against.
py::dict torchFeatures() {
  return py::dict(py::arg("split") = static_cast<bool>(DDPLITE_TORCH_HAS_SPLIT),
                  py::arg("shrink") = static_cast<bool>(DDPLITE_TORCH_HAS_SHRINK),
                  py::arg("group_desc") = static_cast<bool>(DDPLITE_TORCH_HAS_GROUP_DESC),
                  py::arg("split_keeps_order") = static_cast<bool>(DDPLITE_TORCH_SPLIT_KEEPS_ORDER),
                  py::arg("options_clone") = static_cast<bool>(DDPLITE_TORCH_HAS_OPTIONS_CLONE),
                  py::arg("monitored_barrier_any_backend") = static_cast<bool>(DDPLITE_TORCH_MONITORED_BARRIER_ANY_BACKEND),
                  py::arg("torch_flight_recorder_hook") = static_cast<bool>(DDPLITE_TORCH_HAS_FLIGHT_RECORDER_HOOK));
}

}  // namespace

PYBIND11_MODULE(_C, m) {
  // Registers c10d::Store and c10d::Backend with pybind; without it the types below are unknown.
  py::module_::import("torch.distributed");

  m.doc() = "torch-ddp-lite: the ddplite torch.distributed backend (C++ core)";

  // A subclass of torch's Backend.Options that copy.deepcopy can copy (dist.split_group copies
  // the parent group's options).
  py::class_<ddplite::DdpliteOptions, c10d::Backend::Options, c10::intrusive_ptr<ddplite::DdpliteOptions>>(
      m, "DdpliteOptions",
      "The options of a ddplite group (torch's Backend.Options, copyable): pg_options for init_process_group "
      "and new_group. timeout: a timedelta, or None for torch's default.")
      .def(py::init([](std::optional<std::chrono::milliseconds> timeout) {
             return c10::make_intrusive<ddplite::DdpliteOptions>(ddplite::DdpliteBackend::kName,
                                                                 timeout.value_or(std::chrono::milliseconds(::kBackendDefaultTimeout)));
           }),
           py::arg("timeout") = py::none())
      .def("__copy__", [](const ddplite::DdpliteOptions& self) { return c10::make_intrusive<ddplite::DdpliteOptions>(self); })
      .def("__deepcopy__", [](const ddplite::DdpliteOptions& self, const py::dict&) {
        return c10::make_intrusive<ddplite::DdpliteOptions>(self);
      })
      // What torch's ProcessGroup::splitGroup gets from Options::clone() (torch 2.14+): through
      // torch's virtual, so a DdpliteOptions that did not override it comes back as torch's type.
      .def("_clone_as_torch_does",
           [](const c10::intrusive_ptr<ddplite::DdpliteOptions>& self) -> c10::intrusive_ptr<c10d::Backend::Options> {
#if DDPLITE_TORCH_HAS_OPTIONS_CLONE
             const c10::intrusive_ptr<c10d::Backend::Options> base = self;
             return base->clone();
#else
             return self->clone();  // no Options::clone in torch before 2.14: ddplite's own
#endif
           });
  // The ddplite group as Python sees it (pg._get_backend(device)): torch's Backend plus `options`,
  // which dist.split_group reads from the parent group (as it does from gloo's and NCCL's).
  py::class_<ddplite::DdpliteBackend, c10d::Backend, c10::intrusive_ptr<ddplite::DdpliteBackend>>(
      m, "DdpliteBackend", "A ddplite process group's backend (created by torch.distributed).")
      .def_property_readonly("options", &ddplite::DdpliteBackend::getBackendOptions,
                             "This group's options (timeout, group name), as torch's split_group reads them.")
      // torch calls it on the parent, for a rank left out of a new_group, once the default group
      // is bound to a device and its backend supports splitting (it is how NCCL's non-members
      // join ncclCommSplit). ddplite's new groups connect on their own: nothing to do.
      .def("perform_nocolor_split", [](ddplite::DdpliteBackend&, const py::object&) {}, py::arg("device"),
           "No-op: a ddplite rank outside a new group takes no part in making it.");

  m.def("stop_all_for_exit", &ddplite::stopAllBackendsForExit,
        "Ends every thread of every ddplite group of this process (pending ops fail unless the group was "
        "destroyed): torch_ddp_lite's atexit hook, so that no thread of ours meets Python's finalization.");
  m.def("create_backend", &ddplite::createBackend, py::arg("store"), py::arg("rank"), py::arg("size"),
        py::arg("timeout"), py::arg("global_ranks") = std::vector<int>{}, py::arg("group_name") = "",
        py::call_guard<py::gil_scoped_release>(),
        "Creates the ddplite Backend for one process group; connects every pair of ranks. global_ranks and "
        "group_name (torch's) name the group in flight-recorder dumps.");
  m.def("note_world_size", &ddplite::health::noteWorldSize, py::arg("world_size"),
        "The world's size, noted before each group is created: the number of ranks the live status tool asks.");
  m.def(
      "flight_recorder_pickle",
      [] {
        std::vector<char> bytes;
        {
          py::gil_scoped_release release;
          bytes = ddplite::flightRecorderPickle();
        }
        return py::bytes(bytes.data(), bytes.size());
      },
      "This process's flight-recorder dump (torch's format) as pickle bytes.");
  m.def(
      "dump_flight_recorder",
      [](const std::string& path) { return ddplite::dumpFlightRecorder(path); }, py::arg("path") = "",
      py::call_guard<py::gil_scoped_release>(),
      "Writes the flight-recorder dump; returns its path, or None when nothing records.");

  m.def("built_torch_version", [] { return std::string(DDPLITE_TORCH_VERSION); },
        "The torch version this extension was compiled against.");
  m.def(
      "build_info",
      [] {
        return py::dict(py::arg("compiler") = std::string(__VERSION__),
                        py::arg("flags") = std::string(DDPLITE_BUILD_FLAGS),
                        py::arg("cplusplus") = static_cast<long>(__cplusplus),
                        py::arg("mpi") = ddplite::mpi::compiledIn(),
                        py::arg("mpi_library") = ddplite::mpi::libraryVersion(),
                        py::arg("mpi_standard") = ddplite::mpi::standardVersion(), py::arg("nccl") = ncclBuildInfo(),
                        py::arg("cpu_transports") = cpuTransports(), py::arg("torch_features") = torchFeatures());
      },
      "The compiler, the flags setup.py added, the C++ standard, whether MPI was compiled in (with its "
      "library and standard versions), the NCCL the extension was built with, the CPU data paths "
      "DDPLITE_CPU_TRANSPORT can name in this build, and the torch features compiled in "
      "(common/compat.hpp; the same names as torch_ddp_lite/torch_versions.py's FEATURES).");

  // MPI (rendezvous/mpi.hpp). Without MPI compiled in these raise RuntimeError with a rebuild hint.
  m.def("mpi_init_world", &ddplite::mpi::initWorld, py::call_guard<py::gil_scoped_release>(),
        "Initialises MPI (MPI_THREAD_MULTIPLE) once; returns (world rank, world size).");
  m.def("mpi_is_initialized", &ddplite::mpi::isInitialized);
  m.def(
      "mpi_broadcast_world",
      [](const std::string& blob, int root) {
        std::string result;
        {
          py::gil_scoped_release release;
          result = ddplite::mpi::broadcastWorld(blob, root);
        }
        return py::bytes(result);
      },
      py::arg("blob"), py::arg("root"), "MPI_Bcast of bytes over MPI_COMM_WORLD.");
  m.def("mpi_finalize", &ddplite::mpi::finalizeAtExit, py::call_guard<py::gil_scoped_release>(),
        "MPI_Finalize if ddplite initialised MPI (idempotent; registered with atexit).");
  m.def("mpi_rebuild_hint", [] { return std::string(ddplite::mpi::kRebuildHint); });
  // Introspection of one group, for collect_env and torch_ddp_lite's helpers.
  m.def(
      "group_cpu_path",
      [](const c10::intrusive_ptr<c10d::Backend>& backend) {
        ddplite::DdpliteBackend& group = ddplite::asDdplite(backend);
        return py::make_tuple(std::string(group.cpuTransportName()), group.cpuPathReason());
      },
      py::arg("backend"), "(CPU collective transport, why it was chosen) of a ddplite group.");
  m.def(
      "work_stages",
      [](const c10::intrusive_ptr<c10d::Work>& work) -> py::object {
        auto* ours = dynamic_cast<ddplite::DdpliteWork*>(work.get());
        if (ours == nullptr) return py::none();
        // isCompleted() takes the Work's mutex, which finish() held when it completed the op: the
        // stages written before it are visible here. An op still running is refused, not raced.
        if (!ours->isCompleted()) {
          throw py::value_error("work_stages: the op has not completed yet; call work.wait() first");
        }
        const auto& stages = ours->stages();
        return py::make_tuple(stages.issued, stages.running, stages.ran, stages.finished);
      },
      py::arg("work"),
      "(issued, running, ran, finished): steady-clock ns of a completed ddplite CPU op's stages (0: not "
      "reached), or None for another backend's Work.");
  m.def("straggler_report_seconds", &ddplite::env::stragglerReportSeconds,
        "DDPLITE_STRAGGLER_REPORT: seconds between straggler reports on global rank 0 (0: none); raises "
        "ValueError naming the knob for a bad value.");
  m.def(
      "group_wait_ledger",
      [](const c10::intrusive_ptr<c10d::Backend>& backend) {
        const auto entries = ddplite::asDdplite(backend).waitLedger();
        py::list rows;
        for (const auto& entry : entries) rows.append(py::make_tuple(entry.seq, entry.arrivedNs, entry.endedNs));
        return rows;
      },
      py::arg("backend"),
      "[(seq, arrived_ns, ended_ns)] of a ddplite group's last collectives on this rank, oldest first "
      "(steady clock; torch_ddp_lite.stragglers).");
  m.def(
      "group_failed_ranks",
      [](const c10::intrusive_ptr<c10d::Backend>& backend, double waitSeconds) {
        ddplite::DdpliteBackend& group = ddplite::asDdplite(backend);
        py::gil_scoped_release released;  // store requests and sleeps
        return group.failedRanks(std::chrono::milliseconds(static_cast<int64_t>(waitSeconds * 1000)));
      },
      py::arg("backend"), py::arg("wait_seconds"),
      "The ranks of a ddplite group that are gone, agreed by every caller (torch_ddp_lite.failed_ranks).");

  m.def(
      "nccl_version",
      []() -> py::object {
#if DDPLITE_WITH_NCCL
        const auto compiled = ddplite::nccl::compiledVersion();
        const auto loaded = ddplite::nccl::loadedVersion();
        return py::dict(py::arg("compiled") = py::make_tuple(compiled.major, compiled.minor, compiled.patch),
                        py::arg("loaded") = py::make_tuple(loaded.major, loaded.minor, loaded.patch),
                        py::arg("compatible") = ddplite::nccl::loadedCanServeCompiled(loaded, compiled));
#else
        return py::none();
#endif
      },
      "{'compiled', 'loaded', 'compatible'} NCCL versions (ncclGetVersion needs no GPU); None without NCCL.");

  m.def(
      "env_knobs",
      [] {
        py::list knobs;
        for (const auto& knob : ddplite::env::allKnobs()) {
          knobs.append(py::make_tuple(knob.name, knob.defaultValue, knob.help));
        }
        return knobs;
      },
      "Every DDPLITE_* environment variable as (name, default, help).");

  m.def(
      "backend_options",
      [](const c10::intrusive_ptr<ddplite::DdpliteBackend>& backend) {
        auto options = backend->getBackendOptions();
        return py::make_tuple(options->backend, options->timeout);
      },
      py::arg("backend"), "(name, timeout) of a ddplite group, from its getBackendOptions() (torch does not bind it).");

  // Algorithm pins. std::invalid_argument from the parser surfaces as ValueError.
  m.def(
      "set_algorithm_pins",
      [](const std::string& spec) {
        ddplite::cpu::applyAlgorithmPinsFromEnv();
        ddplite::cpu::setAlgorithmPins(spec);
      },
      py::arg("spec"), "Pins algorithms from 'collective:algorithm,...' ('auto' unpins).");
  m.def(
      "algorithm_pins",
      [] {
        ddplite::cpu::applyAlgorithmPinsFromEnv();
        return ddplite::cpu::algorithmPins();
      },
      "(collective, pinned algorithm or 'auto') for every collective.");
  m.def("available_algorithms", &ddplite::cpu::availableAlgorithms, "(collective, [algorithm names]).");

  // Reduction kernels (std::invalid_argument surfaces as ValueError).
  m.def(
      "kernel_sets",
      [] {
        return py::make_tuple(ddplite::cpu::kernelSetName(ddplite::cpu::kernelSetFromEnv()),
                              ddplite::cpu::runnableSetNames());
      },
      "(the set a group created now would use, [the sets this CPU runs]) of the CPU reduction kernels "
      "(DDPLITE_CPU_KERNELS).");

  m.def(
      "listen_address",
      [](const std::string& storeHost) {
        std::string why;
        std::string address = ddplite::net::chooseListenAddress(&why, storeHost);
        return py::make_tuple(address, why);
      },
      py::arg("store_host") = "",
      "(address, why): the local address, IPv4 or IPv6, ranks listen on (DDPLITE_SOCKET_IFNAME, route to "
      "MASTER_ADDR or to `store_host`, the TCPStore's host; hostname).");

  ddplite::bindTestHooks(m);
}
