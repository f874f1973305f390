// Drives operations through PENDING -> PLANNED -> TRANSFERRING -> COMMITTED
// (or ABORTED / FAILED with a reason), persisting every transition before it
// takes effect, and watches host leases. Only the leader replica's driver
// runs (leader.h). Not thread-safe: one caller thread.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "cost/model.h"
#include "services/coordinator/clock.h"
#include "services/coordinator/logic/driver_hosts.h"
#include "services/coordinator/logic/lease_judge.h"
#include "services/coordinator/metrics/metrics.h"
#include "services/coordinator/store/store.h"

namespace reshard::coordinator {

/// What a driver step returns once it ended the operation (Finish): moved
/// on, or the error finishing it met. Shared by the step files.
inline absl::StatusOr<bool> Moved(const absl::Status& finished) {
  if (!finished.ok()) return finished;
  return true;
}

class OperationDriver {
 public:
  struct Options {
    int64_t transfer_timeout_ms = 30 * 60 * 1000;  // TRANSFERRING longer: ABORTED
    /// An operation none of whose hosts' tasks changed state or bytes_done
    /// this long aborts, naming its first unfinished host and what that one
    /// waits on. Counted from the later of the operation's last progress (any
    /// host's) and this driver's ResumeAll or late pass: a host that waits
    /// while its peers move is slow, not stalled (its own waits on a peer end
    /// at the agent, --peer-wait-ms).
    int64_t stall_timeout_ms = 20000;
    std::string replica_id = "coordinator";
    /// After ResumeAll (becoming leader), leases are not enforced for this
    /// long, so that agents which could not heartbeat while no coordinator
    /// was up get one lease period to do so before their hosts count as LOST.
    /// Set it to AgentApi::Options::lease_ms.
    int64_t lease_grace_ms = 10000;
    /// The leader's period between passes (LeaderLoop's tick_ms): a pass
    /// much later than that means the coordinator itself lagged. 0: passes
    /// are never late (a caller that steps a fake clock by whole seconds).
    int64_t tick_ms = 0;
    /// How long the oldest heartbeat not yet recorded has waited (the
    /// HeartbeatBatcher's LagMs); unset: none ever waits.
    std::function<int64_t()> heartbeat_lag_ms;
    /// The cost model (docs/scheduler.md; not owned, outlives this); null: operations are planned
    /// without a prediction.
    cost::CostModel* cost = nullptr;
  };

  /// `metrics` may be null.
  OperationDriver(StorePtr store, const Clock* clock, CoordinatorMetrics* metrics, Options options);

  /// Called once when this replica becomes the leader: every unfinished
  /// operation is resumed where its persisted state says, or aborted with
  /// the reason recorded when it cannot be.
  [[nodiscard]] absl::Status ResumeAll();

  /// One pass: mark hosts whose lease expired LOST (aborting the operations
  /// that need them, marking their jobs DEGRADED; leases are read at most
  /// once per tick_ms, so a pass run early by a kick skips them), then
  /// advance every active operation as far as it can go now. Refreshes the
  /// job/host gauges.
  [[nodiscard]] absl::Status Tick();

 private:
  using HostMap = DriverHosts;  // the hosts' states (driver_hosts.h)

