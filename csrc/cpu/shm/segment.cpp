#include "cpu/shm/segment.hpp"

#include "common/env.hpp"
#include "common/errors.hpp"
#include "common/process_identity.hpp"
#include "rendezvous/host_layout.hpp"
#include "cpu/transport/transport.hpp"
#include "common/logging.hpp"

#include <c10/util/StringUtil.h>
#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <optional>
#include <thread>
#include <vector>

namespace ddplite::cpu {

namespace {

// How long rank 0 waits for its peers to attach a segment it created (set-up step 4): the longest
// a kill -9 of rank 0 can leave the name behind in /dev/shm.
constexpr auto kAttachWithin = std::chrono::seconds(30);

// The value of `key` once it exists, or nothing at `giveUpAt` (polled: the store has no get with a
// deadline of its own). Store errors throw, as in StoreRendezvous::get.
std::optional<std::string> getBy(StoreRendezvous& rendezvous, const std::string& key, Deadline giveUpAt) {
  while (rendezvous.has(key) != std::optional<bool>(true)) {
    if (Clock::now() >= giveUpAt) return std::nullopt;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return rendezvous.get(key, key);
}

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

// This process's pid namespace as its inode number ("4026531836"); empty where /proc says nothing.
std::string pidNamespace() {
  char link[64] = {};
  const ssize_t n = readlink("/proc/self/ns/pid", link, sizeof(link) - 1);  // "pid:[4026531836]"
  const std::string text = n > 0 ? std::string(link, static_cast<size_t>(n)) : std::string();
  const size_t open = text.find('['), close = text.find(']');
  return open != std::string::npos && close > open + 1 ? text.substr(open + 1, close - open - 1) : std::string();
}

// A segment's name: /ddplite-<nonce>-<creator pid>-<creator's pid namespace>. The creator (rank
// 0) unlinks it at set-up step 4; a name still in /dev/shm whose creator has ended was left by a
// kill between steps 2 and 4 (see segment.hpp), and no rank can still be using it to any end: its
// group's set-up cannot finish without rank 0's verdict.
std::string segmentName(const std::string& pidNs) {
  return strCat("/ddplite-", randomNonce(), "-", getpid(), "-", pidNs.empty() ? "0" : pidNs);
}

// Unlinks the names in /dev/shm that segmentName() made in this pid namespace for a process that
// no longer exists (kill(pid, 0): ESRCH); returns them. Names from other pid namespaces (another
// container sharing /dev/shm) are left alone: their pids mean nothing here. A pid reused since
// leaves its name in place (harmless: one segment's pages until the next reboot).
std::vector<std::string> unlinkSegmentsOfEndedCreators(const std::string& pidNs) {
  std::vector<std::string> removed;
  if (pidNs.empty()) return removed;
  DIR* dir = opendir("/dev/shm");
  if (dir == nullptr) return removed;
  const std::string suffix = "-" + pidNs;
  while (const dirent* entry = readdir(dir)) {
    const std::string name = entry->d_name;
    if (name.rfind("ddplite-", 0) != 0 || name.size() <= suffix.size() ||
        name.compare(name.size() - suffix.size(), suffix.size(), suffix) != 0) {
      continue;
    }
    const std::string head = name.substr(0, name.size() - suffix.size());  // ddplite-<nonce>-<pid>
    const size_t dash = head.rfind('-');
    char* end = nullptr;
    const long pid = std::strtol(head.c_str() + dash + 1, &end, 10);
    if (dash <= std::strlen("ddplite") || pid <= 0 || *end != '\0') continue;
    if (kill(static_cast<pid_t>(pid), 0) == -1 && errno == ESRCH && shm_unlink(("/" + name).c_str()) == 0) {
      removed.push_back(name);
    }
  }
  closedir(dir);
  return removed;
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
  const std::string host = hostName();
  char netns[64] = {};
  const ssize_t n = readlink("/proc/self/ns/net", netns, sizeof(netns) - 1);
  struct stat devShm = {};
  const bool hasDevShm = stat("/dev/shm", &devShm) == 0;
  return strCat(host, " boot ", firstLineOf("/proc/sys/kernel/random/boot_id"), " netns ",
                n > 0 ? std::string(netns, static_cast<size_t>(n)) : std::string("?"), " shm ",
                hasDevShm ? std::to_string(devShm.st_dev) : std::string("none"));
}

ShmSegment::Outcome ShmSegment::create(StoreRendezvous& rendezvous, int rank, int size, size_t bytes) {
  // 1. one host? (rank 0 compiles the layout: O(1) store requests and bytes for the others)
  const std::string mine = hostIdentity();
  const HostLayout layout = exchangeHostLayout(rendezvous, rank, size, mine);
  if (layout.hosts > 1) {
    int other = 0;
    while (layout.hostOfRank[static_cast<size_t>(other)] == layout.hostOfRank[static_cast<size_t>(rank)]) ++other;
    return {nullptr,
            strCat("the group spans hosts (rank ", other, " is on '", publishedHostIdentity(rendezvous, other),
                   "', rank ", rank, " on '", mine, "')"),
            /*spansHosts=*/true};
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
    const std::string pidNs = pidNamespace();
    const std::vector<std::string> stale = unlinkSegmentsOfEndedCreators(pidNs);
    if (!stale.empty()) {
      DDPLITE_LOG(kInfo, "rank 0/", size, " removed ", stale.size(), " segment(s) from /dev/shm whose creator had "
                  "been killed during its group's set-up: ", c10::Join(", ", stale));
    }
    name = segmentName(pidNs);
    base = createAndMap(name, bytes, &why);
    rendezvous.set("shm/name", base != nullptr ? "ok " + name : "failed " + why);
    if (base == nullptr) return {nullptr, why};
  } else {
    const std::string published = rendezvous.get("shm/name", "rank 0's shared-memory segment");
    if (published.rfind("ok ", 0) != 0) {
      return {nullptr, strCat("on rank 0: ", published.rfind("failed ", 0) == 0 ? published.substr(7) : published)};
    }
    name = published.substr(3);
    if (env::testHooks().shmStallAttach == rank) {  // DDPLITE_TEST_HOOKS: a rank stuck here
      while (true) std::this_thread::sleep_for(std::chrono::seconds(1));
    }
    base = attachAndMap(name, bytes, &why);
  }
  // 3. everyone reports; 4. rank 0 waits for the reports, at most kAttachWithin (the window in
  // which a kill -9 of rank 0 leaves the name behind), and publishes the verdict; it unlinks the
  // name either way. Every rank takes rank 0's verdict, so all agree even when a late report
  // comes after rank 0 gave up. If any failed, everyone unlinks and unmaps.
  rendezvous.set(strCat("shm/attach/", rank), base != nullptr ? "ok" : why);
  std::string verdict;
  if (rank == 0) {
    const uint32_t hookSeconds = env::testHooks().shmAttachWithinS;  // DDPLITE_TEST_HOOKS: a shorter window
    const auto within = hookSeconds > 0 ? std::chrono::seconds(hookSeconds) : kAttachWithin;
    const Deadline giveUpAt = Clock::now() + within;
    for (int peer = 1; peer < size && verdict.empty(); ++peer) {
      const std::optional<std::string> report = getBy(rendezvous, strCat("shm/attach/", peer), giveUpAt);
      if (!report) {
        verdict = strCat("rank ", peer, ": did not attach the segment within ",
                         std::chrono::duration_cast<std::chrono::seconds>(within).count(), " s");
      } else if (*report != "ok") {
        verdict = strCat("rank ", peer, ": ", *report);
      }
    }
    if (base == nullptr) verdict = strCat("rank 0: ", why);
    rendezvous.set("shm/verdict", verdict.empty() ? "ok" : verdict);
    if (verdict.empty()) verdict = "ok";
  } else {
    verdict = rendezvous.get("shm/verdict", "rank 0's verdict on the shared-memory segment");
  }
  if (verdict != "ok") return {nullptr, verdict};
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
