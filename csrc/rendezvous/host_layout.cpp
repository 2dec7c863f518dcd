#include "rendezvous/host_layout.hpp"

#include <map>

#include "common/errors.hpp"

namespace ddplite {

namespace {
constexpr const char* kIdentityKey = "shm/host/";
constexpr const char* kLayoutKey = "shm/layout";
}  // namespace

std::vector<std::vector<int>> HostLayout::ranksByHost() const {
  std::vector<std::vector<int>> byHost(static_cast<size_t>(hosts));
  for (size_t rank = 0; rank < hostOfRank.size(); ++rank) {
    byHost[static_cast<size_t>(hostOfRank[rank])].push_back(static_cast<int>(rank));
  }
  return byHost;
}

std::string HostLayout::encode() const {
  std::string text;
  for (size_t begin = 0; begin < hostOfRank.size();) {
    size_t end = begin;
    while (end < hostOfRank.size() && hostOfRank[end] == hostOfRank[begin]) ++end;
    text += strCat(text.empty() ? "" : ",", hostOfRank[begin], "x", end - begin);
    begin = end;
  }
  return text;
}

HostLayout HostLayout::decode(const std::string& text, int size) {
  HostLayout layout;
  auto malformed = [&] {
    throwDistError(strCat("rank 0 published a host layout that does not describe ", size, " ranks: '",
                          text.substr(0, 200), "'"),
                   "every rank of the group must run the same ddplite version");
  };
  size_t at = 0;
  while (at < text.size()) {
    size_t used = 0;
    int host = 0;
    long long count = 0;
    try {
      host = std::stoi(text.substr(at), &used);
      at += used;
      if (at >= text.size() || text[at] != 'x') malformed();
      count = std::stoll(text.substr(++at), &used);
      at += used;
    } catch (const std::logic_error&) {
      malformed();
    }
    if (host < 0 || host > layout.hosts || count <= 0 ||
        static_cast<long long>(layout.hostOfRank.size()) + count > size) {
      malformed();
    }
    layout.hosts = std::max(layout.hosts, host + 1);
    layout.hostOfRank.insert(layout.hostOfRank.end(), static_cast<size_t>(count), host);
    if (at < text.size() && text[at++] != ',') malformed();
  }
  if (static_cast<int>(layout.hostOfRank.size()) != size) malformed();
  return layout;
}

HostLayout HostLayout::ofIdentities(const std::vector<std::string>& identities) {
  HostLayout layout;
  std::map<std::string, int> numberOf;
  for (const std::string& identity : identities) {
    const auto [at, added] = numberOf.emplace(identity, layout.hosts);
    if (added) ++layout.hosts;
    layout.hostOfRank.push_back(at->second);
  }
  return layout;
}

HostLayout exchangeHostLayout(StoreRendezvous& rendezvous, int rank, int size, const std::string& identity) {
  rendezvous.set(strCat(kIdentityKey, rank), identity);
  if (rank != 0) {
    return HostLayout::decode(
        rendezvous.getAfterRound(kLayoutKey, kIdentityKey, size, "rank 0's host layout (every rank's host identity)"),
        size);
  }
  const HostLayout layout =
      HostLayout::ofIdentities(rendezvous.gatherAll(kIdentityKey, size, "every rank's host identity"));
  rendezvous.set(kLayoutKey, layout.encode());
  return layout;
}

HostLayout publishedHostLayout(StoreRendezvous& rendezvous, int size) {
  return HostLayout::decode(rendezvous.get(kLayoutKey, "rank 0's host layout (which ranks share a host)"), size);
}

std::string publishedHostIdentity(StoreRendezvous& rendezvous, int rank) {
  return rendezvous.get(strCat(kIdentityKey, rank), strCat("rank ", rank, "'s host identity"));
}

}  // namespace ddplite
