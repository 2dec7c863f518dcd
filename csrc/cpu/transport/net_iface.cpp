#include "cpu/transport/net_iface.hpp"

#include "common/env.hpp"
#include "common/errors.hpp"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <sstream>
#include <vector>

namespace ddplite::net {

namespace {

struct Interface {
  std::string name;
  std::string address;
};

std::vector<Interface> upIpv4Interfaces() {
  std::vector<Interface> result;
  ifaddrs* list = nullptr;
  if (getifaddrs(&list) != 0) {
    return result;
  }
  for (ifaddrs* it = list; it != nullptr; it = it->ifa_next) {
    if (it->ifa_addr == nullptr || it->ifa_addr->sa_family != AF_INET || !(it->ifa_flags & IFF_UP)) {
      continue;
    }
    char text[INET_ADDRSTRLEN] = {};
    inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(it->ifa_addr)->sin_addr, text, sizeof(text));
    result.push_back({it->ifa_name, text});
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

// The local address the kernel would use to reach host:port (a UDP connect sends nothing).
std::string routeSourceAddress(const char* host, const char* port) {
  addrinfo hints = {};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_DGRAM;
  addrinfo* resolved = nullptr;
  if (getaddrinfo(host, port, &hints, &resolved) != 0 || resolved == nullptr) {
    return "";
  }
  std::string address;
  int fd = socket(AF_INET, SOCK_DGRAM, 0);
  if (fd >= 0 && connect(fd, resolved->ai_addr, resolved->ai_addrlen) == 0) {
    sockaddr_in local = {};
    socklen_t length = sizeof(local);
    if (getsockname(fd, reinterpret_cast<sockaddr*>(&local), &length) == 0) {
      char text[INET_ADDRSTRLEN] = {};
      inet_ntop(AF_INET, &local.sin_addr, text, sizeof(text));
      address = text;
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

std::string hostnameAddress(const std::vector<Interface>& interfaces) {
  char hostname[256] = {};
  if (gethostname(hostname, sizeof(hostname) - 1) != 0) {
    return "";
  }
  addrinfo hints = {};
  hints.ai_family = AF_INET;
  addrinfo* resolved = nullptr;
  if (getaddrinfo(hostname, nullptr, &hints, &resolved) != 0) {
    return "";
  }
  std::string found;
  for (addrinfo* it = resolved; it != nullptr && found.empty(); it = it->ai_next) {
    char text[INET_ADDRSTRLEN] = {};
    inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(it->ai_addr)->sin_addr, text, sizeof(text));
    if (isLocalAddress(text, interfaces)) found = text;
  }
  freeaddrinfo(resolved);
  return found;
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

std::string chooseListenAddress(std::string* why) {
  const auto interfaces = upIpv4Interfaces();
  std::string source;
  const std::string spec = env::socketIfname(&source);
  if (!spec.empty()) {
    for (const auto& interface : interfaces) {
      if (ifnameMatches(spec, interface.name)) {
        *why = strCat("interface ", interface.name, " chosen by ", source, "=", spec);
        return interface.address;
      }
    }
    throwDistError(strCat(source, "=", spec, " matches no IPv4 interface that is up; available: ",
                          listInterfaces(interfaces)),
                   strCat("set ", source, " to one of the interfaces listed (NCCL syntax: 'eth' prefix, "
                          "'=eth0' exact, '^lo' exclude)"));
  }
  if (const char* master = std::getenv("MASTER_ADDR"); master != nullptr && master[0] != '\0') {
    const char* port = std::getenv("MASTER_PORT");
    std::string address = routeSourceAddress(master, port ? port : "29500");
    if (!address.empty()) {
      *why = strCat("the interface that reaches MASTER_ADDR=", master);
      return address;
    }
  }
  std::string address = hostnameAddress(interfaces);
  if (!address.empty()) {
    *why = "the address of this host's name";
    return address;
  }
  *why = "loopback (no MASTER_ADDR and the host name does not resolve to a local address)";
  return "127.0.0.1";
}

}  // namespace ddplite::net
