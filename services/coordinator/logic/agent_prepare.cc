// AgentApi's part in a stop-free operation's prepare (docs/coordinator.md,
// "Agents prepare"): the two task phases, PREPARED reports with the
// checksums of the sources read, the driver's wake-up on a final report,
// and the WaitForTasks long poll.
#include <algorithm>
#include <chrono>
#include <map>
#include <set>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/log.h"
#include "common/rpc/enum_name.h"
#include "services/coordinator/logic/agent_api.h"
#include "services/coordinator/logic/error_text.h"
#include "services/coordinator/logic/operation_states.h"
#include "services/coordinator/logic/prepared_steps.h"
#include "services/coordinator/logic/request_checks.h"
#include "services/coordinator/logic/task.h"

namespace reshard::coordinator {
namespace {

// How often a WaitForTasks sleeping on the notifier asks whether its call
// was cancelled (the synchronous gRPC API has no cancellation callback).
constexpr int kCancelCheckMs = 100;

v1::WaitForTasksResponse Answer(std::vector<std::string> assigned) {
  v1::WaitForTasksResponse response;
  for (std::string& id : assigned) response.add_assigned_operations(std::move(id));
  return response;
}

}  // namespace

void AgentApi::ShapePreparedTask(const OperationRecord& record, const std::string& host_id,
                                 v1::HostTask* task) {
  const v1::Operation& op = record.op;
  if (InPreparePhase(op)) {
    // The pre-copy: from the generation current when it was planned, the
    // whole slice, into the buffers of the final generation.
    task->set_prepare(true);
    task->set_from_generation(op.prepared_from_generation());
  } else if (IsPreparedTransfer(op)) {
    // From the cut-over checkpoint's generation: only what changed since.
    task->set_prepared(true);
    const std::set<int64_t> skipped(record.skipped_steps.begin(), record.skipped_steps.end());
    *task->mutable_plan() = WithoutSkipped(SliceForHost(*record.plan, host_id), skipped);
  }
}

absl::Status AgentApi::CheckReportForPhase(const OperationRecord& record,
                                           const v1::ReportProgressRequest& request) {
  const v1::HostTaskState state = request.state();
  const bool preparing = InPreparePhase(record.op);
  if (preparing && state == v1::HOST_TASK_STATE_DONE) {
    return absl::InvalidArgumentError(
        absl::StrCat("state DONE: operation \"", record.op.id(),
                     "\" is in its prepare phase (HostTask.prepare); report PREPARED"));
  }
  if (!preparing && state == v1::HOST_TASK_STATE_PREPARED) {
    return absl::InvalidArgumentError(absl::StrCat(
        "state PREPARED: operation \"", record.op.id(), "\" is ",
        rpc::EnumShortName(record.op.state()), ", not a stop-free operation in its prepare phase"));
  }
  if (state != v1::HOST_TASK_STATE_PREPARED && request.source_checksums_size() > 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("source_checksums: ", request.source_checksums_size(), " given with state ",
                     rpc::EnumShortName(state), "; only a PREPARED report carries them"));
  }
  if (state != v1::HOST_TASK_STATE_PREPARED) return absl::OkStatus();
  if (!record.plan.has_value()) {
    return absl::InternalError(
        absl::StrCat("operation \"", record.op.id(), "\" has no stored plan"));
  }
  // The sealed checksums of old shards it read: each a source shard the plan
  // reads on that host, once.
  const std::set<std::pair<int, int>> read = ShardsReadOnHost(*record.plan, request.host_id());
  return CheckShardChecksums("source_checksums", request.source_checksums(), read,
                             absl::StrCat(" is not a source shard the plan reads on host \"",
                                          request.host_id(), "\" (", read.size(), " shards)"));
}

absl::StatusOr<bool> AgentApi::RecordPrepared(const OperationRecord& record,
                                              const v1::ReportProgressRequest& request) {
  const std::vector<v1::ShardChecksum> sources(request.source_checksums().begin(),
                                               request.source_checksums().end());
  absl::Status recorded =
      store_->RecordHostPrepared(record.op.id(), request.host_id(), clock_->NowUnixMs(), sources);
  if (absl::IsFailedPrecondition(recorded)) {
    // It left its prepare phase since we looked, or the host FAILED before.
    absl::StatusOr<OperationRecord> now = store_->GetOperation(record.op.id(), false);
    if (now.ok() && !InPreparePhase(now->op)) return true;
    return recorded;
  }
  if (!recorded.ok()) return recorded;
  RESHARD_LOG(INFO) << "job=" << record.op.job_id() << " operation=" << record.op.id()
                    << " host=" << request.host_id() << " reported PREPARED with " << sources.size()
                    << " source checksums";
  return false;
}

