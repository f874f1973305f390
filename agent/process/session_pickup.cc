// CoordinatorSession's pick-up of operations (coordinator_session.h): the
// one path from a list of assigned operations (a heartbeat's or the long
// poll's) to running them, prepared operations held between their two
// phases (docs/agent.md, "Two phases"), and the WaitForTasks long poll,
// kept open from registration on (docs/agent.md, "Told of tasks").
#include <algorithm>
#include <chrono>
#include <utility>

#include "absl/random/random.h"
#include "absl/time/time.h"
#include "agent/process/coordinator_session.h"
#include "common/log.h"
#include "common/rpc/retry.h"
#include "common/rpc/status.h"

namespace reshard::agent {
namespace {

// WaitForTasks: how long the coordinator may hold one call, the deadline's
// margin beyond it, and the least time between two calls that started
// nothing. The wait after a failed call is the agent's backoff
// (common/rpc/retry.h, kAgentCall).
constexpr int kPollWaitMs = 10000;
constexpr int kPollDeadlineMarginMs = 5000;
constexpr int kPollMinIntervalMs = 50;

}  // namespace

void CoordinatorSession::ForgetPreparedLocked(const std::string& job_id, int64_t generation) {
  for (auto it = prepared_.begin(); it != prepared_.end();) {
    if (it->second.job_id != job_id ||
        (generation != 0 && it->second.to_generation != generation)) {
      ++it;
      continue;
    }
    RESHARD_LOG(INFO) << "operation " << it->first << " job " << job_id << ": prepared generation "
                      << it->second.to_generation << " is discarded; the operation is over here";
    finished_.insert(it->first);
    it = prepared_.erase(it);
  }
}

int CoordinatorSession::StartAssigned(const google::protobuf::RepeatedPtrField<std::string>& ids,
                                      uint64_t listed_at) {
  ReapFinished();
  std::lock_guard<std::mutex> l(mu_);
  if (stopping_.load()) return 0;
  last_assigned_ = std::set<std::string>(ids.begin(), ids.end());
  int started = 0;
  for (const std::string& id : ids) {
    if (ops_.count(id) != 0 || finished_.count(id) != 0) continue;
    auto held = prepared_.find(id);
    if (held != prepared_.end()) {
      // A list fetched before the coordinator took the PREPARED report still
      // shows the prepare's row; only a later one means the transfer phase.
      if (listed_at < held->second.acked_at) continue;
      RESHARD_LOG(INFO) << "operation " << id << ": assigned again after its prepare";
      prepared_.erase(held);
    }
    auto op = std::make_unique<RunningOp>();
    RunningOp* raw = op.get();
    ops_[id] = std::move(op);
    raw->thread = std::thread([this, id, raw] { RunOperation(id, raw); });
    ++started;
  }
  return started;
}

int64_t CoordinatorSession::AwaitPublishAccepted(const std::string& job_id, int64_t generation,
                                                 int rank, int timeout_ms) {
  const auto deadline =
      std::chrono::steady_clock::now() + std::chrono::milliseconds(std::max(timeout_ms, 0));
  std::unique_lock<std::mutex> l(mu_);
  for (;;) {
    if (const int64_t from = AcceptsPublishLocked(job_id, generation, rank); from > 0) return from;
    if (stopping_.load() || std::chrono::steady_clock::now() >= deadline) return 0;
    // A task started here whose GetTask has not answered may be the
    // checkpoint's: wait for it (RunOperation notifies) before asking again.
    const bool task_pending = std::any_of(ops_.begin(), ops_.end(), [](const auto& entry) {
      return !entry.second->task_fetched && !entry.second->finished.load();
    });
    if (task_pending || pickup_in_flight_ || poll_unimplemented_) {
      cv_.wait_until(l, deadline);
      continue;
    }
    pickup_in_flight_ = true;
    l.unlock();
    const auto sent = std::chrono::steady_clock::now();
    const int started = PickUpNow(deadline);
    l.lock();
    pickup_in_flight_ = false;
    cv_.notify_all();
    // Nothing new and answered at once: do not spin on the coordinator.
    if (started == 0 && std::chrono::steady_clock::now() - sent <
                            std::chrono::milliseconds(kPollMinIntervalMs)) {
      cv_.wait_for(l, std::chrono::milliseconds(kPollMinIntervalMs));
    }
  }
}

int CoordinatorSession::PickUpNow(std::chrono::steady_clock::time_point deadline) {
  v1::WaitForTasksRequest req;
  v1::WaitForTasksResponse resp;
  grpc::ClientContext ctx;
  uint64_t listed_at = 0;
  const auto now = std::chrono::steady_clock::now();
  const int wait_ms = static_cast<int>(std::clamp<int64_t>(
      std::chrono::duration_cast<std::chrono::milliseconds>(deadline - now).count(), 1,
      kPollWaitMs));
  {
    std::lock_guard<std::mutex> l(mu_);
    if (stopping_.load()) return 0;
    req.set_host_id(options_.host_id);
    req.set_wait_ms(wait_ms);
    // What runs or is held here, and what ran and is still listed: the
    // coordinator answers as soon as another operation (the checkpoint) is
    // assigned here.
    for (const auto& [id, op] : ops_) req.add_known_operations(id);
    for (const auto& [id, held] : prepared_) req.add_known_operations(id);
    for (const std::string& id : last_assigned_) {
      if (finished_.count(id) != 0 && ops_.count(id) == 0) req.add_known_operations(id);
    }
    listed_at = list_clock_;
    ctx.set_deadline(std::chrono::system_clock::now() +
                     std::chrono::milliseconds(wait_ms + kPollDeadlineMarginMs));
    pickup_ctx_ = &ctx;  // Stop() cancels it
  }
  const auto sent = std::chrono::steady_clock::now();
  const absl::Status s = rpc::FromGrpc(stub_->WaitForTasks(&ctx, req, &resp));
  NoteReach(s, sent);
  {
    std::lock_guard<std::mutex> l(mu_);
    pickup_ctx_ = nullptr;
  }
  if (stopping_.load()) return 0;
  if (!s.ok()) {
    RESHARD_LOG(WARNING) << "host " << options_.host_id
                         << ": WaitForTasks for a worker's publish: " << s;
    if (absl::IsUnimplemented(s)) {
      std::lock_guard<std::mutex> l(mu_);
      poll_unimplemented_ = true;
    }
    return 0;
  }
  return StartAssigned(resp.assigned_operations(), listed_at);
}

void CoordinatorSession::PollLoop() {
  const std::string& host = options_.host_id;
  int failures = 0;  // failed calls in a row
  absl::BitGen rng;
  for (;;) {
    v1::WaitForTasksRequest req;
    v1::WaitForTasksResponse resp;
    grpc::ClientContext ctx;
    uint64_t listed_at = 0;
    {
      std::unique_lock<std::mutex> l(mu_);
      // Open from registration on (docs/agent.md, "Told of tasks"): a new
      // task starts as soon as the coordinator creates it, not at the next
      // heartbeat.
      cv_.wait(l, [this] {
        return stopping_.load() || (epoch_.load() > 0 && !poll_unimplemented_);
      });
      if (stopping_.load()) return;
      req.set_host_id(host);
      req.set_wait_ms(kPollWaitMs);
      // What runs here, and what ran and is still listed: the coordinator
      // answers at once when anything else is assigned. Never a held
      // operation, even while its PREPARED report is out or its prepare's
      // thread is not reaped yet: its transfer phase must wake the poll.
      for (const auto& [id, op] : ops_) {
        if (prepared_.count(id) == 0 && !op->reporting_prepared.load()) {
          req.add_known_operations(id);
        }
      }
      for (const std::string& id : last_assigned_) {
        if (finished_.count(id) != 0 && ops_.count(id) == 0) req.add_known_operations(id);
      }
      listed_at = list_clock_;
      ctx.set_deadline(std::chrono::system_clock::now() +
                       std::chrono::milliseconds(kPollWaitMs + kPollDeadlineMarginMs));
      poll_ctx_ = &ctx;
    }
    const auto sent = std::chrono::steady_clock::now();
    const absl::Status s = rpc::FromGrpc(stub_->WaitForTasks(&ctx, req, &resp));
    NoteReach(s, sent);
    bool repoll = false;
    {
      std::lock_guard<std::mutex> l(mu_);
      poll_ctx_ = nullptr;
      repoll = std::exchange(repoll_, false);
    }
    if (stopping_.load()) return;
    if (!s.ok() && repoll) continue;  // cancelled by RunOperation: ask afresh
    if (s.ok()) {
      failures = 0;
      const int started = StartAssigned(resp.assigned_operations(), listed_at);
      if (started == 0 &&
          std::chrono::steady_clock::now() - sent < std::chrono::milliseconds(kPollMinIntervalMs)) {
        if (!Sleep(kPollMinIntervalMs)) return;
      }
    } else if (absl::IsUnimplemented(s)) {
      RESHARD_LOG(WARNING) << "host " << host << ": the coordinator has no WaitForTasks (" << s
                           << "); new operations wait for heartbeats";
      std::lock_guard<std::mutex> l(mu_);
      poll_unimplemented_ = true;
    } else {
      const int wait_ms = static_cast<int>(absl::ToInt64Milliseconds(
          rpc::Backoff(rpc::DefaultPolicy(rpc::CallKind::kAgentCall), ++failures, rng)));
      RESHARD_LOG(WARNING) << "host " << host << ": WaitForTasks: " << s << "; retrying in "
                           << wait_ms << " ms";
      if (!Sleep(wait_ms)) return;
    }
  }
}

}  // namespace reshard::agent
