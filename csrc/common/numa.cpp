#include "common/numa.hpp"

#include <dirent.h>
#include <sched.h>

#include <cstdlib>
#include <cstring>
#include <string>

namespace ddplite {

namespace {

// The node directory entry ("node<M>") under cpu<N>'s sysfs folder; -1 when there is none.
int nodeOfCpu(int cpu) {
  const std::string folder = "/sys/devices/system/cpu/cpu" + std::to_string(cpu);
  DIR* directory = opendir(folder.c_str());
  if (directory == nullptr) return -1;
  int node = -1;
  while (const dirent* entry = readdir(directory)) {
    if (std::strncmp(entry->d_name, "node", 4) != 0) continue;
    char* end = nullptr;
    const long value = std::strtol(entry->d_name + 4, &end, 10);
    if (end != entry->d_name + 4 && *end == '\0' && value >= 0) {
      node = static_cast<int>(value);
      break;
    }
  }
  closedir(directory);
  return node;
}

}  // namespace

int numaNodeOfThisProcess() {
  cpu_set_t allowed;
  CPU_ZERO(&allowed);
  if (sched_getaffinity(0, sizeof(allowed), &allowed) != 0) return -1;
  int common = -1;
  for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu) {
    if (!CPU_ISSET(cpu, &allowed)) continue;
    const int node = nodeOfCpu(cpu);
    if (node < 0 || (common >= 0 && node != common)) return -1;
    common = node;
  }
  return common;
}

}  // namespace ddplite
