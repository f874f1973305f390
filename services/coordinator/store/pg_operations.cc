// PgStore: creating operations and moving them through their states.
#include <algorithm>
#include <optional>
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

// What CreateOperation's rules (PlanCreation, operation_create.h) need of
// the job, whose row the caller locked.
absl::StatusOr<CreationSnapshot> ReadCreation(PgTx& tx, const NewOperation& op,
                                              int64_t generation) {
  CreationSnapshot s;
  if (!op.idempotency.key.empty()) {
    absl::StatusOr<std::optional<std::string>> first = FindIdempotentResource(tx, op.idempotency);
    if (!first.ok()) return first.status();
    s.replayed = *first;
    if (s.replayed.has_value()) return s;
  }
  s.generation = generation;
  s.active = ActiveOperations(tx.Exec(kActiveOperationOfJob, op.job_id));
  s.max_generation = tx.Exec(kMaxGeneration, op.job_id)[0][0].as<int64_t>();
  if (!op.cut_over_operation_id.empty()) s.cut_over = ReadCutOverTarget(tx, op);
  if (op.step.has_value()) {
    s.committed = ReadDatasetState(tx, op.job_id, generation, /*for_update=*/false);
  }
  return s;
}

// A kCreate plan written, in its order; the new operation as stored.
absl::StatusOr<v1::Operation> WriteCreation(PgTx& tx, const NewOperation& op,
                                            const CreationPlan& plan) {
  if (plan.abort_checkpoint.has_value()) {
    AbortCheckpointForRecovery(tx, op.job_id, *plan.abort_checkpoint);
  }
  const NewOperationRow& row = plan.row;
  tx.Exec(kInsertOperation, op.operation_id, op.job_id, static_cast<int>(op.kind),
          row.from_generation, row.to_generation, Bytea(op.target_layout.SerializeAsString()),
          TextArray(op.lost_hosts), IntArray({op.lost_ranks.begin(), op.lost_ranks.end()}),
          op.idempotency.key, row.queued_behind, static_cast<int>(row.step_boundary),
          row.step_boundary_timeout_ms, row.step_boundary_deadline_unix_ms);
  if (!op.idempotency.key.empty()) {
    if (absl::Status s = ClaimIdempotencyKey(tx, op.idempotency, op.operation_id, op.job_id);
        !s.ok()) {
      return s;
    }
  }
  if (op.step.has_value()) {
    tx.Exec(kSetOperationStep, op.operation_id, op.step->step, op.step->cursor);
  }
  if (op.stop_free) tx.Exec(kSetOperationStopFree, op.operation_id);
  if (op.deadline.unix_ms() > 0) {
    tx.Exec(kSetOperationDeadline, op.operation_id, op.deadline.unix_ms(),
            op.deadline.abort_past());
  }
  if (plan.cut_over.has_value()) WriteCutOver(tx, *plan.cut_over);
  if (plan.boundary_checkpoint.has_value()) {
    if (absl::Status s = NameBoundaryCheckpoint(tx, *plan.boundary_checkpoint); !s.ok()) return s;
  }
  tx.Exec(kSetJobState, op.job_id, static_cast<int>(plan.job_state));
  WriteAudit(tx, op.job_id, op.operation_id);
  absl::StatusOr<OperationRecord> record = ReadOperation(tx, op.operation_id, false);
  if (!record.ok()) return record.status();
  return record->op;
}

}  // namespace pg

// The rules are PlanCreation's (operation_create.h); this reads the job and
// writes the plan in one transaction.
absl::StatusOr<v1::Operation> PgStore::CreateOperation(const NewOperation& op) {
  if (absl::Status s = CheckNewOperation(op); !s.ok()) return s;
  return pg::TransactFor<v1::Operation>(
      *pool_, "CreateOperation", [&](pg::PgTx& tx) -> absl::StatusOr<v1::Operation> {
        // The job row lock serializes every mutation of this job, so the
        // plan cannot be overtaken before the commit.
        const pqxx::result job = tx.Exec(pg::kLockJob, op.job_id);
        if (job.empty()) return pg::JobNotFound(op.job_id);
        absl::StatusOr<CreationSnapshot> snapshot =
            pg::ReadCreation(tx, op, job[0][0].as<int64_t>());
        if (!snapshot.ok()) return snapshot.status();
        absl::StatusOr<CreationPlan> plan = PlanCreation(op, *snapshot);
        if (!plan.ok()) return plan.status();
        switch (plan->action) {
          case CreationPlan::Action::kReplay: {
            absl::StatusOr<OperationRecord> record = pg::ReadOperation(tx, plan->existing, false);
            if (!record.ok()) return record.status();
            pg::WriteAudit(tx, op.job_id, plan->existing);  // the replay names the first call's
            return record->op;
          }
          case CreationPlan::Action::kFold:
            return pg::FoldedCheckpoint(tx, op, plan->existing);
          case CreationPlan::Action::kCreate:
            break;
        }
        return pg::WriteCreation(tx, op, *plan);
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
  const pqxx::binarystring prediction =
      update.prediction ? pg::Bytea(*update.prediction) : pg::Bytea(absl::string_view());

  return pool_->Transact("TransitionOperation", [&](pg::PgTx& tx) -> absl::Status {
    const pqxx::result r =
        tx.Exec(pg::kTransitionOperation, operation_id, static_cast<int>(from),
                static_cast<int>(to), update.plan != nullptr, plan, update.stats.has_value(), stats,
                update.error.has_value(), error, update.bytes_total.has_value(),
                update.bytes_total.value_or(0), update.prediction.has_value(), prediction);
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
