// Coalescing: the ops a group issues between startCoalescing() and endCoalescing() (torch's
// _coalescing_manager, batch_isend_irecv) and the one Work that stands for all of them.
//
// On the CPU paths the ops are issued as they come: the worker runs collectives in issue order,
// and send/recv are eager on the P2P engine (a send completes once its bytes are on the wire), so
// no order of them can deadlock, and a blocking call inside the group (dist.send, a collective
// with async_op=False) returns as it would outside it. The collector gathers their Works;
// endCoalescing() returns coalescedWork() over them. torch collects all_reduce,
// all_gather_into_tensor and reduce_scatter_tensor itself and issues them as one *_coalesced
// call inside the window, which the collector gathers like any other op.
//
// Threads: start/add/end on the caller's thread (torch issues a coalesced group from one thread);
// the coalesced Work completes on whichever thread completes its last part.
#pragma once

#include "backend/work.hpp"

#include <torch/csrc/distributed/c10d/Work.hpp>

#include <optional>
#include <vector>

namespace ddplite {

class CoalescingCollector {
 public:
  // Opens a group. False when one was still open (a _coalescing_manager body raised, so torch
  // never ended it): that group is dropped; its ops complete on their own Works.
  bool start();
  bool active() const { return active_; }
  // A Work issued while the group is open (null Works are skipped).
  void add(c10::intrusive_ptr<c10d::Work> work);
  // Closes the group: its Works in issue order; nullopt when no group was open.
  std::optional<std::vector<c10::intrusive_ptr<c10d::Work>>> end();

 private:
  bool active_ = false;
  std::vector<c10::intrusive_ptr<c10d::Work>> parts_;
};

// One Work for `parts`: it completes when every part has (in any order); it fails with the first
// failure that completes, its WorkResult that part's; its future's value is every part's result()
// in order. No parts: completed at once.
c10::intrusive_ptr<DdpliteWork> coalescedWork(const OpContext& ctx, std::vector<c10::intrusive_ptr<c10d::Work>> parts);

}  // namespace ddplite
