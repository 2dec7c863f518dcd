#include "rendezvous/mpi.hpp"

#include "common/errors.hpp"
#include "common/fork_guard.hpp"

#ifdef DDPLITE_WITH_MPI
#include <mpi.h>
#endif

#include <atomic>
#include <mutex>

namespace ddplite::mpi {

const char* const kRebuildHint =
    "install Open MPI's development files and rebuild: apt-get install libopenmpi-dev openmpi-bin, "
    "then pip install --no-build-isolation --no-deps -e . (scripts/setup.sh does both); "
    "torch_ddp_lite.build_info()['mpi'] then says True";

#ifdef DDPLITE_WITH_MPI

namespace {

std::once_flag initOnce;
std::atomic<bool> weInitialised{false};
pid_t initialisedIn = 0;  // the process that called MPI_Init_thread; written before weInitialised is set

MPI_Comm commOf(const GroupComm& comm) {
  return reinterpret_cast<MPI_Comm>(comm.handle());
}

void check(int code, const char* call) {
  if (code == MPI_SUCCESS) return;
  char text[MPI_MAX_ERROR_STRING];
  int length = 0;
  MPI_Error_string(code, text, &length);
  throwDistError(strCat(call, " failed: ", std::string(text, length)),
                 "check that every rank of the job was started by the same mpirun");
}

// MPI_Bcast of a length-prefixed byte string on `comm`.
std::string broadcastOn(MPI_Comm comm, const std::string& blob, int root) {
  int rank = 0;
  MPI_Comm_rank(comm, &rank);
  long long length = rank == root ? static_cast<long long>(blob.size()) : 0;
  check(MPI_Bcast(&length, 1, MPI_LONG_LONG, root, comm), "MPI_Bcast (length)");
  std::string received = rank == root ? blob : std::string(static_cast<size_t>(length), '\0');
  if (length > 0) {
    check(MPI_Bcast(received.data(), static_cast<int>(length), MPI_BYTE, root, comm), "MPI_Bcast");
  }
  return received;
}

}  // namespace

bool compiledIn() {
  return true;
}

std::string libraryVersion() {
  char text[MPI_MAX_LIBRARY_VERSION_STRING];
  int length = 0;
  MPI_Get_library_version(text, &length);
  std::string version(text, length);
  return version.substr(0, version.find_first_of(",\n"));
}

std::string standardVersion() {
  return strCat(MPI_VERSION, ".", MPI_SUBVERSION);
}

std::pair<int, int> initWorld() {
  std::call_once(initOnce, [] {
    int initialised = 0;
    MPI_Initialized(&initialised);
    if (initialised) return;  // mpi4py or the user did it; they finalise it too
    int provided = 0;
    check(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_MULTIPLE, &provided), "MPI_Init_thread");
    initialisedIn = fork_guard::currentPid();
    weInitialised = true;
    if (provided < MPI_THREAD_MULTIPLE) {
      throwDistError(strCat("MPI provides thread level ", provided, ", ddplite needs MPI_THREAD_MULTIPLE (",
                            MPI_THREAD_MULTIPLE, ")"),
                     "use an MPI built with thread support (Debian's Open MPI has it)");
    }
  });
  int provided = 0;
  MPI_Query_thread(&provided);
  if (provided < MPI_THREAD_MULTIPLE) {
    throwDistError("MPI was initialised before ddplite without MPI_THREAD_MULTIPLE",
                   "initialise it with MPI_THREAD_MULTIPLE (mpi4py: mpi4py.rc.thread_level = 'multiple' "
                   "before importing mpi4py.MPI), or let ddplite initialise MPI");
  }
  int rank = 0;
  int size = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  return {rank, size};
}

bool isInitialized() {
  int initialised = 0;
  int finalised = 0;
  MPI_Initialized(&initialised);
  MPI_Finalized(&finalised);
  return initialised && !finalised;
}

void finalizeAtExit() {
  if (!weInitialised.exchange(false)) return;
  if (!fork_guard::createdHere(initialisedIn)) return;  // a forked child: MPI is its parent's
  int finalised = 0;
  MPI_Finalized(&finalised);
  if (!finalised) MPI_Finalize();
}

std::string broadcastWorld(const std::string& blob, int root) {
  return broadcastOn(MPI_COMM_WORLD, blob, root);
}

GroupComm::GroupComm(const std::vector<int>& worldRanks, int groupRank)
    : rank_(groupRank), size_(static_cast<int>(worldRanks.size())) {
  MPI_Group world;
  MPI_Group members;
  check(MPI_Comm_group(MPI_COMM_WORLD, &world), "MPI_Comm_group");
  check(MPI_Group_incl(world, size_, worldRanks.data(), &members), "MPI_Group_incl");
  MPI_Comm comm = MPI_COMM_NULL;
  // torch creates groups one at a time on every member, so one tag cannot be ambiguous.
  check(MPI_Comm_create_group(MPI_COMM_WORLD, members, /*tag=*/0, &comm), "MPI_Comm_create_group");
  MPI_Group_free(&members);
  MPI_Group_free(&world);
  int rank = -1;
  MPI_Comm_rank(comm, &rank);
  DDPLITE_ENFORCE(rank == groupRank, "MPI group rank ", rank, " differs from the process group rank ", groupRank);
  handle_ = reinterpret_cast<void*>(comm);
}

std::unique_ptr<GroupComm> GroupComm::duplicate() const {
  MPI_Comm copy = MPI_COMM_NULL;
  check(MPI_Comm_dup(commOf(*this), &copy), "MPI_Comm_dup");
  return std::unique_ptr<GroupComm>(new GroupComm(rank_, size_, reinterpret_cast<void*>(copy)));
}

GroupComm::~GroupComm() {
  MPI_Comm comm = commOf(*this);
  if (comm != MPI_COMM_NULL && isInitialized()) MPI_Comm_free(&comm);
}

std::string MpiBootstrap::broadcast(const std::string& key, const std::string& blob, int root) {
  return broadcastOn(commOf(comm_), blob, root);
}

#else  // !DDPLITE_WITH_MPI

namespace {
[[noreturn]] void notCompiled(const char* what) {
  throwRuntimeError(strCat(what, " needs MPI, and this ddplite was built without it"), kRebuildHint);
}
}  // namespace

bool compiledIn() { return false; }
std::string libraryVersion() { return ""; }
std::string standardVersion() { return ""; }
std::pair<int, int> initWorld() { notCompiled("MPI initialisation"); }
bool isInitialized() { return false; }
void finalizeAtExit() {}
std::string broadcastWorld(const std::string&, int) { notCompiled("MPI_Bcast"); }
GroupComm::GroupComm(const std::vector<int>&, int) : rank_(0), size_(0) { notCompiled("an MPI communicator"); }
GroupComm::~GroupComm() = default;
std::unique_ptr<GroupComm> GroupComm::duplicate() const { notCompiled("an MPI communicator"); }
std::string MpiBootstrap::broadcast(const std::string&, const std::string&, int) { notCompiled("MPI bootstrap"); }

#endif

}  // namespace ddplite::mpi