void AgentApi::FinalReported() const {
  if (options_.on_final_report) options_.on_final_report();
}

absl::StatusOr<v1::WaitForTasksResponse> AgentApi::WaitForTasks(
    const v1::WaitForTasksRequest& request, const std::function<bool()>& cancelled) {
  const std::string& host_id = request.host_id();
  absl::StatusOr<int> checked = CheckWaitForTasks(request);
  if (!checked.ok()) return checked.status();
  const int wait_ms = *checked;
  const std::set<std::string> known(request.known_operations().begin(),
                                    request.known_operations().end());
  using Clock = std::chrono::steady_clock;
  const auto deadline = Clock::now() + std::chrono::milliseconds(wait_ms);
  TaskNotifier* notifier = options_.notifier;
  for (;;) {
    // The version before the read: a change committed after it wakes the wait.
    const uint64_t seen = notifier != nullptr ? notifier->Version(host_id) : 0;
    absl::StatusOr<std::vector<std::string>> assigned = store_->AssignedOperations(host_id);
    if (!assigned.ok()) return assigned.status();
    const bool news = std::any_of(assigned->begin(), assigned->end(),
                                  [&](const std::string& id) { return known.count(id) == 0; });
    auto now = Clock::now();
    if (news || now >= deadline || (cancelled && cancelled())) {
      return Answer(*std::move(assigned));
    }
    if (notifier == nullptr) {
      // Server-side polling of the store: the answer's latency is one period.
      std::this_thread::sleep_for(std::min<Clock::duration>(
          std::chrono::milliseconds(options_.wait_poll_ms), deadline - now));
      continue;
    }
    // Sleep until the host's tasks change; re-read anyway after
    // safety_reread_ms (a lost notification) or at the deadline.
    const auto reread =
        std::min(deadline, now + std::chrono::milliseconds(options_.safety_reread_ms));
    bool stop = false;
    while (now < reread) {
      const TaskNotifier::Wake wake = notifier->WaitChanged(
          host_id, seen, std::min(reread, now + std::chrono::milliseconds(kCancelCheckMs)));
      if (wake == TaskNotifier::Wake::kChanged) break;
      // Shutting down or cancelled: answer with the list as it is.
      if (wake == TaskNotifier::Wake::kShutDown || (cancelled && cancelled())) {
        stop = true;
        break;
      }
      now = Clock::now();
    }
    if (stop) {
      return Answer(*std::move(assigned));
    }
  }
}

absl::StatusOr<int> AgentApi::CheckWaitForTasks(const v1::WaitForTasksRequest& request) {
  const std::string& host_id = request.host_id();
  if (absl::Status s = RequireNonEmpty("host_id", host_id); !s.ok()) return s;
  if (request.wait_ms() < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "wait_ms is ", request.wait_ms(), "; it must be >= 0 (0: ", kMaxTaskWaitMs, " ms)"));
  }
  if (absl::Status s = RequireRegistered(host_id); !s.ok()) return s;
  return request.wait_ms() == 0 ? kMaxTaskWaitMs : std::min(request.wait_ms(), kMaxTaskWaitMs);
}

absl::Status AgentApi::RequireRegistered(const std::string& host_id) {
  {
    std::lock_guard<std::mutex> l(known_mu_);
    if (known_hosts_.count(host_id) > 0) return absl::OkStatus();
  }
  absl::StatusOr<v1::Host> host = store_->GetHost(host_id);
  if (!host.ok()) return NameNotFound(host.status(), HostNotFound(host_id));
  std::lock_guard<std::mutex> l(known_mu_);
  known_hosts_.insert(host_id);
  return absl::OkStatus();
}

absl::StatusOr<std::map<std::string, std::vector<std::string>>>
AgentApi::AssignedOperationsOfHosts(const std::vector<std::string>& host_ids) {
  return store_->AssignedOperationsOfHosts(host_ids);
}

}  // namespace reshard::coordinator
