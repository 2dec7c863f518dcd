// The group-wide settings agreement at init_process_group: every rank of a group must run with
// the same group-wide DDPLITE_* knobs (env::groupWideSettings), else a rank would wait on a path
// its peers never take.
#pragma once

#include "rendezvous/store.hpp"

namespace ddplite {

// Every rank compares the group-wide knobs it runs with against rank 0's: a rank that differs
// records itself (the first stays) and every rank learns the verdict in one barrier round, so a
// rank makes O(1) store requests of O(1) bytes at any group size. Then the same ValueError on
// every rank: the recorded rank names rank 0's values, every other rank the recorded rank's (or
// rank 0's, where it runs with the recorded rank's settings). Caller's thread, once per group,
// during construction (before any op); waits have the store's deadline.
void agreeOnGroupWideKnobs(StoreRendezvous& rendezvous, int rank, int size);

}  // namespace ddplite
