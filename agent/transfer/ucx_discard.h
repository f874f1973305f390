// Discarding the messages of cancelled transfers (internal to the UCX
// transport, which calls it from its progress thread only).
//
// UCX cannot cancel a send: a rendezvous send completes only when the
// receiver matches it, or when its endpoint fails or is force-closed. And
// UCX pairs the endpoints two workers create to each other into one
// connection, so force-closing "our" endpoint to a peer also breaks the
// peer's transfers to us (its receives in flight here are cancelled, its
// endpoint times out). So a cancelled transfer is not cut off by closing
// anything: the receiving side drains it. For each (tag, mask) cancelled —
// locally, or by a peer's discard notice — matching messages that arrive
// unmatched are received into scratch memory and dropped, which completes
// their sends normally, until the filter has been idle for a while.
#pragma once

#include <ucp/api/ucp.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <vector>

namespace reshard::agent {

class UcxDiscards {
 public:
  using Clock = std::chrono::steady_clock;
  /// How long a filter stays after it was added or last drained a message.
  static constexpr auto kKeep = std::chrono::seconds(60);

  explicit UcxDiscards(ucp_worker_h worker) : worker_(worker) {}
  ~UcxDiscards();
  UcxDiscards(const UcxDiscards&) = delete;
  UcxDiscards& operator=(const UcxDiscards&) = delete;

  /// Drains messages whose tag agrees with `tag` on `mask` from now on.
  void Add(uint64_t tag, uint64_t mask, Clock::time_point now);
  /// Receives (into scratch) the unexpected messages that match a filter,
  /// frees finished drains and expires idle filters; whether it did anything.
  bool Progress(Clock::time_point now);
  /// Whether Progress has anything to do.
  bool active() const { return !filters_.empty() || !drains_.empty(); }
  /// Messages drained so far (for tests and logs).
  uint64_t drained() const { return drained_; }

 private:
  struct Filter {
    uint64_t tag;
    uint64_t mask;
    Clock::time_point expires;
  };
  struct Drain {
    std::unique_ptr<char[]> buffer;
    void* ucx = nullptr;
    bool done = false;
  };
  static void OnDrained(void* req, ucs_status_t status, const ucp_tag_recv_info_t* info,
                        void* user_data);

  ucp_worker_h worker_;
  std::vector<Filter> filters_;
  std::vector<std::unique_ptr<Drain>> drains_;
  uint64_t drained_ = 0;
};

}  // namespace reshard::agent
