#include "agent/transfer/ucx_connections.h"

#include <netinet/in.h>

#include <random>
#include <utility>

#include "absl/strings/str_cat.h"
#include "agent/transfer/ucx_address.h"
#include "common/log.h"

namespace reshard::agent {
namespace {

// UCX before 1.14 aborts the process when a peer dies while this worker
// answers its first worker-address connection request (an assertion on the
// purged reply, removed by openucx/ucx#8175). A listener avoids it.
void WarnOfWorkerAddressDefect(const std::string& why) {
  unsigned major = 0, minor = 0, release = 0;
  ucp_get_version(&major, &minor, &release);
  if (major > 1 || (major == 1 && minor >= 14)) return;
  RESHARD_LOG(WARNING) << "UCX: " << why << ", so peers connect by worker address; UCX " << major
                       << "." << minor << "." << release
                       << " then aborts this agent if a peer dies while answering its first "
                          "connection (docs/agent.md, \"Known UCX defect\")";
}

}  // namespace

absl::StatusOr<std::string> UcxConnections::Listen(const UcxOptions& options) {
  const std::optional<in_addr> ip =
      options.listen ? ListenIpFor(options.net_devices) : std::nullopt;
  if (!ip.has_value()) {
    ucp_address_t* addr = nullptr;
    size_t len = 0;
    ucs_status_t s = ucp_worker_get_address(worker_, &addr, &len);
    if (s != UCS_OK) return FromUcs(s, "ucp_worker_get_address");
    std::string address(reinterpret_cast<const char*>(addr), len);
    ucp_worker_release_address(worker_, addr);
    WarnOfWorkerAddressDefect(options.listen
                                  ? absl::StrCat("no IPv4 address on the network devices \"",
                                                 options.net_devices, "\" to listen on")
                                  : std::string("not listening (UcxOptions::listen is false)"));
    return address;
  }
  sockaddr_in at{};
  at.sin_family = AF_INET;
  at.sin_addr = *ip;
  ucp_listener_params_t lp{};
  lp.field_mask = UCP_LISTENER_PARAM_FIELD_SOCK_ADDR | UCP_LISTENER_PARAM_FIELD_CONN_HANDLER;
  lp.sockaddr.addr = reinterpret_cast<const sockaddr*>(&at);
  lp.sockaddr.addrlen = sizeof(at);
  lp.conn_handler.cb = &OnConnectionRequest;
  lp.conn_handler.arg = this;
  ucs_status_t s = ucp_listener_create(worker_, &lp, &listener_);
  if (s != UCS_OK) return FromUcs(s, "ucp_listener_create");
  ucp_listener_attr_t la{};
  la.field_mask = UCP_LISTENER_ATTR_FIELD_SOCKADDR;
  s = ucp_listener_query(listener_, &la);
  if (s != UCS_OK) return FromUcs(s, "ucp_listener_query");
  at.sin_port = reinterpret_cast<const sockaddr_in*>(&la.sockaddr)->sin_port;
  std::string address = FormatListenerAddress(
      at, std::random_device{}() * uint64_t{0x100000000} + std::random_device{}());
  RESHARD_LOG(INFO) << "UCX: peers connect to " << address;
  return address;
}

// A peer connects to our listener: its endpoint here answers its sends.
void UcxConnections::OnConnectionRequest(ucp_conn_request_h request, void* arg) {
  static_cast<UcxConnections*>(arg)->Accept(request);
}

void UcxConnections::Accept(ucp_conn_request_h request) {
  if (stopping_()) {
    last_conn_request_ = UcxClock::now();
    ucp_listener_reject(listener_, request);
    return;
  }
  auto e = std::make_unique<UcxEndpoint>();
  e->owner = this;
  e->accepted = true;
  e->peer = "a peer's connection";
  ucp_conn_request_attr_t ca{};
  ca.field_mask = UCP_CONN_REQUEST_ATTR_FIELD_CLIENT_ADDR;
  if (ucp_conn_request_query(request, &ca) == UCS_OK && ca.client_address.ss_family == AF_INET) {
    e->peer = absl::StrCat("a connection from ",
                           IpPort(*reinterpret_cast<const sockaddr_in*>(&ca.client_address)));
  }
  ucp_ep_params_t ep{};
  ep.field_mask = UCP_EP_PARAM_FIELD_CONN_REQUEST | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                  UCP_EP_PARAM_FIELD_ERR_HANDLER;
  ep.conn_request = request;
  ep.err_mode = UCP_ERR_HANDLING_MODE_PEER;
  ep.err_handler.cb = &OnEpError;
  ep.err_handler.arg = e.get();
  ucs_status_t s = ucp_ep_create(worker_, &ep, &e->ep);
  if (s != UCS_OK) {
    RESHARD_LOG(WARNING) << "UCX: cannot accept " << e->peer << ": " << ucs_status_string(s);
    return;
  }
  UcxEndpoint* raw = e.get();
  endpoints_.emplace(raw, std::move(e));
}

absl::Status UcxConnections::Connect(const std::string& peer_id, const std::string& address) {
  auto it = peers_.find(peer_id);
  if (it != peers_.end()) {
    UcxEndpoint* current = it->second->current;
    if (it->second->address == address && current != nullptr && !current->failed) {
      return absl::OkStatus();
    }
    // A new incarnation (or a failed endpoint): what is pending on the old
    // endpoint can never complete normally.
    if (current != nullptr) Retire(current);
    peers_.erase(it);
    CloseRetired();
  }
  auto peer = std::make_unique<Peer>();
  peer->address = address;
  absl::StatusOr<UcxEndpoint*> ep = CreateEndpoint(peer_id, peer->address);
  if (!ep.ok() && CloseRetiredOf(peer_id)) {
    // Seen under load: UCX refused a new endpoint (unreachable) while a
    // retired one to the same worker was still closing. Close those now
    // and try once more.
    RESHARD_LOG(WARNING) << "UCX: connecting to \"" << peer_id << "\" failed (" << ep.status()
                         << ") with retired endpoints still open; closed them, trying again";
    ep = CreateEndpoint(peer_id, peer->address);
  }
  if (!ep.ok()) return ep.status();
  peer->current = *ep;
  peers_[peer_id] = std::move(peer);
  return absl::OkStatus();
}

absl::StatusOr<UcxEndpoint*> UcxConnections::EndpointFor(const std::string& peer_id) {
  auto it = peers_.find(peer_id);
  if (it == peers_.end()) {
    return absl::FailedPreconditionError(
        absl::StrCat("send to unknown peer \"", peer_id, "\"; Connect first"));
  }
  Peer* peer = it->second.get();
  if (peer->current == nullptr) {  // retired by CancelTags
    absl::StatusOr<UcxEndpoint*> e = CreateEndpoint(peer_id, peer->address);
    if (!e.ok()) return absl::UnavailableError(e.status().message());
    peer->current = *e;
  }
  UcxEndpoint* e = peer->current;
  if (e->failed) {
    return absl::UnavailableError(absl::StrCat("peer \"", peer_id, "\" failed: ", e->error));
  }
  return e;
}

absl::StatusOr<UcxEndpoint*> UcxConnections::CreateEndpoint(const std::string& peer_id,
                                                            const std::string& address) {
  auto e = std::make_unique<UcxEndpoint>();
  e->owner = this;
  e->peer = peer_id;
  ucp_ep_params_t ep{};
  ep.field_mask = UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE | UCP_EP_PARAM_FIELD_ERR_HANDLER;
  sockaddr_in at{};
  if (IsListenerAddress(address)) {
    absl::StatusOr<sockaddr_in> parsed = ParseListenerAddress(address);
    if (!parsed.ok()) return parsed.status();
    at = *parsed;
    ep.field_mask |= UCP_EP_PARAM_FIELD_FLAGS | UCP_EP_PARAM_FIELD_SOCK_ADDR;
    ep.flags = UCP_EP_PARAMS_FLAGS_CLIENT_SERVER;
    ep.sockaddr.addr = reinterpret_cast<const sockaddr*>(&at);
    ep.sockaddr.addrlen = sizeof(at);
  } else {
    ep.field_mask |= UCP_EP_PARAM_FIELD_REMOTE_ADDRESS;
    ep.address = reinterpret_cast<const ucp_address_t*>(address.data());
  }
  ep.err_mode = UCP_ERR_HANDLING_MODE_PEER;
  ep.err_handler.cb = &OnEpError;
  ep.err_handler.arg = e.get();
  ucs_status_t s = ucp_ep_create(worker_, &ep, &e->ep);
  if (s != UCS_OK) return FromUcs(s, absl::StrCat("connecting to peer \"", peer_id, "\""));
  UcxEndpoint* raw = e.get();
  endpoints_.emplace(raw, std::move(e));
  return raw;
}

void UcxConnections::OnEpError(void* arg, ucp_ep_h /*ep*/, ucs_status_t status) {
  auto* e = static_cast<UcxEndpoint*>(arg);
  // UCX fails the sends on the endpoint itself.
  e->failed = true;
  e->error = ucs_status_string(status);
  if (e->accepted) {
    // The peer closed or lost its endpoint to us. Our receives are not
    // failed: the peer's death fails our own endpoint to it, and a peer
    // that gave up on one endpoint (CancelTags' last resort) may still be
    // sending to us over a new one.
    e->retired = true;
    e->owner->retired_left_ = true;
    return;
  }
  if (e->retired) return;  // its peer has a newer endpoint
  // A receive is not bound to a peer, so fail the receives too: their data
  // may have been coming from this peer, and a task fails as a whole anyway.
  e->owner->fail_receives_(
      absl::StrCat("connection to peer \"", e->peer, "\" failed: ", e->error));
}

// Takes `e` from its peer (new sends get a new endpoint); CloseRetired
// force-closes it.
void UcxConnections::Retire(UcxEndpoint* e) {
  if (e->retired) return;
  e->retired = true;
  auto it = peers_.find(e->peer);
  if (it != peers_.end() && it->second->current == e) it->second->current = nullptr;
}

// Force-closes every retired endpoint of `peer_id` at once and progresses
// the worker a little; whether there was one.
bool UcxConnections::CloseRetiredOf(const std::string& peer_id) {
  bool any = false;
  for (auto& [e, owned] : endpoints_) {
    if (e->retired && e->peer == peer_id && e->ep != nullptr) {
      ForceClose(e);
      any = true;
    }
  }
  for (int i = 0; any && i < 1000; ++i) ucp_worker_progress(worker_);
  retired_left_ = true;  // CloseRetired frees them once their sends are done
  return any;
}

// Force-closes the retired endpoints; frees closed ones that have nothing
// pending. UCX completes their sends (UCS_ERR_CANCELED) as the worker
// progresses.
void UcxConnections::CloseRetired() {
  retired_left_ = false;
  for (auto it = endpoints_.begin(); it != endpoints_.end();) {
    UcxEndpoint* e = it->first;
    if (e->retired && e->ep != nullptr) ForceClose(e);
    if (e->retired && e->ep == nullptr && e->sends == 0) {
      it = endpoints_.erase(it);
      continue;
    }
    retired_left_ = retired_left_ || e->retired;
    ++it;
  }
}

void UcxConnections::ForceClose(UcxEndpoint* e) {
  if (e->ep == nullptr) return;
  ucp_request_param_t p{};
  p.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
  p.flags = UCP_EP_CLOSE_FLAG_FORCE;
  // FORCE completes in place (UCX 1.13 returns no request for it); the
  // endpoint's requests are purged once its lanes are discarded.
  void* req = ucp_ep_close_nbx(e->ep, &p);
  e->ep = nullptr;
  if (UCS_PTR_IS_PTR(req)) {
    while (ucp_request_check_status(req) == UCS_INPROGRESS) ucp_worker_progress(worker_);
    ucp_request_free(req);
  }
}

void UcxConnections::WatchCancelled(UcxEndpoint* e, UcxClock::time_point now) {
  if (!e->cancelled_by) e->cancelled_by = now + kCancelFallback;
  cancel_watch_ = true;
}

void UcxConnections::Progress() {
  if (retired_left_) CloseRetired();
  if (cancel_watch_) CheckCancelled();
}

// Last resort for cancelled sends their receiver has not drained in time
// (it is stuck, or runs without discard notices): force-close the
// endpoint, which fails them.
void UcxConnections::CheckCancelled() {
  const auto now = UcxClock::now();
  cancel_watch_ = false;
  for (auto& [e, owned] : endpoints_) {
    switch (e->Watch(now)) {
      case UcxEndpoint::CancelWatch::kNone:
        continue;
      case UcxEndpoint::CancelWatch::kDrained:
        e->cancelled_by.reset();
        continue;
      case UcxEndpoint::CancelWatch::kWait:
        cancel_watch_ = true;
        continue;
      case UcxEndpoint::CancelWatch::kOverdue:
        break;
    }
    RESHARD_LOG(WARNING)
        << "UCX: " << e->sends - e->live_sends << " cancelled sends to \"" << e->peer
        << "\" were not drained by the peer within "
        << std::chrono::duration_cast<std::chrono::seconds>(kCancelFallback).count()
        << " s; closing the endpoint";
    Retire(e);
    cancel_watch_ = true;  // until freed
  }
  CloseRetired();
}

void UcxConnections::CloseAll() {
  // The listener stays until the transport destroys the worker: connection
  // requests that arrive meanwhile are rejected (Accept).
  for (auto& [e, owned] : endpoints_) ForceClose(e);
  peers_.clear();
}

void UcxConnections::DestroyListener() {
  if (listener_ != nullptr) ucp_listener_destroy(listener_);
  listener_ = nullptr;
}

}  // namespace reshard::agent
