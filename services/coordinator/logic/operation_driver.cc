// The driver's loop: leases, resuming, dispatching each operation by its
// phase (store/operation_machine.h) to that phase's step
// (operation_steps.cc, prepare_steps.cc), final states and gauges.
#include "services/coordinator/logic/operation_driver.h"

#include <algorithm>
#include <map>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/log.h"
#include "common/rpc/enum_name.h"
#include "services/coordinator/logic/deadlines.h"
#include "services/coordinator/logic/operation_finish.h"
#include "services/coordinator/logic/operation_states.h"

namespace reshard::coordinator {
namespace {

// Each lost race means another party (a cancel, another driver) moved the
// operation; after a few re-reads it is final or ours again.
constexpr int kAdvanceAttempts = 8;

// Prometheus scrapes every few seconds; counting jobs every tick would only
// load the database.
constexpr int64_t kGaugePeriodMs = 1000;
// Every host's state is read at most this often (driver_hosts.h): with the
// gauges' period, since they count every host.
constexpr int64_t kHostsRefreshMs = kGaugePeriodMs;

}  // namespace

OperationDriver::OperationDriver(StorePtr store, const Clock* clock, CoordinatorMetrics* metrics,
                                 Options options)
    : store_(std::move(store)),
      clock_(clock),
      metrics_(metrics),
      options_(std::move(options)),
      judge_(LeaseJudge::Options{options_.lease_grace_ms, options_.tick_ms}),
      hosts_(store_.get(), kHostsRefreshMs) {}

absl::Status OperationDriver::ResumeAll() {
  const int64_t now = clock_->NowUnixMs();
  leases_enforced_from_ms_ = now + options_.lease_grace_ms;
  resumed_at_ms_ = now;
  judge_.Reset(now);
  absl::StatusOr<std::vector<std::string>> active = store_->ListActiveOperations();
  if (!active.ok()) return active.status();
  RESHARD_LOG(INFO) << "replica=" << options_.replica_id << " leading: resuming " << active->size()
                    << " active operations; leases enforced after " << options_.lease_grace_ms
                    << " ms";
  for (const std::string& id : *active) {
    absl::StatusOr<OperationRecord> record = store_->GetOperation(id, /*include_plan=*/false);
    if (!record.ok()) continue;  // finished or deleted since the listing
    RESHARD_LOG(INFO) << "job=" << record->op.job_id() << " operation=" << id << " resumed in "
                      << rpc::EnumShortName(record->op.state());
  }
  if (absl::Status s = hosts_.Refresh(now, /*force=*/true); !s.ok()) return s;
  return AdvanceAll(hosts_, now);
}

absl::Status OperationDriver::Tick() {
  const int64_t now = clock_->NowUnixMs();
  const LeaseJudge::Verdict pass =
      judge_.BeginPass(now, options_.heartbeat_lag_ms ? options_.heartbeat_lag_ms() : 0);
  // Progress reports queued while this process did not run: stall clocks
  // restart rather than count that time against the hosts.
  if (judge_.last_pass_was_late()) resumed_at_ms_ = std::max(resumed_at_ms_, now);
  judging_stalls_ = pass.judge;
  if (absl::Status s = hosts_.Refresh(now, /*force=*/false); !s.ok()) return s;
  // Leases are read once per period: a kick (an agent's final report, a new
  // operation) runs a pass at once to advance operations, not to re-read
  // every host's lease.
  const bool leases_due = options_.tick_ms <= 0 || now - leases_read_ms_ >= options_.tick_ms;
  if (!pass.judge) {
    NoteSuspension(pass);
  } else if (!leases_due) {
    // judged a moment ago
  } else if (now >= leases_enforced_from_ms_) {
    leases_read_ms_ = now;
    if (absl::Status s = JudgeLeases(now); !s.ok()) return s;
  } else {
    NoteSuspension(LeaseJudge::Verdict{});
  }
  // Operations first: aborting one returns its job to DEGRADED in the same
  // transaction, and only jobs left ACTIVE need marking afterwards.
  absl::Status advanced = AdvanceAll(hosts_, now);
  if (!hosts_to_degrade_.empty()) {
    absl::Status degraded = DegradeJobsOn(hosts_to_degrade_);
    if (degraded.ok()) {
      hosts_to_degrade_.clear();
    } else if (advanced.ok()) {
      advanced = degraded;
    }
  }
  RefreshGauges(now);
  return advanced;
}

absl::Status OperationDriver::JudgeLeases(int64_t now) {
  absl::StatusOr<std::vector<std::string>> ended = store_->ExpiredLeases(now);
  if (!ended.ok()) return ended.status();
  if (ended->empty()) {
    NoteSuspension(judge_.Expiries(now, 0, 0));
    return absl::OkStatus();
  }
  // The mass-expiry rule weighs them against the hosts ALIVE now.
  if (absl::Status s = hosts_.Refresh(now, /*force=*/true); !s.ok()) return s;
  const LeaseJudge::Verdict verdict =
      judge_.Expiries(now, static_cast<int64_t>(ended->size()), hosts_.alive());
  NoteSuspension(verdict);
  if (!verdict.judge) {
    judging_stalls_ = false;  // the same doubt: their reports may not arrive either
    return absl::OkStatus();
  }
  if (verdict.reason == LeaseJudge::Reason::kMassExpiry) RESHARD_LOG(WARNING) << verdict.why;
  absl::StatusOr<std::vector<std::string>> expired = store_->ExpireLeases(now);
  if (!expired.ok()) return expired.status();
  for (const std::string& host : *expired) {
    RESHARD_LOG(WARNING) << "host=" << host << " lease expired: marked LOST";
    hosts_to_degrade_.insert(host);
    hosts_.MarkLost(host);
  }
  return absl::OkStatus();
}

void OperationDriver::NoteSuspension(const LeaseJudge::Verdict& verdict) {
  const LeaseJudge::Reason now_reason = verdict.judge ? LeaseJudge::Reason::kNone : verdict.reason;
  if (!verdict.judge) {
    // Every suspended pass counts; the log says only when it starts or
    // changes reason, and when it ends.
    if (metrics_ != nullptr) metrics_->LeaseJudgementSuspended(LeaseJudge::Label(now_reason));
    if (now_reason != suspended_) {
      RESHARD_LOG(WARNING) << "replica=" << options_.replica_id
                           << " leases and stalls not judged: " << verdict.why;
    }
  } else if (suspended_ != LeaseJudge::Reason::kNone) {
    if (metrics_ != nullptr) metrics_->LeaseJudgementSuspended("");
    RESHARD_LOG(INFO) << "replica=" << options_.replica_id
                      << " leases and stalls judged again (suspended for "
                      << LeaseJudge::Label(suspended_) << ")";
  }
  suspended_ = now_reason;
}

absl::Status OperationDriver::AdvanceAll(HostMap& hosts, int64_t now) {
  absl::StatusOr<std::vector<std::string>> active = store_->ListActiveOperations();
  if (!active.ok()) return active.status();
  absl::Status first_error;
  for (const std::string& id : *active) {
    absl::Status s = Advance(id, hosts, now);
    if (!s.ok()) {
      RESHARD_LOG(WARNING) << "operation=" << id << " not advanced: " << s;
      if (first_error.ok()) first_error = s;
    }
  }
  return first_error;
}

absl::Status OperationDriver::Advance(const std::string& operation_id, HostMap& hosts,
                                      int64_t now) {
  std::optional<OpPhase> moved_from;
  for (int attempt = 0; attempt < kAdvanceAttempts; ++attempt) {
    absl::StatusOr<OperationRecord> record =
        store_->GetOperation(operation_id, /*include_plan=*/false);
    if (absl::IsNotFound(record.status())) return absl::OkStatus();  // job deleted
    if (!record.ok()) return record.status();
    const OpPhase phase = PhaseOf(record->op);
    // Whoever moved it since (this driver's step, a cancel, a checkpoint),
    // it only moves forward along the table.
    if (moved_from.has_value() && !PathExists(*moved_from, phase)) {
      return absl::InternalError(absl::StrCat(
          "operation \"", operation_id, "\" moved from ", PhaseName(*moved_from), " to ",
          PhaseName(phase), ", which the operation state machine has no path for"));
    }
    moved_from = phase;
    // Past a deadline that asked for it, whatever the phase (deadlines.h).
    if (std::optional<std::string> why = DeadlineAbort(record->op, now); why.has_value()) {
      absl::Status ended = Finish(record->op, v1::OPERATION_STATE_ABORTED, *why, now);
      if (absl::IsAborted(ended)) continue;  // moved under us: look again
      return ended;
    }
    absl::StatusOr<bool> moved;
    switch (phase) {
      case OpPhase::kQueued:
        moved = ReleaseQueued(*record, now);
        break;
      case OpPhase::kAtStepBoundary:
        moved = WaitForStepBoundary(*record, now);
        break;
      case OpPhase::kPending:
        moved = PlanOperation(*record, now);
        break;
      case OpPhase::kPlanned:
      case OpPhase::kToPrepare:
      case OpPhase::kCuttingOver:
      case OpPhase::kLegacyCuttingOver: {
        // Only these steps need the (possibly large) plan.
        absl::StatusOr<OperationRecord> with_plan =
            store_->GetOperation(operation_id, /*include_plan=*/true);
        if (!with_plan.ok()) return with_plan.status();
        if (PhaseOf(with_plan->op) != phase) continue;
        if (!with_plan->plan.has_value()) {
          moved = Moved(Finish(with_plan->op, v1::OPERATION_STATE_FAILED,
                               "PLANNED without a stored plan", now));
        } else if (phase == OpPhase::kPlanned) {
          moved = StartTransfer(*with_plan, hosts, now);
        } else if (phase == OpPhase::kToPrepare) {
          moved = StartPrepare(*with_plan, hosts, now);
        } else {
          moved = AwaitCutOver(*with_plan, hosts, now);
        }
        break;
      }
      case OpPhase::kPreparing:
      case OpPhase::kPrepared:
        moved = CheckPrepare(*record, hosts, now);
        break;
      case OpPhase::kLegacyPrepared:
        return absl::OkStatus();  // waits for its cut-over checkpoint
      case OpPhase::kTransferring:
      case OpPhase::kPreparedTransfer:
        moved = CheckTransfer(*record, hosts, now);
        break;
      case OpPhase::kCommitted:
      case OpPhase::kAborted:
      case OpPhase::kFailed:
        return absl::OkStatus();  // terminal: nothing left to do
    }
    if (absl::IsAborted(moved.status())) continue;  // moved under us: look again
    if (!moved.ok()) return moved.status();
    if (!*moved) return absl::OkStatus();  // waiting (for agents)
    // Moved on: the next step may be possible in the same pass.
  }
  return absl::AbortedError(absl::StrCat("operation \"", operation_id, "\" kept changing during ",
                                         kAdvanceAttempts, " attempts to advance it"));
}

absl::Status OperationDriver::Finish(const v1::Operation& op, v1::OperationState to,
                                     const std::string& error, int64_t now) {
  OperationEnding ending;
  ending.event = to == v1::OPERATION_STATE_COMMITTED ? OpEvent::kCommitted
                 : to == v1::OPERATION_STATE_FAILED  ? OpEvent::kFailed
                                                     : OpEvent::kAborted;
  ending.error = error;
  return FinishOperation(*store_, metrics_, op, ending, now, options_.cost);
}

absl::Status OperationDriver::DegradeJobsOn(const std::set<std::string>& lost_hosts) {
  absl::StatusOr<std::vector<std::string>> jobs =
      store_->JobsOnHosts({lost_hosts.begin(), lost_hosts.end()});
  if (!jobs.ok()) return jobs.status();
  for (const std::string& job_id : *jobs) {
    // A RECONFIGURING job is settled when its operation ends: the store
    // makes it DEGRADED on an abort while its hosts are lost, and a commit
    // cannot include a lost host (every host taking part must be DONE). A
    // host that registered again with the job's shards intact since is no
    // longer lost: the job stays ACTIVE.
    absl::StatusOr<v1::JobState> state = store_->SettleJobLiveness(job_id);
    if (absl::IsNotFound(state.status())) continue;
    if (!state.ok()) return state.status();
    if (*state == v1::JOB_STATE_DEGRADED) {
      RESHARD_LOG(WARNING) << "job=" << job_id << " DEGRADED: hosts of its current generation"
                           << " are lost";
    }
  }
  return absl::OkStatus();
}

void OperationDriver::RefreshGauges(int64_t now) {
  if (metrics_ == nullptr) return;
  if (gauges_refreshed_ms_ != 0 && now - gauges_refreshed_ms_ < kGaugePeriodMs) return;
  absl::StatusOr<std::vector<std::pair<v1::JobState, int64_t>>> counts = store_->CountJobsByState();
  if (!counts.ok()) {
    RESHARD_LOG(WARNING) << "job gauges not refreshed: " << counts.status();
    return;
  }
  std::map<v1::JobState, int64_t> by_state = {{v1::JOB_STATE_ACTIVE, 0},
                                              {v1::JOB_STATE_RECONFIGURING, 0},
                                              {v1::JOB_STATE_DEGRADED, 0},
                                              {v1::JOB_STATE_FAILED, 0}};
  for (const auto& [state, count] : *counts) by_state[state] = count;
  for (const auto& [state, count] : by_state) metrics_->SetJobs(state, count);

  std::map<v1::HostState, int64_t> host_counts = {{v1::HOST_STATE_ALIVE, 0},
                                                  {v1::HOST_STATE_LOST, 0}};
  std::vector<std::string> lost;
  for (const auto& [id, state] : hosts_.all()) {
    ++host_counts[state];
    if (state == v1::HOST_STATE_LOST) lost.push_back(id);
  }
  for (const auto& [state, count] : host_counts) metrics_->SetHosts(state, count);
  int64_t degraded = 0;
  if (!lost.empty()) {
    absl::StatusOr<std::vector<std::string>> jobs = store_->JobsOnHosts(lost);
    if (!jobs.ok()) {
      RESHARD_LOG(WARNING) << "lost-host gauge not refreshed: " << jobs.status();
      return;
    }
    degraded = static_cast<int64_t>(jobs->size());
  }
  metrics_->SetJobsWithLostHosts(degraded);

  // Unfinished operations (at most one per job) by state, and the oldest's age.
  absl::StatusOr<std::vector<std::string>> active = store_->ListActiveOperations();
  if (!active.ok()) {
    RESHARD_LOG(WARNING) << "operation gauges not refreshed: " << active.status();
    return;
  }
  std::map<v1::OperationState, int64_t> op_counts;
  for (int s = v1::OperationState_MIN; s <= v1::OperationState_MAX; ++s) {
    const auto state = static_cast<v1::OperationState>(s);
    if (IsActiveState(state)) op_counts[state] = 0;
  }
  int64_t oldest_created_ms = now;
  for (const std::string& id : *active) {
    absl::StatusOr<OperationRecord> record = store_->GetOperation(id, /*include_plan=*/false);
    if (!record.ok()) continue;  // finished or deleted since the listing
    auto it = op_counts.find(record->op.state());
    if (it == op_counts.end()) continue;
    ++it->second;
    oldest_created_ms = std::min(oldest_created_ms, record->op.created_unix_ms());
  }
  for (const auto& [state, count] : op_counts) metrics_->SetActiveOperations(state, count);
  metrics_->SetOldestActiveOperationSeconds(static_cast<double>(now - oldest_created_ms) / 1000.0);
  gauges_refreshed_ms_ = now;
}

}  // namespace reshard::coordinator
