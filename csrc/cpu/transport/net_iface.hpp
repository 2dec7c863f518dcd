// Choosing the local address (IPv4 or IPv6) that a rank listens on, and the text form of
// addresses in the store and in messages: "10.0.0.1:29500", "[fd00::1]:29500",
// "[fe80::1%eth0]:29500" (a link-local address carries the publisher's interface as its scope).
#pragma once

#include <sys/socket.h>

#include <string>

namespace ddplite::net {

// Matches interface names against an NCCL-style spec: comma-separated prefixes, "=" for exact
// names, "^" to exclude. Exposed for tests.
bool ifnameMatches(const std::string& spec, const std::string& ifname);

// Picks the address, IPv4 whenever IPv4 is usable, as before IPv6 support:
//  1. DDPLITE_SOCKET_IFNAME (or NCCL_/GLOO_SOCKET_IFNAME): the first matching interface's address,
//     IPv4 first (IPv6 first when MASTER_ADDR, or else the store's host, is an IPv6 literal); of
//     IPv6 addresses a global or unique-local one, a link-local one (with its scope) only when the
//     interfaces have nothing else;
//  2. the local address whose route reaches MASTER_ADDR (over IPv4, else over IPv6);
//  3. when `storeHost` (the TCPStore's host, "" if unknown) is an IPv6 literal, the local address
//     whose route reaches it;
//  4. on a host with no IPv4 address but loopback and an IPv6 one: the host name's IPv6 address
//     when it is local, else the first global or unique-local IPv6 address, else a link-local one;
//  5. the host name's IPv4 address when it is local; else 127.0.0.1 (::1 if lo has no IPv4).
// `why` receives a short explanation for the INFO log and error messages.
std::string chooseListenAddress(std::string* why, const std::string& storeHost);
std::string chooseListenAddress(std::string* why);

// A socket address of either family.
struct Endpoint {
  sockaddr_storage storage{};
  socklen_t length = 0;
  int family() const { return storage.ss_family; }
  const sockaddr* get() const { return reinterpret_cast<const sockaddr*>(&storage); }
};

// AF_INET or AF_INET6 for an address literal ("fe80::1%eth0" included), AF_UNSPEC otherwise.
int literalFamily(const std::string& host);
// "IPv4", "IPv6" or "unknown family".
const char* familyName(int family);
// "host:port", with the host in brackets when it is IPv6.
std::string joinHostPort(const std::string& host, int port);
// "10.0.0.1:80" or "[fd00::1]:80" (a link-local address with its "%interface").
std::string describeEndpoint(const sockaddr* address);
// Parses "a.b.c.d:port" or "[ipv6]:port" (the IPv6 address may carry "%scope"). A link-local
// address is given `localScope` (this rank's interface index on that link) when non-zero, else
// the scope it names when this host has an interface of that name. False with `problem` set when
// the text is malformed or a link-local address has no interface here.
bool parseEndpoint(const std::string& hostPort, unsigned localScope, Endpoint* out, std::string* problem);
// The interface index in a link-local host literal ("fe80::1%eth0"), 0 for anything else.
unsigned scopeOf(const std::string& host);

}  // namespace ddplite::net
