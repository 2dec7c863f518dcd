#include "common/fd_limits.hpp"

#include "common/errors.hpp"

#include <dirent.h>
#include <sys/resource.h>

#include <cerrno>
#include <cstring>

namespace ddplite {

namespace {

// Entries of /proc/self/fd, less the one opendir itself holds; -1 when it cannot be read (which,
// out of descriptors, is likely: then the count is left out).
int openDescriptors() {
  DIR* folder = opendir("/proc/self/fd");
  if (folder == nullptr) return -1;
  int count = 0;
  while (const dirent* entry = readdir(folder)) {
    if (entry->d_name[0] != '.') ++count;
  }
  closedir(folder);
  return count - 1;
}

}  // namespace

bool outOfDescriptors(int error) {
  return error == EMFILE || error == ENFILE;
}

int descriptorsPerRank(int groupSize) {
  return 2 * (groupSize - 1) + 8;
}

std::string descriptorShortage(int error, int groupSize) {
  std::string text = error == ENFILE ? "the system is out of file descriptors (ENFILE)"
                                     : "this process is out of file descriptors (EMFILE)";
  rlimit limit = {};
  if (error == EMFILE && getrlimit(RLIMIT_NOFILE, &limit) == 0) {
    text += strCat(": it may open ", limit.rlim_cur, " (RLIMIT_NOFILE)");
    const int open = openDescriptors();
    if (open >= 0) text += strCat(" and has ", open, " open");
  }
  if (groupSize > 0) {
    text += strCat("; a ddplite group of ", groupSize, " ranks holds up to about ", descriptorsPerRank(groupSize),
                   " per rank, for every group this process is in");
  }
  return text;
}

std::string descriptorHint() {
  return "raise the limit before the job starts (ulimit -n 65536 in the shell that launches it, LimitNOFILE= for a "
         "service), or from Python before init_process_group: resource.setrlimit(resource.RLIMIT_NOFILE, "
         "(hard, hard)) with hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]";
}

}  // namespace ddplite
