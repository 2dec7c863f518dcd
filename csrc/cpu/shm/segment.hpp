// One POSIX shared-memory segment per process group, shared by its ranks on one host.
//
// Life cycle (all through the group's c10d store, so every rank takes the same branch):
//   1. every rank publishes its host identity (host name, boot id, network namespace), and the
//      segment is used only when all ranks of the group share one (else: notOnOneHost);
//   2. rank 0 creates /dev/shm/ddplite-<random nonce>-<its pid>-<its pid namespace> (O_EXCL,
//      mode 0600), reserves its pages
//      with posix_fallocate (so a full /dev/shm fails here, not later with SIGBUS) and
//      publishes the name, or the reason it could not;
//   3. every other rank attaches and publishes "ok" or its reason;
//   4. rank 0 waits for every report, at most 30 s of its own (not the store's timeout), unlinks
//      the name and publishes the verdict, which every rank takes: from then on the memory lives
//      only as long as a rank maps it, so nothing is left in /dev/shm after an exit, an
//      exception or a kill -9. Every rank unlinks on any set-up failure or exception it survives
//      (a peer that died makes the store waits throw). What remains: rank 0 killed (SIGKILL, or
//      SIGTERM without Python's handlers) between 2 and 4, normally milliseconds, at most 30 s
//      when a peer is stuck before attaching (a launcher ending every rank at once while they
//      set a group up). The next group set up on the host removes such a name: before step 2,
//      rank 0 unlinks every ddplite name of its pid namespace whose creator pid has ended.
// The nonce makes names unique per run and group: two jobs or two groups never share a segment.
#pragma once

#include "rendezvous/store.hpp"

#include <chrono>
#include <cstddef>
#include <memory>
#include <string>

namespace ddplite::cpu {

class ShmSegment {
 public:
  // Outcome of create(): the segment, or why there is none (every rank gets the same outcome).
  struct Outcome {
    std::unique_ptr<ShmSegment> segment;
    std::string whyNot;  // empty when segment is set
    bool spansHosts = false;  // why not: the ranks are not on one host (expected; not a fault)
  };

  // Collective over the group. `bytes`: the size every rank asks for (the same on every rank).
  static Outcome create(StoreRendezvous& rendezvous, int rank, int size, size_t bytes);

  ~ShmSegment();
  ShmSegment(const ShmSegment&) = delete;
  ShmSegment& operator=(const ShmSegment&) = delete;

  char* base() const { return base_; }
  size_t bytes() const { return bytes_; }
  const std::string& name() const { return name_; }

  // This process's host identity: "<hostname> boot <boot id> netns <inode> shm <device of
  // /dev/shm>". Ranks with equal identities can share memory (network namespaces stand for hosts
  // in the multi-host tests; containers with their own /dev/shm differ in its device).
  static std::string hostIdentity();

 private:
  ShmSegment(char* base, size_t bytes, std::string name) : base_(base), bytes_(bytes), name_(std::move(name)) {}

  char* base_;
  size_t bytes_;
  std::string name_;
};

}  // namespace ddplite::cpu
