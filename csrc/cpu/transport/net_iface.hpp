// Choosing the local IPv4 address that a rank listens on.
#pragma once

#include <string>

namespace ddplite::net {

// Matches interface names against an NCCL-style spec: comma-separated prefixes, "=" for exact
// names, "^" to exclude. Exposed for tests.
bool ifnameMatches(const std::string& spec, const std::string& ifname);

// Picks the address: the interface chosen by DDPLITE_SOCKET_IFNAME (or NCCL_/GLOO_SOCKET_IFNAME);
// else the one whose route reaches MASTER_ADDR; else the hostname's address when it is local;
// else 127.0.0.1. `why` receives a short explanation for the INFO log.
std::string chooseListenAddress(std::string* why);

}  // namespace ddplite::net
