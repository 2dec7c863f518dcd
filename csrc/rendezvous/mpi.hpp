// MPI as a rendezvous (mpi://) and as the home of a group's MPI communicator.
//
// Compiled in when setup.py finds Open MPI (mpicxx); otherwise every entry point except
// compiledIn()/libraryVersion() throws RuntimeError saying how to rebuild with MPI. <mpi.h> is
// only included by .cpp files, so the rest of the extension builds without MPI headers.
//
// Threads: MPI is initialised with MPI_THREAD_MULTIPLE (each process group's worker thread
// calls MPI on its own communicator). Every function here may be called from any thread.
#pragma once

#include "rendezvous/bootstrap.hpp"

#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace ddplite::mpi {

bool compiledIn();
// MPI_Get_library_version's first line ("Open MPI v4.1.4, ..."), or "" when not compiled in.
std::string libraryVersion();
// The MPI standard version the headers declare, e.g. "3.1", or "".
std::string standardVersion();

// How to get an extension with MPI, for error messages.
extern const char* const kRebuildHint;

// Initialises MPI once per process (MPI_Init_thread, MPI_THREAD_MULTIPLE) unless someone (mpi4py)
// already did, and returns (world rank, world size). A process not started by mpirun becomes a
// singleton of size 1.
std::pair<int, int> initWorld();
bool isInitialized();
// MPI_Finalize when this library initialised MPI and nobody finalised it yet; idempotent. Called
// at interpreter exit (torch_ddp_lite registers it with atexit).
void finalizeAtExit();

// MPI_Bcast of a byte string over MPI_COMM_WORLD (used by mpi:// to share the store address).
std::string broadcastWorld(const std::string& blob, int root);

// The MPI communicator of one ddplite group. Created from the members' MPI_COMM_WORLD ranks in
// group-rank order (MPI_Comm_create_group: collective over the members only, which is what torch's
// new_group gives: non-members never construct the backend). Freed on destruction unless MPI has
// been finalised already.
class GroupComm {
 public:
  GroupComm(const std::vector<int>& worldRanks, int groupRank);
  ~GroupComm();
  GroupComm(const GroupComm&) = delete;
  GroupComm& operator=(const GroupComm&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }
  // The MPI_Comm, type-erased (mpi_collectives.cpp and MpiBootstrap cast it back).
  void* handle() const { return handle_; }
  // A communicator over the same ranks whose traffic never matches this one's (MPI_Comm_dup);
  // collective over the group. The CPU data path runs on a duplicate, so set-up broadcasts on the
  // group's own communicator (the NCCL unique id, from the caller's thread) can never pair with
  // a data collective running on the worker thread.
  std::unique_ptr<GroupComm> duplicate() const;

 private:
  GroupComm(int rank, int size, void* handle) : rank_(rank), size_(size), handle_(handle) {}

  int rank_;
  int size_;
  void* handle_ = nullptr;
};

// Bootstrap over a group's communicator (MPI_Bcast of the length, then of the bytes).
class MpiBootstrap final : public Bootstrap {
 public:
  explicit MpiBootstrap(GroupComm& comm) : comm_(comm) {}
  std::string broadcast(const std::string& key, const std::string& blob, int root) override;
  const char* name() const override { return "mpi"; }

 private:
  GroupComm& comm_;  // owned by the backend, outlives this object
};

}  // namespace ddplite::mpi
