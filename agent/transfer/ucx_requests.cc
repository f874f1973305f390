#include "agent/transfer/ucx_requests.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "common/log.h"

namespace reshard::agent {

std::string Describe(const UcxRequest& r) {
  if (r.is_send)
    return absl::StrCat("send of tag ", r.tag, " (", r.bytes, " bytes) to \"", r.peer, "\"");
  return absl::StrCat("receive of tag ", r.tag, " (", r.bytes, " bytes)");
}

UcxRequest* UcxRequests::New(uint64_t tag, size_t bytes, TransferDone done) {
  auto* r = new UcxRequest;
  r->owner = this;
  r->tag = tag;
  r->bytes = bytes;
  r->done = std::move(done);
  return r;
}

void UcxRequests::Fail(UcxRequest* r, absl::Status s) {
  auto done = std::move(r->done);
  delete r;
  if (done) done(std::move(s));
}

void UcxRequests::Send(UcxRequest* r, UcxEndpoint* e, const void* data) {
  r->ep = e;
  ucp_request_param_t p{};
  p.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
  p.cb.send = &OnSend;
  p.user_data = r;
  r->submitting = true;
  Track(r, ucp_tag_send_nbx(e->ep, data, r->bytes, r->tag, &p));
}

void UcxRequests::Receive(UcxRequest* r, void* data) {
  ucp_request_param_t p{};
  // No immediate completion: the callback always reports the length (UCX
  // 1.13 leaves recv_info unset on some immediate paths).
  p.op_attr_mask =
      UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FLAG_NO_IMM_CMPL;
  p.cb.recv = &OnReceive;
  p.user_data = r;
  r->submitting = true;
  Track(r, ucp_tag_recv_nbx(worker_, data, r->bytes, r->tag, kUcxFullMask, &p));
}

void UcxRequests::Track(UcxRequest* r, void* req) {
  r->submitting = false;
  if (r->completed_early) {
    if (UCS_PTR_IS_PTR(req)) ucp_request_free(req);
    return Complete(r, std::move(r->early_status));
  }
  if (req == nullptr) return Complete(r, absl::OkStatus());
  if (UCS_PTR_IS_ERR(req)) return Complete(r, FromUcs(UCS_PTR_STATUS(req), Describe(*r)));
  r->ucx = req;
  pending_.insert(r);
  pending_count_.fetch_add(1);
  if (r->ep != nullptr) r->ep->AddSend();
}

void UcxRequests::Complete(UcxRequest* r, absl::Status s) {
  if (r->submitting) {  // called back from inside the nbx call; Track finishes
    r->completed_early = true;
    r->early_status = std::move(s);
    return;
  }
  if (r->abandoned) {
    abandoned_.erase(r);
    ucp_request_free(r->ucx);
    delete r;
    return;
  }
  if (r->ucx != nullptr) {
    pending_.erase(r);
    pending_count_.fetch_sub(1);
    ucp_request_free(r->ucx);
    r->ucx = nullptr;
    if (r->ep != nullptr) r->ep->EndSend(r->cancelled);
  }
  if (r->cancelled && s.ok()) {
    s = absl::CancelledError(absl::StrCat(Describe(*r), ": cancelled; the receiver dropped it"));
  }
  auto err = receive_error_.find(r);
  if (err != receive_error_.end()) {
    if (!s.ok()) s = absl::UnavailableError(absl::StrCat(Describe(*r), ": ", err->second));
    receive_error_.erase(err);
  }
  Fail(r, std::move(s));
}

void UcxRequests::OnSend(void* /*req*/, ucs_status_t status, void* user_data) {
  // Never called from inside ucp_tag_send_nbx, so Track has run.
  auto* r = static_cast<UcxRequest*>(user_data);
  r->owner->Complete(r, FromUcs(status, Describe(*r)));
}

void UcxRequests::OnReceive(void* /*req*/, ucs_status_t status, const ucp_tag_recv_info_t* info,
                            void* user_data) {
  auto* r = static_cast<UcxRequest*>(user_data);
  absl::Status s = FromUcs(status, Describe(*r));
  if (s.ok() && info->length != r->bytes) {
    s = absl::InvalidArgumentError(absl::StrCat(Describe(*r), ": got ", info->length, " bytes"));
  }
  r->owner->Complete(r, std::move(s));
}

std::vector<UcxEndpoint*> UcxRequests::Cancel(uint64_t tag, uint64_t mask) {
  std::vector<UcxRequest*> victims;
  for (UcxRequest* r : pending_) {
    if (TagsAgree(r->tag, tag, mask)) victims.push_back(r);
  }
  std::unordered_set<UcxEndpoint*> endpoints;
  for (UcxRequest* r : victims) {
    if (!r->is_send) {
      ucp_request_cancel(worker_, r->ucx);
      continue;
    }
    // ucp_request_cancel ignores sends: the receiver drops them instead
    // (told by a discard notice), which completes them.
    if (!r->cancelled) {
      r->cancelled = true;
      r->ep->CancelSend();
    }
    endpoints.insert(r->ep);
  }
  return {endpoints.begin(), endpoints.end()};
}

void UcxRequests::FailReceives(const std::string& why) {
  std::vector<UcxRequest*> victims;
  for (UcxRequest* r : pending_) {
    if (!r->is_send) victims.push_back(r);
  }
  for (UcxRequest* r : victims) {
    receive_error_[r] = why;
    ucp_request_cancel(worker_, r->ucx);
  }
}

void UcxRequests::SendDiscardNotice(UcxEndpoint* e, uint64_t tag, uint64_t mask) {
  if (e->ep == nullptr || e->failed) return;
  UcxRequest* r = New(kDiscardNoticeTag, sizeof(UcxRequest::notice), nullptr);
  r->is_send = true;
  r->peer = e->peer;
  r->notice[0] = tag;
  r->notice[1] = mask;
  Send(r, e, r->notice);
}

void UcxRequests::PostNoticeReceive() {
  ucp_request_param_t p{};
  p.op_attr_mask =
      UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FLAG_NO_IMM_CMPL;
  p.cb.recv = &OnNotice;
  p.user_data = this;
  notice_done_ = false;
  void* req = ucp_tag_recv_nbx(worker_, notice_in_, sizeof(notice_in_), kDiscardNoticeTag,
                               kUcxFullMask, &p);
  notice_req_ = UCS_PTR_IS_PTR(req) ? req : nullptr;
}

void UcxRequests::OnNotice(void* /*req*/, ucs_status_t status, const ucp_tag_recv_info_t* info,
                           void* user_data) {
  auto* t = static_cast<UcxRequests*>(user_data);
  t->notice_done_ = true;
  t->notice_ok_ = status == UCS_OK && info->length == sizeof(t->notice_in_);
}

bool UcxRequests::TakeNotice(UcxDiscards* discards) {
  if (!notice_done_) return false;
  if (notice_ok_) discards->Add(notice_in_[0], notice_in_[1], UcxClock::now());
  ucp_request_free(notice_req_);
  notice_req_ = nullptr;
  PostNoticeReceive();
  return true;
}

void UcxRequests::CancelReceives() {
  std::vector<UcxRequest*> victims(pending_.begin(), pending_.end());
  for (UcxRequest* r : victims) {
    if (!r->is_send) ucp_request_cancel(worker_, r->ucx);
  }
  if (notice_req_ != nullptr) ucp_request_cancel(worker_, notice_req_);
}

void UcxRequests::AbandonPending() {
  if (!pending_.empty()) {
    RESHARD_LOG(WARNING) << "UCX transport: " << pending_.size()
                         << " transfers still pending at shutdown";
  }
  std::vector<UcxRequest*> victims(pending_.begin(), pending_.end());
  for (UcxRequest* r : victims) {
    pending_.erase(r);
    pending_count_.fetch_sub(1);
    auto done = std::move(r->done);
    r->abandoned = true;
    abandoned_.insert(r);
    if (done) done(absl::CancelledError(absl::StrCat(Describe(*r), ": transport shut down")));
  }
}

void UcxRequests::FreeAbandoned() {
  for (UcxRequest* r : abandoned_) delete r;
  abandoned_.clear();
}

}  // namespace reshard::agent
