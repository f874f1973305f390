// The driver's steps for a stop-free operation's agents (docs/
// coordinator.md, "Agents prepare"): start the prepare of a PLANNED one,
// watch its hosts until the cut-over, then start the transfer without the
// steps whose source shard did not change since the prepare.
#include <set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/log.h"
#include "services/coordinator/logic/operation_driver.h"
#include "services/coordinator/logic/operation_states.h"
#include "services/coordinator/logic/prepared_steps.h"
#include "services/coordinator/logic/task.h"

namespace reshard::coordinator {
absl::StatusOr<bool> OperationDriver::StartPrepare(const OperationRecord& record,
                                                   HostMap& hosts, int64_t now) {
  const v1::Operation& op = record.op;
  if (!record.plan.has_value()) {
    return Moved(Finish(op, v1::OPERATION_STATE_FAILED, "PLANNED without a stored plan", now));
  }
  std::string no_agent;
  absl::StatusOr<std::vector<HostProgress>> rows =
      AssignedRows(BytesWrittenByHost(*record.plan), hosts, now, &no_agent);
  if (!rows.ok()) return rows.status();
  if (!no_agent.empty()) return Moved(Finish(op, v1::OPERATION_STATE_ABORTED, no_agent, now));
  // The operation was planned from the current generation (PlanOperation).
  if (absl::Status s = store_->StartPrepare(op.id(), op.from_generation(), *rows); !s.ok()) {
    return s;
  }
  RESHARD_LOG(INFO) << "job=" << op.job_id() << " operation=" << op.id()
                    << " PLANNED: agents prepare generation " << op.to_generation() << " from "
                    << op.from_generation() << " on " << rows->size() << " hosts";
  // Moved on: the next pass watches the rows.
  return true;
}

absl::StatusOr<bool> OperationDriver::CheckPrepare(const OperationRecord& record,
                                                   HostMap& hosts, int64_t now) {
  const v1::Operation& op = record.op;
  absl::StatusOr<std::vector<HostProgress>> rows = store_->GetHostProgress(op.id());
  if (!rows.ok()) return rows.status();
  absl::StatusOr<std::optional<std::string>> trouble =
      HostTrouble(*rows, hosts, now, /*preparing=*/true);
  if (!trouble.ok()) return trouble.status();
  // The old layout trains on; the pending generation is discarded.
  if (trouble->has_value()) return Moved(Finish(op, v1::OPERATION_STATE_ABORTED, **trouble, now));
  return false;  // preparing, or prepared and waiting for the cut-over
}

absl::StatusOr<bool> OperationDriver::StartPreparedTransfer(const OperationRecord& record,
                                                            HostMap& hosts, int64_t now) {
  const v1::Operation& op = record.op;
  // The cut-over checkpoint committed: its generation (the operation's
  // from_generation now) recorded the checksum of every shard.
  absl::StatusOr<std::vector<v1::ShardChecksum>> prepared = store_->GetPreparedSources(op.id());
  if (!prepared.ok()) return prepared.status();
  absl::StatusOr<std::vector<v1::ShardChecksum>> checkpoint =
      store_->GetGenerationChecksums(op.job_id(), op.from_generation());
  if (!checkpoint.ok()) return checkpoint.status();
  const PreparedSteps steps = ComputePreparedSteps(*record.plan, *prepared, *checkpoint);
  std::string no_agent;
  absl::StatusOr<std::vector<HostProgress>> rows =
      AssignedRows(steps.bytes_by_host, hosts, now, &no_agent);
  if (!rows.ok()) return rows.status();
  if (!no_agent.empty()) return Moved(Finish(op, v1::OPERATION_STATE_ABORTED, no_agent, now));
  SkippedSteps skipped;
  skipped.step_indexes = steps.skipped;
  skipped.bytes = steps.bytes_skipped;
  if (absl::Status s = store_->StartPreparedTransfer(op.id(), *rows, skipped); !s.ok()) return s;
  RESHARD_LOG(INFO) << "job=" << op.job_id() << " operation=" << op.id()
                    << " PLANNED -> TRANSFERRING (prepared from generation "
                    << op.prepared_from_generation() << ", cut over at " << op.from_generation()
                    << ") on " << rows->size() << " hosts: " << steps.skipped.size() << " of "
                    << record.plan->stats().steps() << " steps skipped unchanged ("
                    << steps.bytes_skipped << " bytes)";
  if (metrics_ != nullptr) metrics_->PreparedBytes(op.bytes_precopied(), steps.bytes_skipped);
  return true;
}

}  // namespace reshard::coordinator