  /// Advances every active operation; errors of one do not stop the others.
  [[nodiscard]] absl::Status AdvanceAll(HostMap& hosts, int64_t now);
  /// Moves one operation as far as it goes now, re-reading it whenever the
  /// store says it moved under us.
  [[nodiscard]] absl::Status Advance(const std::string& operation_id, HostMap& hosts,
                                     int64_t now);
  // One step per active phase (operation_steps.cc; Advance dispatches by
  // PhaseOf): true when the operation moved on, false when there is nothing
  // to do yet, Aborted when the store says it moved under us. Steps given
  // `record` with a plan get it loaded (include_plan).
  [[nodiscard]] absl::StatusOr<bool> ReleaseQueued(const OperationRecord& record, int64_t now);
  [[nodiscard]] absl::StatusOr<bool> WaitForStepBoundary(const OperationRecord& record,
                                                         int64_t now);
  [[nodiscard]] absl::StatusOr<bool> PlanOperation(const OperationRecord& record, int64_t now);
  [[nodiscard]] absl::StatusOr<bool> StartTransfer(const OperationRecord& record,
                                                   HostMap& hosts, int64_t now);
  [[nodiscard]] absl::StatusOr<bool> AwaitCutOver(const OperationRecord& record,
                                                  HostMap& hosts, int64_t now);
  [[nodiscard]] absl::StatusOr<bool> CheckTransfer(const OperationRecord& record,
                                                   HostMap& hosts, int64_t now);
  // A stop-free operation's agents prepare (prepare_steps.cc; docs/
  // coordinator.md, "Agents prepare"): the prepare phase's start and watch,
  // and the transfer after the cut-over without the unchanged steps.
  [[nodiscard]] absl::StatusOr<bool> StartPrepare(const OperationRecord& record,
                                                  HostMap& hosts, int64_t now);
  [[nodiscard]] absl::StatusOr<bool> CheckPrepare(const OperationRecord& record,
                                                  HostMap& hosts, int64_t now);
  [[nodiscard]] absl::StatusOr<bool> StartPreparedTransfer(const OperationRecord& record,
                                                           HostMap& hosts, int64_t now);
  /// Why the hosts' rows of an operation abort it, if they do: a FAILED
  /// host, a lost one, or an unfinished one (not DONE; not PREPARED when
  /// `preparing`) without progress for stall_timeout_ms.
  [[nodiscard]] absl::StatusOr<std::optional<std::string>> HostTrouble(
      const std::vector<HostProgress>& rows, HostMap& hosts, int64_t now, bool preparing) const;
  /// The hosts of `bytes` as ASSIGNED rows; sets `no_agent` (the abort's
  /// reason) when one has no live agent.
  [[nodiscard]] static absl::StatusOr<std::vector<HostProgress>> AssignedRows(
      const std::map<std::string, int64_t>& bytes, HostMap& hosts, int64_t now,
      std::string* no_agent);
  /// Moves the operation from its state to a final one with `error` (empty
  /// for COMMITTED) and records the metrics.
  [[nodiscard]] absl::Status Finish(const v1::Operation& op, v1::OperationState to,
                                    const std::string& error, int64_t now);
  /// Jobs whose current generation uses `lost_hosts` and that no operation
  /// holds become DEGRADED (unless their hosts came back meanwhile).
  [[nodiscard]] absl::Status DegradeJobsOn(const std::set<std::string>& lost_hosts);
  void RefreshGauges(int64_t now);
  /// Marks the hosts whose lease ended LOST, unless the judge defers them
  /// (a mass expiry); updates `hosts` to match.
  [[nodiscard]] absl::Status JudgeLeases(int64_t now);
  /// Logs and exports a change of whether (and why) judgement is suspended.
  void NoteSuspension(const LeaseJudge::Verdict& verdict);

  StorePtr store_;
  const Clock* clock_;
  CoordinatorMetrics* metrics_;
  Options options_;
  int64_t leases_enforced_from_ms_ = 0;
  LeaseJudge judge_;
  LeaseJudge::Reason suspended_ = LeaseJudge::Reason::kNone;
  bool judging_stalls_ = true;  // false during a pass the judge suspended
  int64_t resumed_at_ms_ = 0;  // stalls are counted from here at the earliest
  // Lost hosts whose jobs are still to be marked DEGRADED (retried each
  // Tick until the store accepts it).
  std::set<std::string> hosts_to_degrade_;
  int64_t gauges_refreshed_ms_ = 0;
  int64_t leases_read_ms_ = 0;  // the last pass that judged leases
  HostMap hosts_;
};

}  // namespace reshard::coordinator
