// Running out of file descriptors, said plainly: the process's limit (RLIMIT_NOFILE), how many are
// open, and how many a group needs. A group holds, per rank, about one socket per peer for its
// collectives and one socket or pidfd per peer for send/recv (docs/history/scale.md), plus a few of its own.
#pragma once

#include <string>

namespace ddplite {

// Whether `error` (an errno) means this process (EMFILE) or the system (ENFILE) is out of descriptors.
bool outOfDescriptors(int error);

// "this process may open 64 file descriptors (RLIMIT_NOFILE) and has 61 open; a ddplite group of
// 16 ranks needs about 38 of them per rank" and the hint to raise the limit. `groupSize` <= 0:
// the group's need is not said.
std::string descriptorShortage(int error, int groupSize);
std::string descriptorHint();

// Descriptors a group of `groupSize` ranks holds per rank, at most: a socket per peer in each of
// its two TCP meshes (collectives; send/recv across hosts), and a few (listener, eventfds).
int descriptorsPerRank(int groupSize);

}  // namespace ddplite
