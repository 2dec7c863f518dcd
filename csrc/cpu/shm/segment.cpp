#include "cpu/shm/segment.hpp"

#include "common/errors.hpp"
#include "common/logging.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>

namespace ddplite::cpu {

namespace {

std::string firstLineOf(const char* path) {
  std::ifstream file(path);
  std::string line;
  std::getline(file, line);
  return line;
}

std::string randomNonce() {
  uint64_t value = 0;
  if (getrandom(&value, sizeof(value), 0) != static_cast<ssize_t>(sizeof(value))) {
    value = static_cast<uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count()) ^
            (static_cast<uint64_t>(getpid()) << 32);
  }
  char text[17];
  std::snprintf(text, sizeof(text), "%016llx", static_cast<unsigned long long>(value));
  return text;
}

// Maps `fd` (already `bytes` long) read-write and shared; nullptr with errno on failure.
char* mapShared(int fd, size_t bytes) {
  void* base = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  return base == MAP_FAILED ? nullptr : static_cast<char*>(base);
}

// Rank 0: creates, sizes and maps the segment; returns its mapping, or nullptr and *why.
char* createAndMap(const std::string& name, size_t bytes, std::string* why) {
  const int fd = shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR | O_CLOEXEC, 0600);
  if (fd < 0) {
    *why = strCat("shm_open(", name, ") failed: ", std::strerror(errno));
    return nullptr;
  }
  // posix_fallocate returns the error (it does not set errno); reserving now turns a full
  // /dev/shm into this error instead of a SIGBUS on first touch.
  const int error = posix_fallocate(fd, 0, static_cast<off_t>(bytes));
  char* base = error == 0 ? mapShared(fd, bytes) : nullptr;
  if (base == nullptr) {
    *why = error != 0 ? strCat("reserving ", bytes, " bytes in /dev/shm failed: ", std::strerror(error),
                               " (is /dev/shm large enough? docker: --shm-size)")
                      : strCat("mmap of ", bytes, " bytes failed: ", std::strerror(errno));
    shm_unlink(name.c_str());
  }
  close(fd);
  return base;
}

char* attachAndMap(const std::string& name, size_t bytes, std::string* why) {
  const int fd = shm_open(name.c_str(), O_RDWR | O_CLOEXEC, 0);
  if (fd < 0) {
    *why = strCat("shm_open(", name, ") failed: ", std::strerror(errno));
    return nullptr;
  }
  struct stat status = {};
  char* base = nullptr;
  if (fstat(fd, &status) != 0 || static_cast<size_t>(status.st_size) != bytes) {
    *why = strCat(name, " is not ", bytes, " bytes long");
  } else if ((base = mapShared(fd, bytes)) == nullptr) {
    *why = strCat("mmap of ", bytes, " bytes failed: ", std::strerror(errno));
  }
  close(fd);
  return base;
}

}  // namespace

std::string ShmSegment::hostIdentity() {
  char host[256] = {};
  gethostname(host, sizeof(host) - 1);
  char netns[64] = {};
  const ssize_t n = readlink("/proc/self/ns/net", netns, sizeof(netns) - 1);
  struct stat devShm = {};
  const bool hasDevShm = stat("/dev/shm", &devShm) == 0;
  return strCat(host, " boot ", firstLineOf("/proc/sys/kernel/random/boot_id"), " netns ",
                n > 0 ? std::string(netns, static_cast<size_t>(n)) : std::string("?"), " shm ",
                hasDevShm ? std::to_string(devShm.st_dev) : std::string("none"));
}

ShmSegment::Outcome ShmSegment::create(StoreRendezvous& rendezvous, int rank, int size, size_t bytes) {
  // 1. one host?
  const std::string mine = hostIdentity();
  rendezvous.set(strCat("shm/host/", rank), mine);
  for (int peer = 0; peer < size; ++peer) {
    if (peer == rank) continue;
    const std::string theirs = rendezvous.get(strCat("shm/host/", peer), strCat("rank ", peer, "'s host identity"));
    if (theirs != mine) {
      return {nullptr,
              strCat("the group spans hosts (rank ", peer, " is on '", theirs, "', rank ", rank, " on '", mine, "')"),
              /*spansHosts=*/true};
    }
  }
  // 2. rank 0 creates. From here on every exit path, exceptions included (a store wait that
  // throws because a peer died), unlinks the name unless all ranks attached (then rank 0 does)
  // and unmaps unless the segment is handed out: shm_unlink of a name already gone is harmless.
  std::string why;
  std::string name;
  struct Cleanup {
    std::string* name;
    char** base;
    size_t bytes;
    bool unlink = true;
    ~Cleanup() {
      if (unlink && !name->empty()) shm_unlink(name->c_str());
      if (*base != nullptr) munmap(*base, bytes);
    }
  };
  char* base = nullptr;
  Cleanup cleanup{&name, &base, bytes};
  if (rank == 0) {
    name = "/ddplite-" + randomNonce();
    base = createAndMap(name, bytes, &why);
    rendezvous.set("shm/name", base != nullptr ? "ok " + name : "failed " + why);
    if (base == nullptr) return {nullptr, why};
  } else {
    const std::string published = rendezvous.get("shm/name", "rank 0's shared-memory segment");
    if (published.rfind("ok ", 0) != 0) {
      return {nullptr, strCat("on rank 0: ", published.rfind("failed ", 0) == 0 ? published.substr(7) : published)};
    }
    name = published.substr(3);
    base = attachAndMap(name, bytes, &why);
  }
  // 3. everyone reports; 4. once every rank has attached, rank 0 unlinks (the others leave the
  // name alone); if any failed, everyone unlinks and unmaps.
  rendezvous.set(strCat("shm/attach/", rank), base != nullptr ? "ok" : why);
  std::string firstFailure;
  for (int peer = 0; peer < size; ++peer) {
    const std::string report =
        peer == rank ? (base != nullptr ? "ok" : why)
                     : rendezvous.get(strCat("shm/attach/", peer), strCat("rank ", peer, " attaching shared memory"));
    if (report != "ok" && firstFailure.empty()) firstFailure = strCat("rank ", peer, ": ", report);
  }
  if (!firstFailure.empty()) return {nullptr, firstFailure};
  cleanup.unlink = rank == 0;
  char* mapped = base;
  base = nullptr;  // handed to the segment: not unmapped here
  DDPLITE_LOG(kInfo, "rank ", rank, "/", size, " shares ", bytes, " bytes of memory with its group (", name, ")");
  return {std::unique_ptr<ShmSegment>(new ShmSegment(mapped, bytes, name)), ""};
}

ShmSegment::~ShmSegment() {
  munmap(base_, bytes_);
}

}  // namespace ddplite::cpu
