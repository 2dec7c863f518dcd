// Coalescing: the ops a group issues between startCoalescing() and endCoalescing() (torch's
// _coalescing_manager, batch_isend_irecv) and the one Work that stands for all of them.
//
// On the CPU paths the ops are issued as they come: the worker runs collectives in issue order,
// and send/recv are eager on the P2P engine (a send completes once its bytes are on the wire), so
// no order of them can deadlock, and a blocking call inside the group (dist.send, a collective
// with async_op=False) returns as it would outside it. The collector gathers their Works;
// endCoalescing() returns coalescedWork() over them. torch collects all_reduce,
// all_gather_into_tensor and reduce_scatter_tensor itself and issues them as one *_coalesced
// call inside the window, which the collector gathers like any other op. CUDA ops on NCCL are
// different: their NCCL calls are deferred to endCoalescing and issued as one NCCL group there
// (cuda/nccl_path.hpp), before coalescedWork() is built over their Works.
//
// Threads: torch issues a coalesced group from one thread. start() records it; add() takes ops
// from that thread only (an op another thread issues meanwhile, say a DDP comm hook on an
// autograd thread, is not part of the group); end() on any thread. A mutex guards the state.
// The coalesced Work completes on whichever thread completes its last part.
#pragma once

#include "backend/work.hpp"

#include <torch/csrc/distributed/c10d/Work.hpp>

#include <mutex>
#include <optional>
#include <thread>
#include <vector>

namespace ddplite {

class CoalescingCollector {
 public:
  // Opens a group on the calling thread. False when one was still open (a _coalescing_manager
  // body raised, so torch never ended it): that group is dropped; its ops complete on their own.
  bool start();
  // A Work issued while the group is open, by the thread that opened it (null Works, and Works
  // of other threads, are skipped).
  void add(c10::intrusive_ptr<c10d::Work> work);
  // Whether a group is open and was opened by the calling thread.
  bool openOnThisThread();
  // Closes the group: its Works in issue order; nullopt when no group was open.
  std::optional<std::vector<c10::intrusive_ptr<c10d::Work>>> end();

 private:
  std::mutex mutex_;  // guards the three below
  bool active_ = false;
  std::thread::id owner_;  // the thread that opened the group
  std::vector<c10::intrusive_ptr<c10d::Work>> parts_;
};

// One Work for `parts`.
// * Every part a DdpliteWork (CPU ops, whose completion is the op's end): a DdpliteWork that
//   completes when every part has (in any order), failing with the first failure that completes,
//   its WorkResult that part's; its future's value is every part's result() in order.
// * Otherwise (NCCL Works, whose future completes at launch and whose wait() orders the caller's
//   stream after the kernel): a Work whose wait(), synchronize(), isCompleted() and exception()
//   ask each part, so the caller's stream waits on every kernel and a failure the watchdog
//   reports later still surfaces; its future and WorkResult are the aggregate above.
// No parts: completed at once. `timed`: the aggregate serves getDuration, measured from this call
// (the end of the coalescing block) to the completion of its last part.
c10::intrusive_ptr<c10d::Work> coalescedWork(const OpContext& ctx, std::vector<c10::intrusive_ptr<c10d::Work>> parts,
                                             bool timed);

}  // namespace ddplite
