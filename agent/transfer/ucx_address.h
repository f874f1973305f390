// How agents find each other over UCX: the address an agent advertises
// (Host.ucx_address) and which local IPv4 address it listens on.
//
// An agent listens on a socket address (UCX's client/server connection
// establishment, ucp_listener) when its UCX network devices name an interface
// with an IPv4 address, and advertises "ucx-listener:IP:PORT/INCARNATION".
// Otherwise it advertises its raw UCX worker address, and peers connect to it
// with UCX's worker-address wireup. The listener is preferred: with UCX 1.13
// the worker-address wireup aborts a process whose peer dies while it
// answers the peer's first connection request (docs/agent.md, "Known UCX
// defect"); a connection from a listener never answers such a request.
#pragma once

#include <netinet/in.h>

#include <optional>
#include <string>

#include "absl/status/statusor.h"

namespace reshard::agent {

/// The prefix of a listener address; anything else is a UCX worker address.
inline constexpr char kUcxListenerPrefix[] = "ucx-listener:";

/// The IPv4 address to listen on for `net_devices` (UCX_NET_DEVICES syntax):
/// the first listed interface that is up and has one ("lo", "eth0"; entries
/// such as "mlx5_0:1" name no interface and are skipped); for "" or "all",
/// the first interface that is up, has one and is not a loopback. None when
/// nothing qualifies.
std::optional<in_addr> ListenIpFor(const std::string& net_devices);

/// "IP:PORT" of an IPv4 socket address.
std::string IpPort(const sockaddr_in& at);

/// "ucx-listener:IP:PORT/INCARNATION". `incarnation` tells a restarted
/// agent that reuses the port from its predecessor.
std::string FormatListenerAddress(const sockaddr_in& at, uint64_t incarnation);

/// Whether `address` is a listener address (else a worker address).
bool IsListenerAddress(const std::string& address);

/// The socket address of a listener address; InvalidArgument naming what is
/// wrong otherwise.
absl::StatusOr<sockaddr_in> ParseListenerAddress(const std::string& address);

}  // namespace reshard::agent
