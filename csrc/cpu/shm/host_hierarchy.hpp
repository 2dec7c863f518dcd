// A group whose ranks span hosts, seen as hosts: the ranks of each host share a segment (a
// ShmGroup over just them), and one leader per host (its lowest rank) talks to the other hosts'
// leaders over the group's TCP mesh. allreduce_hierarchical.cpp runs all_reduce on it; every
// other collective of such a group runs over TCP among all ranks, as before.
//
// Threading: like ShmGroup (the thread that runs the group's collectives; abort() from any).
#pragma once

#include "cpu/shm/shm_group.hpp"
#include "cpu/transport/rank_view.hpp"

#include <memory>
#include <string>
#include <vector>

namespace ddplite::cpu {

class HostHierarchy {
 public:
  // Collective over the group, after ShmGroup::create() found that it spans hosts (every rank
  // has published its host identity in the group's store then). Null, with *whyNot, when it is
  // not worth it (every host holds one rank) or cannot be (a host's segment failed); every rank
  // gets the same outcome.
  static std::unique_ptr<HostHierarchy> create(StoreRendezvous& rendezvous, Transport& mesh, int rank, int size,
                                               size_t chunkBytes, std::string* whyNot);

  // The ranks of this host as a group (null when this rank is alone on its host); local rank 0
  // is the host's leader.
  ShmGroup* local() const { return local_.get(); }
  // The hosts' leaders as a group over TCP; null unless this rank leads its host.
  Transport* leaders() const { return leaders_.get(); }
  int hosts() const { return hosts_; }
  // "2 hosts: ranks 0,1 | 2,3"
  const std::string& layout() const { return layout_; }

  void abort();

 private:
  HostHierarchy() = default;

  std::unique_ptr<RankView> localView_;  // the liveness probe of local_
  std::unique_ptr<ShmGroup> local_;
  std::unique_ptr<RankView> leaders_;
  int hosts_ = 0;
  std::string layout_;
};

}  // namespace ddplite::cpu
