#include "agent/transfer/ucx_discard.h"

#include <algorithm>

#include "agent/transfer/ucx_worker.h"

namespace reshard::agent {

UcxDiscards::~UcxDiscards() {
  // The worker is destroyed first (the transport's shutdown); what UCX still
  // held of a drain is gone with it, so the scratch buffers can go too.
}

void UcxDiscards::Add(uint64_t tag, uint64_t mask, Clock::time_point now) {
  for (Filter& f : filters_) {
    if (f.mask == mask && TagsAgree(f.tag, tag, mask)) {
      f.expires = now + kKeep;
      return;
    }
  }
  filters_.push_back(Filter{tag, mask, now + kKeep});
}

void UcxDiscards::OnDrained(void* /*req*/, ucs_status_t /*status*/,
                            const ucp_tag_recv_info_t* /*info*/, void* user_data) {
  static_cast<Drain*>(user_data)->done = true;
}

bool UcxDiscards::Progress(Clock::time_point now) {
  bool any = false;
  for (Filter& f : filters_) {
    ucp_tag_recv_info_t info{};
    while (ucp_tag_message_h msg = ucp_tag_probe_nb(worker_, f.tag, f.mask, 1, &info)) {
      auto d = std::make_unique<Drain>();
      d->buffer.reset(new char[std::max<size_t>(info.length, 1)]);
      ucp_request_param_t p{};
      p.op_attr_mask =
          UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FLAG_NO_IMM_CMPL;
      p.cb.recv = &OnDrained;
      p.user_data = d.get();
      void* req = ucp_tag_msg_recv_nbx(worker_, d->buffer.get(), info.length, msg, &p);
      if (UCS_PTR_IS_PTR(req)) {
        d->ucx = req;
        drains_.push_back(std::move(d));
      }
      f.expires = now + kKeep;
      ++drained_;
      any = true;
    }
  }
  for (auto it = drains_.begin(); it != drains_.end();) {
    if ((*it)->done) {
      ucp_request_free((*it)->ucx);
      it = drains_.erase(it);
      any = true;
    } else {
      ++it;
    }
  }
  filters_.erase(std::remove_if(filters_.begin(), filters_.end(),
                                [&](const Filter& f) { return now >= f.expires; }),
                 filters_.end());
  return any;
}

}  // namespace reshard::agent
