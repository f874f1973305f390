#include "services/coordinator/logic/lease_judge.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace reshard::coordinator {

const char* LeaseJudge::Label(Reason reason) {
  switch (reason) {
    case Reason::kNone:
      return "";
    case Reason::kLatePass:
      return "late_pass";
    case Reason::kHeartbeatBacklog:
      return "heartbeat_backlog";
    case Reason::kMassExpiry:
      return "mass_expiry";
  }
  return "";
}

void LeaseJudge::Reset(int64_t now_ms) {
  last_pass_ms_ = now_ms;
  suspended_until_ms_ = 0;
  mass_since_ms_ = 0;
  last_pass_late_ = false;
}

LeaseJudge::Verdict LeaseJudge::BeginPass(int64_t now_ms, int64_t heartbeat_lag_ms) {
  const int64_t quarter = options_.lease_ms / 4;
  const int64_t gap = last_pass_ms_ > 0 ? now_ms - last_pass_ms_ : 0;
  last_pass_ms_ = now_ms;
  last_pass_late_ = options_.tick_ms > 0 && gap > options_.tick_ms + quarter;
  if (last_pass_late_) {
    suspended_until_ms_ = std::max(suspended_until_ms_, now_ms + options_.lease_ms / 3);
    return Verdict{false, Reason::kLatePass,
                   absl::StrCat("this pass began ", gap, " ms after the previous one (tick ",
                                options_.tick_ms, " ms): the coordinator itself was not running; "
                                "leases and stalls are judged again after one heartbeat period (",
                                options_.lease_ms / 3, " ms)")};
  }
  if (heartbeat_lag_ms > quarter) {
    return Verdict{false, Reason::kHeartbeatBacklog,
                   absl::StrCat("the oldest heartbeat not yet recorded has waited ",
                                heartbeat_lag_ms, " ms (over a quarter lease, ", quarter,
                                " ms): leases are not judged until the coordinator catches up")};
  }
  if (now_ms < suspended_until_ms_) {
    return Verdict{false, Reason::kLatePass,
                   absl::StrCat("judging again in ", suspended_until_ms_ - now_ms,
                                " ms, one heartbeat period after a late pass")};
  }
  return Verdict{};
}

LeaseJudge::Verdict LeaseJudge::Expiries(int64_t now_ms, int64_t expired, int64_t alive) {
  const bool mass = expired >= kMassExpiryMinHosts && 2 * expired > alive;
  if (!mass) {
    mass_since_ms_ = 0;
    return Verdict{};
  }
  if (mass_since_ms_ == 0) mass_since_ms_ = now_ms;
  const int64_t deferred = now_ms - mass_since_ms_;
  if (deferred <= options_.lease_ms) {
    return Verdict{false, Reason::kMassExpiry,
                   absl::StrCat(expired, " of ", alive,
                                " live hosts' leases ended together: suspecting this coordinator "
                                "or its network rather than the hosts; deferred ",
                                deferred, " ms of at most one lease (", options_.lease_ms, " ms)")};
  }
  mass_since_ms_ = 0;
  return Verdict{true, Reason::kMassExpiry,
                 absl::StrCat(expired, " of ", alive, " hosts stayed silent through a deferral of ",
                              deferred, " ms: marking them LOST")};
}

}  // namespace reshard::coordinator
