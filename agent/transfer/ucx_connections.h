// The UCX transport's connections (internal to ucx_transport.cc, called from
// its progress thread only): the listener peers connect to, the endpoints to
// peers and from them, a peer's current endpoint, and the last resort for
// cancelled sends (retire and force-close their endpoint).
//
// UCX (1.13) cannot cancel a send request: a rendezvous send completes only
// when the receiver matches it, or when its endpoint fails or is force-closed
// (UCX then completes every request on it with an error, after its transport
// endpoints are discarded, so the buffer is no longer read). Cancelled sends
// are drained by the receiver (ucx_discard.h); only those still pending after
// kCancelFallback get their endpoint retired (new sends to the peer get a
// fresh one) and force-closed.
#pragma once

#include <ucp/api/ucp.h>

#include <chrono>
#include <cstddef>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "agent/transfer/transport.h"
#include "agent/transfer/ucx_worker.h"

namespace reshard::agent {

class UcxConnections;

// After CancelTags, how long cancelled sends get to be drained by their
// receiver (ucx_discard.h) before their endpoint is retired and force-closed
// as a last resort (with worker addresses, that also breaks the peer's
// transfers to us: UCX pairs the two sides' endpoints into one connection).
inline constexpr auto kCancelFallback = std::chrono::seconds(8);

/// One ucp endpoint to a peer, or from one (accepted).
struct UcxEndpoint {
  UcxConnections* owner = nullptr;
  std::string peer;
  ucp_ep_h ep = nullptr;  // null once closed
  bool failed = false;
  std::string error;
  size_t sends = 0;       // pending sends on it
  size_t live_sends = 0;  // of which not cancelled
  bool retired = false;   // no longer a peer's current endpoint
  // Made from a connection request to our listener: the peer's endpoint to
  // us, over which UCX answers its sends (rendezvous replies). Never sent on.
  bool accepted = false;
  // Set while cancelled sends are pending on it: when they must be gone.
  std::optional<UcxClock::time_point> cancelled_by;

  /// Send accounting: a send went out on it, was cancelled (once), ended.
  void AddSend() {
    ++sends;
    ++live_sends;
  }
  void CancelSend() { --live_sends; }
  void EndSend(bool cancelled) {
    --sends;
    if (!cancelled) --live_sends;
  }

  /// What the cancel watch does with it at `now`: nothing (no cancelled
  /// sends were watched), forget the deadline (all drained), wait (before
  /// the deadline, or already retired), or retire it (overdue).
  enum class CancelWatch { kNone, kDrained, kWait, kOverdue };
  CancelWatch Watch(UcxClock::time_point now) const {
    if (!cancelled_by) return CancelWatch::kNone;
    if (sends == live_sends) return CancelWatch::kDrained;
    if (now < *cancelled_by || retired) return CancelWatch::kWait;
    return CancelWatch::kOverdue;
  }
};

class UcxConnections {
 public:
  /// `stopping`: whether the transport stops (connection requests are then
  /// rejected); `fail_receives`: fails every pending receive with the reason
  /// (a peer's connection failed). Both are called from UCX callbacks.
  UcxConnections(ucp_worker_h worker, std::function<bool()> stopping,
                 std::function<void(const std::string&)> fail_receives)
      : worker_(worker), stopping_(std::move(stopping)), fail_receives_(std::move(fail_receives)) {}
  UcxConnections(const UcxConnections&) = delete;
  UcxConnections& operator=(const UcxConnections&) = delete;

  /// The address peers connect to (ucx_address.h): a listener on the IPv4
  /// address of our network device when there is one, else the worker's
  /// address.
  [[nodiscard]] absl::StatusOr<std::string> Listen(const UcxOptions& options);
  /// Makes `peer_id` reachable at `address`; idempotent for the same address.
  [[nodiscard]] absl::Status Connect(const std::string& peer_id, const std::string& address);
  /// The endpoint to send to `peer_id` on (a fresh one after the last was
  /// retired): FailedPrecondition for a peer never connected, Unavailable for
  /// a failed one.
  [[nodiscard]] absl::StatusOr<UcxEndpoint*> EndpointFor(const std::string& peer_id);

  /// Sends on `e` were cancelled at `now`: they must be drained by
  /// now + kCancelFallback.
  void WatchCancelled(UcxEndpoint* e, UcxClock::time_point now);
  /// Each pass of the progress loop: closes retired endpoints, retires those
  /// whose cancelled sends are overdue.
  void Progress();

  /// Stopping: force-closes every endpoint (which fails its sends) and forgets
  /// the peers; connection requests from now on are rejected.
  void CloseAll();
  /// When the last connection request was rejected (or `now`, if later).
  void QuietSince(UcxClock::time_point now) { last_conn_request_ = now; }
  UcxClock::time_point last_conn_request() const { return last_conn_request_; }
  /// Destroys the listener; see UcxTransport's Shutdown on when.
  void DestroyListener();

 private:
  static void OnConnectionRequest(ucp_conn_request_h request, void* arg);
  static void OnEpError(void* arg, ucp_ep_h ep, ucs_status_t status);
  void Accept(ucp_conn_request_h request);
  absl::StatusOr<UcxEndpoint*> CreateEndpoint(const std::string& peer_id,
                                              const std::string& address);
  void Retire(UcxEndpoint* e);
  bool CloseRetiredOf(const std::string& peer_id);
  void CloseRetired();
  void CheckCancelled();
  void ForceClose(UcxEndpoint* e);

  struct Peer {
    std::string address;
    UcxEndpoint* current = nullptr;  // null: create one on the next send
  };

  ucp_worker_h worker_;
  std::function<bool()> stopping_;
  std::function<void(const std::string&)> fail_receives_;
  ucp_listener_h listener_ = nullptr;  // null: peers connect by worker address
  std::unordered_map<std::string, std::unique_ptr<Peer>> peers_;
  std::unordered_map<UcxEndpoint*, std::unique_ptr<UcxEndpoint>> endpoints_;
  bool retired_left_ = false;  // some endpoint is retired but not yet freed
  UcxClock::time_point last_conn_request_{};  // the last one rejected while stopping
  bool cancel_watch_ = false;  // some endpoint has cancelled sends pending
};

}  // namespace reshard::agent
