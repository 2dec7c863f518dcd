// Which host each rank of a group is on, learned with O(1) store requests per rank.
//
// Every rank publishes its host identity ("shm/host/<rank>"). Rank 0 alone reads them all (one
// multiGet where the store has it) and publishes the layout ("shm/layout"): runs of consecutive
// ranks on one host, "<host>x<ranks>" joined by ','. Hosts are numbered in the order of their
// lowest rank. The other ranks read that one key. So a rank other than 0 sends and receives
// O(runs) bytes: O(hosts) for the usual layout of consecutive ranks per host, at any group size,
// where reading every rank's identity cost each of P ranks P identities (24.6 GB for
// the whole job at 8,192 ranks). Rank 0 reads O(P), as NCCL's bootstrap root does.
#pragma once

#include <string>
#include <vector>

#include "rendezvous/store.hpp"

namespace ddplite {

struct HostLayout {
  std::vector<int> hostOfRank;  // per rank: its host's number
  int hosts = 0;

  // The group's ranks by host, hosts in order of number, ranks ascending.
  std::vector<std::vector<int>> ranksByHost() const;
  // The runs' text ("0x4,1x4"), and back; decode throws DistBackendError on text that does not
  // describe `size` ranks.
  std::string encode() const;
  static HostLayout decode(const std::string& text, int size);
  // From every rank's identity, in rank order.
  static HostLayout ofIdentities(const std::vector<std::string>& identities);
};

// Publishes this rank's `identity` and returns the group's layout (see the header). Blocks until
// rank 0 has published it (the store's timeout, then DistBackendError naming missing ranks).
HostLayout exchangeHostLayout(StoreRendezvous& rendezvous, int rank, int size, const std::string& identity);
// The layout an earlier exchangeHostLayout on the same keys published (one store request).
HostLayout publishedHostLayout(StoreRendezvous& rendezvous, int size);
// The identity `rank` published (one store request): for messages.
std::string publishedHostIdentity(StoreRendezvous& rendezvous, int rank);

}  // namespace ddplite
