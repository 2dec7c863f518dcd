#include "cpu/transport/net_iface.hpp"

#include "common/env.hpp"
#include "common/errors.hpp"
#include "common/process_identity.hpp"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <sstream>
#include <vector>

namespace ddplite::net {

namespace {

struct Interface {
  std::string name;
  std::string address;  // text; a link-local IPv6 address ends in "%<name>"
  int family = AF_INET;
  bool loopback = false;
  bool linkLocal = false;  // IPv6 fe80::/10: usable only with its scope (interface)
};

// The text of an address of either family; a link-local IPv6 address gets its "%interface".
std::string addressText(const sockaddr* address) {
  char text[INET6_ADDRSTRLEN] = {};
  if (address->sa_family == AF_INET) {
    inet_ntop(AF_INET, &reinterpret_cast<const sockaddr_in*>(address)->sin_addr, text, sizeof(text));
    return text;
  }
  const auto* six = reinterpret_cast<const sockaddr_in6*>(address);
  inet_ntop(AF_INET6, &six->sin6_addr, text, sizeof(text));
  std::string result = text;
  char name[IF_NAMESIZE] = {};
  if (IN6_IS_ADDR_LINKLOCAL(&six->sin6_addr) && six->sin6_scope_id != 0 &&
      if_indextoname(six->sin6_scope_id, name) != nullptr) {
    result += strCat("%", name);
  }
  return result;
}

// Every address of both families on interfaces that are up, in getifaddrs order.
std::vector<Interface> upInterfaces() {
  std::vector<Interface> result;
  ifaddrs* list = nullptr;
  if (getifaddrs(&list) != 0) {
    return result;
  }
  for (ifaddrs* it = list; it != nullptr; it = it->ifa_next) {
    if (it->ifa_addr == nullptr || !(it->ifa_flags & IFF_UP)) continue;
    const int family = it->ifa_addr->sa_family;
    if (family != AF_INET && family != AF_INET6) continue;
    Interface interface{it->ifa_name, addressText(it->ifa_addr), family};
    if (family == AF_INET) {
      interface.loopback = (it->ifa_flags & IFF_LOOPBACK) ||
                           (ntohl(reinterpret_cast<sockaddr_in*>(it->ifa_addr)->sin_addr.s_addr) >> 24) == 127;
    } else {
      const in6_addr& raw = reinterpret_cast<sockaddr_in6*>(it->ifa_addr)->sin6_addr;
      if (IN6_IS_ADDR_MULTICAST(&raw) || IN6_IS_ADDR_V4MAPPED(&raw)) continue;
      interface.loopback = (it->ifa_flags & IFF_LOOPBACK) || IN6_IS_ADDR_LOOPBACK(&raw);
      interface.linkLocal = IN6_IS_ADDR_LINKLOCAL(&raw);
    }
    result.push_back(interface);
  }
  freeifaddrs(list);
  return result;
}

std::string listInterfaces(const std::vector<Interface>& interfaces) {
  std::ostringstream out;
  for (size_t i = 0; i < interfaces.size(); ++i) {
    out << (i ? ", " : "") << interfaces[i].name << "=" << interfaces[i].address;
  }
  return out.str();
}

// The best address of `family` among `interfaces` that pass `accept`: for IPv6 a global or
// unique-local one first, a link-local one only when there is nothing else. nullptr if none.
template <typename Accept>
const Interface* bestOf(const std::vector<Interface>& interfaces, int family, Accept accept) {
  const Interface* linkLocal = nullptr;
  for (const auto& interface : interfaces) {
    if (interface.family != family || !accept(interface)) continue;
    if (!interface.linkLocal) return &interface;
    if (linkLocal == nullptr) linkLocal = &interface;
  }
  return linkLocal;
}

// Whether the host has an IPv4 address other than loopback, and an IPv6 one.
bool hasUsable(const std::vector<Interface>& interfaces, int family) {
  for (const auto& interface : interfaces) {
    if (interface.family == family && !interface.loopback) return true;
  }
  return false;
}

// The local address the kernel would use to reach host:port over `family` (a UDP connect sends
// nothing); "" when the host does not resolve in that family or there is no route.
std::string routeSourceAddress(const char* host, const char* port, int family) {
  addrinfo hints = {};
  hints.ai_family = family;
  hints.ai_socktype = SOCK_DGRAM;
  addrinfo* resolved = nullptr;
  if (getaddrinfo(host, port, &hints, &resolved) != 0 || resolved == nullptr) {
    return "";
  }
  std::string address;
  int fd = socket(family, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (fd >= 0 && connect(fd, resolved->ai_addr, resolved->ai_addrlen) == 0) {
    sockaddr_storage local = {};
    socklen_t length = sizeof(local);
    if (getsockname(fd, reinterpret_cast<sockaddr*>(&local), &length) == 0) {
      address = addressText(reinterpret_cast<sockaddr*>(&local));
    }
  }
  if (fd >= 0) close(fd);
  freeaddrinfo(resolved);
  return address;
}

bool isLocalAddress(const std::string& address, const std::vector<Interface>& interfaces) {
  for (const auto& interface : interfaces) {
    if (interface.address == address) return true;
  }
  return false;
}

std::string hostnameAddress(const std::vector<Interface>& interfaces, int family) {
  const std::string hostname = hostName();
  if (hostname.empty()) return "";
  addrinfo hints = {};
  hints.ai_family = family;
  addrinfo* resolved = nullptr;
  if (getaddrinfo(hostname.c_str(), nullptr, &hints, &resolved) != 0) {
    return "";
  }
  std::string found;
  for (addrinfo* it = resolved; it != nullptr && found.empty(); it = it->ai_next) {
    const std::string text = addressText(it->ai_addr);
    if (isLocalAddress(text, interfaces)) found = text;
  }
  freeaddrinfo(resolved);
  return found;
}

// The family the job's store address suggests: that of MASTER_ADDR, else of the store's host,
// when it is an address literal (no name lookup here); AF_INET otherwise.
int suggestedFamily(const std::string& storeHost) {
  const char* master = std::getenv("MASTER_ADDR");
  const int family = literalFamily(master != nullptr && master[0] != '\0' ? master : storeHost);
  return family == AF_INET6 ? AF_INET6 : AF_INET;
}

// What follows "interface X chosen by ...=spec" for an IPv6 choice ("" for IPv4, as before).
std::string describeChoice(const Interface& interface, int preferred) {
  if (interface.family == AF_INET) return "";
  if (interface.linkLocal) {
    return ", its IPv6 link-local address: the interfaces chosen have no IPv4, global or unique-local IPv6 address";
  }
  return preferred == AF_INET6 ? ", its IPv6 address: the store's address is IPv6"
                               : ", its IPv6 address: it has no IPv4 one";
}

std::string fromInterfaceSpec(const std::vector<Interface>& interfaces, const std::string& spec,
                              const std::string& source, const std::string& storeHost, std::string* why) {
  const int preferred = suggestedFamily(storeHost);
  const int other = preferred == AF_INET ? AF_INET6 : AF_INET;
  auto matches = [&](const Interface& interface) { return ifnameMatches(spec, interface.name); };
  const Interface* chosen = bestOf(interfaces, preferred, matches);
  if (chosen == nullptr || chosen->linkLocal) {
    // A link-local address of the preferred family is a last resort: the other family first.
    if (const Interface* fallback = bestOf(interfaces, other, matches);
        fallback != nullptr && (chosen == nullptr || !fallback->linkLocal)) {
      chosen = fallback;
    }
  }
  if (chosen == nullptr) {
    throwDistError(strCat(source, "=", spec, " matches no IPv4 interface or IPv6 interface that is up; available: ",
                          listInterfaces(interfaces)),
                   strCat("set ", source, " to one of the interfaces listed (NCCL syntax: 'eth' prefix, "
                          "'=eth0' exact, '^lo' exclude)"));
  }
  *why = strCat("interface ", chosen->name, " chosen by ", source, "=", spec, describeChoice(*chosen, preferred));
  return chosen->address;
}

// The address of a host with IPv6 but no IPv4 beyond loopback: the host name's IPv6 address when
// local, else the best IPv6 address of the first interfaces that have one.
std::string ipv6OnlyHostAddress(const std::vector<Interface>& interfaces, std::string* why) {
  std::string address = hostnameAddress(interfaces, AF_INET6);
  if (!address.empty() && address != "::1") {
    *why = "the IPv6 address of this host's name (the host has no IPv4 address but loopback)";
    return address;
  }
  const Interface* chosen = bestOf(interfaces, AF_INET6, [](const Interface& i) { return !i.loopback; });
  *why = strCat("interface ", chosen->name, "'s IPv6 ", chosen->linkLocal ? "link-local " : "",
                "address: the host has no IPv4 address but loopback; DDPLITE_SOCKET_IFNAME chooses another");
  return chosen->address;
}

}  // namespace

bool ifnameMatches(const std::string& spec, const std::string& ifname) {
  std::string body = spec;
  bool exclude = false;
  bool exact = false;
  if (!body.empty() && body[0] == '^') {
    exclude = true;
    body = body.substr(1);
  }
  if (!body.empty() && body[0] == '=') {
    exact = true;
    body = body.substr(1);
  }
  bool listed = false;
  std::stringstream items(body);
  std::string item;
  while (std::getline(items, item, ',')) {
    if (item.empty()) continue;
    if (exact ? ifname == item : ifname.compare(0, item.size(), item) == 0) {
      listed = true;
      break;
    }
  }
  return exclude ? !listed : listed;
}

std::string chooseListenAddress(std::string* why) { return chooseListenAddress(why, ""); }

std::string chooseListenAddress(std::string* why, const std::string& storeHost) {
  const auto interfaces = upInterfaces();
  std::string source;
  const std::string spec = env::socketIfname(&source);
  if (!spec.empty()) {
    return fromInterfaceSpec(interfaces, spec, source, storeHost, why);
  }
  if (const char* master = std::getenv("MASTER_ADDR"); master != nullptr && master[0] != '\0') {
    const char* port = std::getenv("MASTER_PORT");
    for (int family : {AF_INET, AF_INET6}) {
      std::string address = routeSourceAddress(master, port ? port : "29500", family);
      if (!address.empty()) {
        *why = strCat("the interface that reaches MASTER_ADDR=", master);
        return address;
      }
    }
  }
  if (literalFamily(storeHost) == AF_INET6) {
    std::string address = routeSourceAddress(storeHost.c_str(), "29500", AF_INET6);
    if (!address.empty()) {
      *why = strCat("the interface that reaches the store at ", storeHost);
      return address;
    }
  }
  if (!hasUsable(interfaces, AF_INET) && hasUsable(interfaces, AF_INET6)) {
    return ipv6OnlyHostAddress(interfaces, why);
  }
  std::string address = hostnameAddress(interfaces, AF_INET);
  if (!address.empty()) {
    *why = "the address of this host's name";
    return address;
  }
  const bool ipv4Loopback = isLocalAddress("127.0.0.1", interfaces) || !isLocalAddress("::1", interfaces);
  *why = "loopback (no MASTER_ADDR and the host name does not resolve to a local address)";
  return ipv4Loopback ? "127.0.0.1" : "::1";
}

int literalFamily(const std::string& host) {
  if (host.empty()) return AF_UNSPEC;
  in_addr four;
  if (inet_pton(AF_INET, host.c_str(), &four) == 1) return AF_INET;
  in6_addr six;
  const std::string bare = host.substr(0, host.find('%'));
  if (inet_pton(AF_INET6, bare.c_str(), &six) == 1) return AF_INET6;
  return AF_UNSPEC;
}

const char* familyName(int family) {
  return family == AF_INET ? "IPv4" : family == AF_INET6 ? "IPv6" : "unknown family";
}

std::string joinHostPort(const std::string& host, int port) {
  return host.find(':') == std::string::npos ? strCat(host, ":", port) : strCat("[", host, "]:", port);
}

std::string describeEndpoint(const sockaddr* address) {
  if (address->sa_family != AF_INET && address->sa_family != AF_INET6) return "?";
  const uint16_t port = address->sa_family == AF_INET ? reinterpret_cast<const sockaddr_in*>(address)->sin_port
                                                      : reinterpret_cast<const sockaddr_in6*>(address)->sin6_port;
  return joinHostPort(addressText(address), ntohs(port));
}

unsigned scopeOf(const std::string& host) {
  const size_t percent = host.find('%');
  if (percent == std::string::npos) return 0;
  return if_nametoindex(host.substr(percent + 1).c_str());
}

bool parseEndpoint(const std::string& hostPort, unsigned localScope, Endpoint* out, std::string* problem) {
  std::string host;
  std::string portText;
  if (!hostPort.empty() && hostPort[0] == '[') {
    const size_t close = hostPort.find("]:");
    if (close != std::string::npos) {
      host = hostPort.substr(1, close - 1);
      portText = hostPort.substr(close + 2);
    }
  } else if (const size_t colon = hostPort.rfind(':');
             colon != std::string::npos && hostPort.find(':') == colon) {  // one colon: IPv4
    host = hostPort.substr(0, colon);
    portText = hostPort.substr(colon + 1);
  }
  char* end = nullptr;
  errno = 0;
  const long port = portText.empty() ? -1 : std::strtol(portText.c_str(), &end, 10);
  const bool portOk = port >= 0 && port <= 65535 && errno == 0 && *end == '\0';
  *out = Endpoint{};
  if (portOk && literalFamily(host) == AF_INET && host.find('%') == std::string::npos) {
    auto* four = reinterpret_cast<sockaddr_in*>(&out->storage);
    four->sin_family = AF_INET;
    inet_pton(AF_INET, host.c_str(), &four->sin_addr);
    four->sin_port = htons(static_cast<uint16_t>(port));
    out->length = sizeof(sockaddr_in);
    return true;
  }
  if (portOk && literalFamily(host) == AF_INET6) {
    auto* six = reinterpret_cast<sockaddr_in6*>(&out->storage);
    six->sin6_family = AF_INET6;
    inet_pton(AF_INET6, host.substr(0, host.find('%')).c_str(), &six->sin6_addr);
    six->sin6_port = htons(static_cast<uint16_t>(port));
    out->length = sizeof(sockaddr_in6);
    if (!IN6_IS_ADDR_LINKLOCAL(&six->sin6_addr)) return true;
    six->sin6_scope_id = localScope != 0 ? localScope : scopeOf(host);
    if (six->sin6_scope_id != 0) return true;
    *problem = strCat("'", hostPort, "' is an IPv6 link-local address, usable only through an interface on its link, "
                      "and this host has no interface named after its scope nor a link-local address of its own "
                      "to pair it with");
    return false;
  }
  *problem = strCat("'", hostPort, "' is not an address:port (a.b.c.d:port, or [IPv6 address]:port)");
  return false;
}

}  // namespace ddplite::net
