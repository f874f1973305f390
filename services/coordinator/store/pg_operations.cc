// PgStore: creating operations and moving them through their states.
#include <algorithm>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/rpc/enum_name.h"
#include "services/coordinator/store/pg_codec.h"
#include "services/coordinator/store/pg_dataset_state.h"
#include "services/coordinator/store/pg_dataset_statements.h"
#include "services/coordinator/store/pg_meeting.h"
#include "services/coordinator/store/pg_statements.h"
#include "services/coordinator/store/pg_stop_free_statements.h"
#include "services/coordinator/store/pg_store.h"
#include "services/coordinator/store/pg_store_internal.h"
#include "services/coordinator/store/store_checks.h"

namespace reshard::coordinator {
namespace pg {

absl::Status CheckMove(PgTx& tx, const std::string& operation_id, OpPhase to) {
  const pqxx::result r = tx.Exec(kOperationFacts, operation_id);
  if (r.empty()) return OperationNotFound(operation_id);
  OpFacts facts;
  facts.state = static_cast<v1::OperationState>(r[0][0].as<int>());
  facts.stop_free = r[0][1].as<bool>();
  facts.prepare_started = r[0][2].as<bool>();
  facts.agents_prepared = r[0][3].as<bool>();
  facts.cut_over = r[0][4].as<bool>();
  facts.queued = r[0][5].as<bool>();
  facts.boundary_waiting = r[0][6].as<bool>();
  return CheckMoveFrom(operation_id, facts, to);
}

}  // namespace pg

absl::StatusOr<v1::Operation> PgStore::CreateOperation(const NewOperation& op) {
  if (absl::Status s = CheckNewOperation(op); !s.ok()) return s;
  const std::string layout_bytes = op.target_layout.SerializeAsString();
  const std::string lost_hosts = pg::TextArray(op.lost_hosts);
  const std::string lost_ranks = pg::IntArray({op.lost_ranks.begin(), op.lost_ranks.end()});
  const bool keyed = !op.idempotency.key.empty();

  return pg::TransactFor<v1::Operation>(
      *pool_, "CreateOperation", [&](pg::PgTx& tx) -> absl::StatusOr<v1::Operation> {
        // The job row lock serializes every mutation of this job, so the
        // checks below cannot be overtaken before the commit.
        const pqxx::result job = tx.Exec(pg::kLockJob, op.job_id);
        if (job.empty()) return pg::JobNotFound(op.job_id);
        const int64_t generation = job[0][0].as<int64_t>();
        if (keyed) {
          absl::StatusOr<std::optional<std::string>> first =
              pg::FindIdempotentResource(tx, op.idempotency);
          if (!first.ok()) return first.status();
          if (first->has_value()) {
            absl::StatusOr<OperationRecord> record = pg::ReadOperation(tx, **first, false);
            if (!record.ok()) return record.status();
            pg::WriteAudit(tx, op.job_id, **first);  // the replay names the first call's
            return record->op;
          }
        }
        if (op.expected_generation <= 0) {
          return absl::InvalidArgumentError(
              absl::StrCat("expected_generation must be positive, got ", op.expected_generation));
        }
        if (op.expected_generation != generation) {
          return absl::AbortedError(absl::StrCat("job \"", op.job_id, "\" is at generation ",
                                                 generation, ", request expected ",
                                                 op.expected_generation));
        }
        // What meets the job's active operations (docs/coordinator.md,
        // "Checkpoints and operations"; operation_meeting.h).
        const pqxx::result active = tx.Exec(pg::kActiveOperationOfJob, op.job_id);
        const std::vector<ActiveOperation> actives = pg::ActiveOperations(active);
        absl::StatusOr<MeetingVerdict> verdict =
            Meet(op.job_id, op.kind, op.cut_over_operation_id, actives);
        if (!verdict.ok()) return verdict.status();
        int64_t reserved_generation = 0;  // a cut-over's, see CheckCutOver
        switch (verdict->what) {
          case Meeting::kFold:
            return pg::FoldedCheckpoint(tx, op, verdict->other);
          case Meeting::kCutOver: {
            absl::StatusOr<int64_t> reserved = pg::CheckCutOver(tx, op, active, generation);
            if (!reserved.ok()) return reserved.status();
            reserved_generation = *reserved;
            break;
          }
          case Meeting::kAbortCheckpoint:
            pg::AbortCheckpointForRecovery(tx, op, actives.front());
            break;
          default:
            break;
        }
        if (op.step.has_value()) {
          const std::optional<v1::DatasetState> committed =
              pg::ReadDatasetState(tx, op.job_id, generation, /*for_update=*/false);
          if (absl::Status s = CheckCheckpointStep(op, generation,
                                                   committed.has_value() ? &*committed : nullptr);
              !s.ok()) {
            return s;
          }
        }
        // Generation numbers are never reused (a DISCARDED one keeps its). A
        // stop-free operation reserves the number below its own for its
        // cut-over checkpoint (docs/coordinator.md, "Agents prepare").
        const int64_t next_generation =
            tx.Exec(pg::kMaxGeneration, op.job_id)[0][0].as<int64_t>() + 1;
        // A queued operation's numbers are fixed when it is released
        // (ReleaseQueuedOperation), and so is the start of its step-boundary
        // wait.
        const std::string queued_behind =
            verdict->what == Meeting::kQueue ? verdict->other : std::string();
        const int64_t to_generation = NewOperationToGeneration(
            !queued_behind.empty(), reserved_generation, op.stop_free, next_generation);
        tx.Exec(pg::kInsertOperation, op.operation_id, op.job_id, static_cast<int>(op.kind),
                generation, to_generation, pg::Bytea(layout_bytes), lost_hosts, lost_ranks,
                op.idempotency.key, queued_behind,
                static_cast<int>(op.at_step_boundary ? v1::STEP_BOUNDARY_WAITING
                                                     : v1::STEP_BOUNDARY_UNSPECIFIED),
                op.at_step_boundary ? op.step_boundary_timeout_ms : int64_t{0},
                op.at_step_boundary && queued_behind.empty() ? op.step_boundary_deadline_unix_ms
                                                             : int64_t{0});
        if (keyed) {
          if (absl::Status s =
                  pg::ClaimIdempotencyKey(tx, op.idempotency, op.operation_id, op.job_id);
              !s.ok()) {
            return s;
          }
        }
        if (op.step.has_value()) {
          tx.Exec(pg::kSetOperationStep, op.operation_id, op.step->step, op.step->cursor);
        }
        if (op.stop_free) tx.Exec(pg::kSetOperationStopFree, op.operation_id);
        if (verdict->what == Meeting::kCutOver) pg::CutOver(tx, op, to_generation);
        if (absl::Status s = pg::ApplyMeeting(tx, op, *verdict); !s.ok()) return s;
        tx.Exec(pg::kSetJobState, op.job_id, static_cast<int>(v1::JOB_STATE_RECONFIGURING));
        pg::WriteAudit(tx, op.job_id, op.operation_id);
        absl::StatusOr<OperationRecord> record = pg::ReadOperation(tx, op.operation_id, false);
        if (!record.ok()) return record.status();
        return record->op;
      });
}

absl::StatusOr<OperationRecord> PgStore::GetOperation(const std::string& operation_id,
                                                      bool include_plan) {
  return pg::TransactFor<OperationRecord>(*pool_, "GetOperation", [&](pg::PgTx& tx) {
    return pg::ReadOperation(tx, operation_id, include_plan);
  });
}

absl::StatusOr<std::vector<std::string>> PgStore::ListActiveOperations() {
  using Ids = std::vector<std::string>;
  return pg::TransactFor<Ids>(*pool_, "ListActiveOperations", [&](pg::PgTx& tx) {
    Ids ids;
    for (const pqxx::row& row : tx.Exec(pg::kListActiveOperations)) {
      ids.emplace_back(row[0].c_str());
    }
    return absl::StatusOr<Ids>(std::move(ids));
  });
}

absl::Status PgStore::TransitionOperation(const std::string& operation_id, v1::OperationState from,
                                          v1::OperationState to, const OperationUpdate& update) {
  if (absl::Status s = CheckTransitionArgs(operation_id, from, to, update); !s.ok()) return s;
  const bool end_step = IsTerminalState(to);
  const pqxx::binarystring plan =
      update.plan ? pg::Bytea(*update.plan) : pg::Bytea(absl::string_view());
  const pqxx::binarystring stats =
      update.stats ? pg::Bytea(*update.stats) : pg::Bytea(absl::string_view());
  const std::string error = update.error ? pg::TruncateError(*update.error) : std::string();

  return pool_->Transact("TransitionOperation", [&](pg::PgTx& tx) -> absl::Status {
    const pqxx::result r = tx.Exec(pg::kTransitionOperation, operation_id, static_cast<int>(from),
                                   static_cast<int>(to), update.plan != nullptr, plan,
                                   update.stats.has_value(), stats, update.error.has_value(), error,
                                   update.bytes_total.has_value(), update.bytes_total.value_or(0));
    if (r.empty()) {
      const pqxx::result now = tx.Exec(pg::kOperationState, operation_id);
      if (now.empty()) return pg::OperationNotFound(operation_id);
      return absl::AbortedError(
          absl::StrCat("operation \"", operation_id, "\" is ",
                       rpc::EnumShortName(static_cast<v1::OperationState>(now[0][0].as<int>())),
                       ", not ", rpc::EnumShortName(from)));
    }
    if (end_step) {
      // ABORTED / FAILED: the new buffers are dropped, the job is usable
      // again (DEGRADED when its current generation lost hosts).
      const std::string job_id = r[0][0].c_str();
      tx.Exec(pg::kDiscardPendingGeneration, job_id, r[0][1].as<int64_t>());
      tx.Exec(pg::kSettleJobState, job_id);
      // Another operation of the job still active (one queued behind this
      // checkpoint, the stop-free one this cut over) keeps it RECONFIGURING.
      tx.Exec(pg::kKeepReconfiguring, job_id);
    }
    // A cancel's key names the operation it moved, or nothing moves.
    if (!update.idempotency.key.empty()) {
      if (absl::Status s =
              pg::ClaimIdempotencyKey(tx, update.idempotency, operation_id, r[0][0].c_str());
          !s.ok()) {
        return s;
      }
    }
    pg::WriteAudit(tx, r[0][0].c_str(), operation_id);
    return absl::OkStatus();
  });
}

absl::StatusOr<std::vector<v1::Operation>> PgStore::ListOperationsForJob(
    const std::string& job_id) {
  using Ops = std::vector<v1::Operation>;
  return pg::TransactFor<Ops>(
      *pool_, "ListOperationsForJob", [&](pg::PgTx& tx) -> absl::StatusOr<Ops> {
        if (tx.Exec(pg::kJobExists, job_id).empty()) {
          return pg::JobNotFound(job_id);
        }
        Ops ops;
        for (const pqxx::row& row : tx.Exec(pg::kListOperationsForJob, job_id)) {
          absl::StatusOr<v1::Operation> op = pg::OperationFromRow(row, nullptr, nullptr);
          if (!op.ok()) return op.status();
          ops.push_back(*std::move(op));
        }
        return ops;
      });
}

}  // namespace reshard::coordinator
