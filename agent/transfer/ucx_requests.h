// The UCX transport's requests (internal to ucx_transport.cc, called from its
// progress thread only, apart from New and Fail): tag sends and receives in
// flight, their completion (UCX may complete one inside the call that
// submits it), cancellation, the discard notices that ask a peer to drop
// what we sent it (ucx_discard.h), and what is left at shutdown.
#pragma once

#include <ucp/api/ucp.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "absl/status/status.h"
#include "agent/transfer/transport.h"
#include "agent/transfer/ucx_connections.h"
#include "agent/transfer/ucx_discard.h"

namespace reshard::agent {

class UcxRequests;

// The tag of a discard notice: "drop what I sent you under (tag, mask)".
inline constexpr uint64_t kDiscardNoticeTag = kReservedTag;

/// One send or receive in flight; owned by UcxRequests until it completes.
struct UcxRequest {
  UcxRequests* owner = nullptr;
  uint64_t tag = 0;
  size_t bytes = 0;
  bool is_send = false;
  std::string peer;             // sends only
  UcxEndpoint* ep = nullptr;    // sends only: the endpoint it went out on
  bool cancelled = false;       // matched a CancelTags
  uint64_t notice[2] = {0, 0};  // a discard notice's payload (tag, mask)
  void* ucx = nullptr;
  TransferDone done;
  bool abandoned = false;  // failed at shutdown; UCX may still call back
  // Inside ucp_tag_*_nbx: UCX may complete the request and call back before
  // the call returns (always so for UCP_OP_ATTR_FLAG_NO_IMM_CMPL).
  bool submitting = false;
  bool completed_early = false;
  absl::Status early_status;
};

/// "send of tag T (B bytes) to "peer"" / "receive of tag T (B bytes)".
std::string Describe(const UcxRequest& r);

class UcxRequests {
 public:
  explicit UcxRequests(ucp_worker_h worker) : worker_(worker) {}
  UcxRequests(const UcxRequests&) = delete;
  UcxRequests& operator=(const UcxRequests&) = delete;

  /// A request not yet submitted (any thread).
  UcxRequest* New(uint64_t tag, size_t bytes, TransferDone done);
  /// Ends a request that is not pending: deletes it, then calls its done.
  static void Fail(UcxRequest* r, absl::Status s);

  /// Submits `r` as a send of `data` on `e`, or as a receive into `data`.
  void Send(UcxRequest* r, UcxEndpoint* e, const void* data);
  void Receive(UcxRequest* r, void* data);

  /// CancelTags: cancels the pending receives under (tag, mask) and marks
  /// its sends cancelled (UCX cannot cancel them; the receiver drops them);
  /// the endpoints those sends are on.
  std::vector<UcxEndpoint*> Cancel(uint64_t tag, uint64_t mask);
  /// Fails every pending receive, with `why` (a peer's connection failed).
  void FailReceives(const std::string& why);

  /// Tells the peer of `e` to drop what we sent it under (tag, mask).
  void SendDiscardNotice(UcxEndpoint* e, uint64_t tag, uint64_t mask);
  /// One receive of discard notices is always posted: this posts it.
  void PostNoticeReceive();
  /// When a notice has arrived: has `discards` drop what it names, posts
  /// the next receive, true.
  bool TakeNotice(UcxDiscards* discards);

  bool empty() const { return pending_.empty(); }
  size_t size() const { return pending_.size(); }
  /// Pending requests (any thread).
  size_t pending_count() const { return pending_count_.load(); }

  /// Stopping: cancels the receives (their own and the notice receive).
  void CancelReceives();
  /// Stopping, last: fails what is still pending with Cancelled; their UCX
  /// requests are left to the worker's destruction, then FreeAbandoned.
  void AbandonPending();
  void FreeAbandoned();

 private:
  static void OnSend(void* req, ucs_status_t status, void* user_data);
  static void OnReceive(void* req, ucs_status_t status, const ucp_tag_recv_info_t* info,
                        void* user_data);
  static void OnNotice(void* req, ucs_status_t status, const ucp_tag_recv_info_t* info,
                       void* user_data);
  void Track(UcxRequest* r, void* req);
  void Complete(UcxRequest* r, absl::Status s);

  ucp_worker_h worker_;
  std::unordered_set<UcxRequest*> pending_;
  std::unordered_map<UcxRequest*, std::string> receive_error_;
  std::unordered_set<UcxRequest*> abandoned_;
  std::atomic<size_t> pending_count_{0};
  uint64_t notice_in_[2] = {0, 0};  // the discard notice being received
  void* notice_req_ = nullptr;
  bool notice_done_ = false;
  bool notice_ok_ = false;
};

}  // namespace reshard::agent
