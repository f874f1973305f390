#include "agent/executor/peer_wait.h"

#include "absl/strings/str_cat.h"

namespace reshard::agent {

using std::chrono::duration_cast;
using std::chrono::milliseconds;

CoordinatorReach::CoordinatorReach(Clock now) : now_(std::move(now)) {
  if (!now_) now_ = [] { return std::chrono::steady_clock::now(); };
}

CoordinatorReach::TimePoint CoordinatorReach::Now() const { return now_(); }

milliseconds CoordinatorReach::Answered() {
  const TimePoint now = now_();
  std::lock_guard<std::mutex> l(mu_);
  last_answer_ = now;
  if (!silent_since_) return milliseconds(0);
  const auto silence = now > *silent_since_ ? now - *silent_since_ : TimePoint::duration(0);
  silent_total_ += silence;
  silent_since_.reset();
  return duration_cast<milliseconds>(silence);
}

bool CoordinatorReach::Unanswered(TimePoint sent_at) {
  std::lock_guard<std::mutex> l(mu_);
  if (silent_since_) return false;
  // Since the last answer: a call sent before it (a long poll) ended after
  // it, and the coordinator answered until then.
  silent_since_ = last_answer_.value_or(sent_at);
  return true;
}

bool CoordinatorReach::Silent() const {
  std::lock_guard<std::mutex> l(mu_);
  return silent_since_.has_value();
}

milliseconds CoordinatorReach::SilentSoFar() const {
  const TimePoint now = now_();
  std::lock_guard<std::mutex> l(mu_);
  auto total = silent_total_;
  if (silent_since_ && now > *silent_since_) total += now - *silent_since_;
  return duration_cast<milliseconds>(total);
}

PeerWait::PeerWait(PeerWaitBudget budget) : budget_(budget) {
  start_ = Now();
  if (budget_.reach != nullptr) silent_at_start_ = budget_.reach->SilentSoFar();
}

std::chrono::steady_clock::time_point PeerWait::Now() const {
  return budget_.reach != nullptr ? budget_.reach->Now() : std::chrono::steady_clock::now();
}

milliseconds PeerWait::SilentSinceStart() const {
  if (budget_.reach == nullptr) return milliseconds(0);
  return budget_.reach->SilentSoFar() - silent_at_start_;
}

bool PeerWait::Expired() const {
  if (budget_.reach != nullptr && budget_.reach->Silent()) return false;
  const auto counted = duration_cast<milliseconds>(Now() - start_) - SilentSinceStart();
  return counted >= budget_.timeout;
}

std::string PeerWait::Waited() const {
  std::string out = absl::StrCat(budget_.timeout.count() / 1000.0, " s");
  const milliseconds silent = SilentSinceStart();
  if (silent.count() > 0) {
    absl::StrAppend(&out, " (not counting ", silent.count() / 1000.0,
                    " s while the coordinator did not answer)");
  }
  return out;
}

}  // namespace reshard::agent
