#include "agent/transfer/ucx_address.h"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <net/if.h>

#include <cstdio>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace reshard::agent {
namespace {

// The IPv4 address of interface `name` (or, for an empty name, of the first
// interface that is up and not a loopback).
std::optional<in_addr> InterfaceIp(const ifaddrs* list, const std::string& name) {
  for (const ifaddrs* i = list; i != nullptr; i = i->ifa_next) {
    if (i->ifa_addr == nullptr || i->ifa_addr->sa_family != AF_INET) continue;
    if ((i->ifa_flags & IFF_UP) == 0) continue;
    if (name.empty() ? (i->ifa_flags & IFF_LOOPBACK) != 0 : name != i->ifa_name) continue;
    return reinterpret_cast<const sockaddr_in*>(i->ifa_addr)->sin_addr;
  }
  return std::nullopt;
}

}  // namespace

std::optional<in_addr> ListenIpFor(const std::string& net_devices) {
  ifaddrs* list = nullptr;
  if (getifaddrs(&list) != 0) return std::nullopt;
  std::optional<in_addr> ip;
  if (net_devices.empty() || net_devices == "all") {
    ip = InterfaceIp(list, "");
  } else {
    for (absl::string_view entry : absl::StrSplit(net_devices, ',', absl::SkipEmpty())) {
      if (entry.find(':') != absl::string_view::npos) continue;  // a device:port
      ip = InterfaceIp(list, std::string(entry));
      if (ip.has_value()) break;
    }
  }
  freeifaddrs(list);
  return ip;
}

std::string IpPort(const sockaddr_in& at) {
  char ip[INET_ADDRSTRLEN] = {0};
  inet_ntop(AF_INET, &at.sin_addr, ip, sizeof(ip));
  return absl::StrCat(ip, ":", ntohs(at.sin_port));
}

std::string FormatListenerAddress(const sockaddr_in& at, uint64_t incarnation) {
  char id[17];
  std::snprintf(id, sizeof(id), "%016llx", static_cast<unsigned long long>(incarnation));
  return absl::StrCat(kUcxListenerPrefix, IpPort(at), "/", id);
}

bool IsListenerAddress(const std::string& address) {
  return absl::StartsWith(address, kUcxListenerPrefix);
}

absl::StatusOr<sockaddr_in> ParseListenerAddress(const std::string& address) {
  absl::string_view rest = address;
  auto bad = [&](absl::string_view why) {
    return absl::InvalidArgumentError(absl::StrCat("UCX listener address \"", address, "\": ", why,
                                                   " (want \"", kUcxListenerPrefix,
                                                   "IP:PORT/INCARNATION\")"));
  };
  if (!absl::ConsumePrefix(&rest, kUcxListenerPrefix)) return bad("no prefix");
  const size_t slash = rest.find('/');
  if (slash == absl::string_view::npos) return bad("no incarnation");
  const absl::string_view host_port = rest.substr(0, slash);
  const size_t colon = host_port.rfind(':');
  if (colon == absl::string_view::npos) return bad("no port");
  uint32_t port = 0;
  if (!absl::SimpleAtoi(host_port.substr(colon + 1), &port) || port == 0 || port > 65535) {
    return bad("bad port");
  }
  sockaddr_in at{};
  at.sin_family = AF_INET;
  at.sin_port = htons(static_cast<uint16_t>(port));
  const std::string ip(host_port.substr(0, colon));
  if (inet_pton(AF_INET, ip.c_str(), &at.sin_addr) != 1) return bad("bad IPv4 address");
  return at;
}

}  // namespace reshard::agent
