#include "bench/control_plane/watchers.h"

#include <utility>

#include "absl/strings/str_cat.h"

namespace reshard::bench {

class WatchSet::Stream : public grpc::ClientReadReactor<v1::Job> {
 public:
  Stream(WatchSet* set, v1::CoordinatorService::Stub* stub, const std::string& job_id)
      : set_(set) {
    request_.set_job_id(job_id);
    stub->async()->WatchJob(&context_, &request_, this);
    StartRead(&job_);
    StartCall();
  }

  void Cancel() {
    std::lock_guard<std::mutex> l(mu_);
    if (!done_) context_.TryCancel();
  }

  void OnReadDone(bool ok) override {
    if (!ok) return;  // OnDone follows with the status
    const auto now = std::chrono::steady_clock::now();
    set_->events_.fetch_add(1);
    if (!got_first_) {
      got_first_ = true;
      set_->first_messages_.fetch_add(1);
      std::lock_guard<std::mutex> l(set_->mu_);
      set_->cv_.notify_all();
    }
    if (set_->on_job_) set_->on_job_(job_, now);
    StartRead(&job_);
  }

  void OnDone(const grpc::Status& status) override {
    {
      std::lock_guard<std::mutex> l(mu_);
      done_ = true;
    }
    set_->Ended(status,
                set_->closing_.load() && status.error_code() == grpc::StatusCode::CANCELLED);
  }

 private:
  WatchSet* const set_;
  grpc::ClientContext context_;
  v1::WatchJobRequest request_;
  v1::Job job_;
  bool got_first_ = false;  // only gRPC's serialised read callbacks touch it
  std::mutex mu_;
  bool done_ = false;
};

WatchSet::WatchSet(std::vector<v1::CoordinatorService::Stub*> stubs, JobFn on_job)
    : stubs_(std::move(stubs)), on_job_(std::move(on_job)) {}

WatchSet::~WatchSet() { Close(); }

absl::Status WatchSet::Open(const std::vector<std::string>& job_ids, int count,
                            std::chrono::milliseconds timeout) {
  const int base = static_cast<int>(streams_.size());
  for (int i = 0; i < count; ++i) {
    streams_.push_back(std::make_unique<Stream>(this, stubs_[(base + i) % stubs_.size()],
                                                job_ids[(base + i) % job_ids.size()]));
  }
  const int want = base + count;
  std::unique_lock<std::mutex> l(mu_);
  const bool opened = cv_.wait_for(
      l, timeout, [&] { return first_messages_.load() >= want || errors_.load() > 0; });
  if (errors_.load() > 0) {
    return absl::InternalError(absl::StrCat(first_messages_.load(), " of ", want,
                                            " streams opened; a stream failed: ", first_error_));
  }
  if (!opened) {
    return absl::DeadlineExceededError(absl::StrCat(first_messages_.load(), " of ", want,
                                                    " streams had their first message in ",
                                                    timeout.count(), " ms"));
  }
  return absl::OkStatus();
}

void WatchSet::Close() {
  closing_.store(true);
  for (auto& s : streams_) s->Cancel();
  const int n = static_cast<int>(streams_.size());
  std::unique_lock<std::mutex> l(mu_);
  const bool all = cv_.wait_for(l, std::chrono::seconds(30), [&] { return ended_.load() >= n; });
  l.unlock();
  // A stream not ended is leaked, not freed under gRPC's feet.
  if (all) {
    streams_.clear();
  } else {
    for (auto& s : streams_) s.release();
    streams_.clear();
  }
  ended_.store(0);
  first_messages_.store(0);
  closing_.store(false);
}

std::string WatchSet::first_error() const {
  std::lock_guard<std::mutex> l(mu_);
  return first_error_;
}

void WatchSet::Ended(const grpc::Status& status, bool cancelled_by_us) {
  std::lock_guard<std::mutex> l(mu_);
  if (!cancelled_by_us) {
    errors_.fetch_add(1);
    if (first_error_.empty()) {
      first_error_ = absl::StrCat("WatchJob: ", status.error_code(), " ", status.error_message());
    }
  }
  ended_.fetch_add(1);
  cv_.notify_all();
}

}  // namespace reshard::bench
