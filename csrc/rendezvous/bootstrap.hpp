// How the ranks of one group share a small blob during set-up (the NCCL unique id, an address).
//
// One interface, two implementations: StoreBootstrap (the c10d store the group was given: rank
// `root` sets a key, the others wait for it) and MpiBootstrap (MPI_Bcast on the group's MPI
// communicator, rendezvous/mpi.hpp). Callers never know which one they hold.
#pragma once

#include "rendezvous/store.hpp"

#include <string>

namespace ddplite {

class Bootstrap {
 public:
  virtual ~Bootstrap() = default;
  // Collective over the group: every rank calls it with the same `key` (unique per blob within
  // the group) and `root`; root passes the blob, the others pass anything; all return root's blob.
  // Throws DistBackendError when a rank does not arrive within the group's timeout.
  // Nothing of it is left behind once every rank has returned. (A later run that reuses the
  // store cannot read it either way: the backend works under a per-run prefix, backend.hpp.)
  virtual std::string broadcast(const std::string& key, const std::string& blob, int root) = 0;
  virtual const char* name() const = 0;
};

// Over the group's store: root sets "ddplite/bootstrap/<key>", the others get it and count
// themselves in "<key>/read"; the last reader deletes both.
class StoreBootstrap final : public Bootstrap {
 public:
  StoreBootstrap(StoreRendezvous& rendezvous, int rank, int size) : rendezvous_(rendezvous), rank_(rank), size_(size) {}
  std::string broadcast(const std::string& key, const std::string& blob, int root) override;
  const char* name() const override { return "store"; }
  // Whether "ddplite/bootstrap/<key>" is in the store now (tests: cleanup).
  bool holds(const std::string& key) { return rendezvous_.has("bootstrap/" + key).value_or(false); }

 private:
  StoreRendezvous& rendezvous_;  // owned by the backend, outlives this object
  int rank_;
  int size_;
};

}  // namespace ddplite
