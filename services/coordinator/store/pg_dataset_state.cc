// PgStore: the dataset state (docs/data.md) and CommitStep.
#include "services/coordinator/store/pg_dataset_state.h"

#include "absl/strings/str_cat.h"
#include "common/rpc/enum_name.h"
#include "services/coordinator/store/pg_codec.h"
#include "services/coordinator/store/pg_dataset_statements.h"
#include "services/coordinator/store/pg_statements.h"
#include "services/coordinator/store/pg_store.h"
#include "services/coordinator/store/pg_store_internal.h"

namespace reshard::coordinator {
namespace pg {

v1::DatasetState DatasetStateFromRow(const pqxx::row& row) {
  v1::DatasetState s;
  s.mutable_dataset()->set_id(row[0].c_str());
  s.mutable_dataset()->set_num_samples(row[1].as<int64_t>());
  s.mutable_dataset()->set_fingerprint(row[2].c_str());
  s.mutable_order()->set_seed(static_cast<uint64_t>(row[3].as<int64_t>()));
  s.mutable_order()->set_shuffle(static_cast<v1::SampleShuffle>(row[4].as<int>()));
  s.mutable_order()->set_block_size(row[5].as<int64_t>());
  s.set_global_batch(row[6].as<int64_t>());
  s.set_cursor(row[7].as<int64_t>());
  s.set_step(row[8].as<int64_t>());
  s.set_layout_fingerprint(row[9].c_str());
  s.set_committed_generation(row[10].as<int64_t>());
  s.set_committed_unix_ms(row[11].as<int64_t>());
  return s;
}

void InsertDatasetState(PgTx& tx, const std::string& job_id, int64_t generation,
                        const v1::DatasetState& state) {
  tx.Exec(kInsertDatasetState, job_id, generation, state.dataset().id(),
          state.dataset().num_samples(), state.dataset().fingerprint(),
          static_cast<int64_t>(state.order().seed()), static_cast<int>(state.order().shuffle()),
          state.order().block_size(), state.global_batch(), state.cursor(), state.step(),
          state.layout_fingerprint());
}

std::optional<v1::DatasetState> ReadDatasetState(PgTx& tx, const std::string& job_id,
                                                 int64_t generation, bool for_update) {
  const pqxx::result r =
      tx.Exec(for_update ? kLockDatasetState : kSelectDatasetState, job_id, generation);
  if (r.empty()) return std::nullopt;
  return DatasetStateFromRow(r[0]);
}

void CarryDatasetState(PgTx& tx, const std::string& job_id, int64_t from, int64_t to) {
  tx.Exec(kCarryDatasetState, job_id, from, to);
}

std::optional<PendingCheckpoint> ReadPendingCheckpoint(PgTx& tx, const std::string& job_id) {
  const pqxx::result r = tx.Exec(kPendingCheckpointOfJob, job_id);
  if (r.empty()) return std::nullopt;
  PendingCheckpoint pending;
  pending.operation_id = r[0][0].c_str();
  pending.state = rpc::EnumShortName(static_cast<v1::OperationState>(r[0][1].as<int>()));
  pending.to_generation = r[0][2].as<int64_t>();
  if (!r[0][3].is_null()) {
    StepCommit step;
    step.job_id = job_id;
    step.generation = pending.to_generation;
    step.step = r[0][3].as<int64_t>();
    step.cursor = r[0][4].as<int64_t>();
    pending.step = std::move(step);
  }
  return pending;
}

}  // namespace pg

absl::StatusOr<v1::DatasetState> PgStore::CommitStep(const StepCommit& commit) {
  if (absl::Status s = pg::CheckText("job id", commit.job_id); !s.ok()) return s;
  if (absl::Status s = pg::CheckText("layout_fingerprint", commit.layout_fingerprint); !s.ok()) {
    return s;
  }
  return pg::TransactFor<v1::DatasetState>(
      *pool_, "CommitStep", [&](pg::PgTx& tx) -> absl::StatusOr<v1::DatasetState> {
        // The job row lock orders this commit against an operation's commit
        // (CommitOperation takes it too), so a step never lands on a
        // generation that is no longer current.
        const pqxx::result job = tx.Exec(pg::kLockJob, commit.job_id);
        if (job.empty()) return pg::JobNotFound(commit.job_id);
        const int64_t current = job[0][0].as<int64_t>();
        std::optional<v1::DatasetState> committed =
            pg::ReadDatasetState(tx, commit.job_id, current, /*for_update=*/true);
        if (!committed.has_value()) {
          return absl::FailedPreconditionError(absl::StrCat(
              "job \"", commit.job_id,
              "\" has no dataset state: register it with RegisterJobRequest.dataset_state"));
        }
        StepCommitVerdict verdict;
        if (absl::Status s = CheckStepCommit(*committed, current, commit, &verdict); !s.ok()) {
          return s;
        }
        if (verdict == StepCommitVerdict::kApply) {
          // A checkpoint created before this commit (the job row lock
          // orders them) publishes its own step: the cursor must not move
          // under it (docs/data.md, "One cursor per model state").
          if (absl::Status s = CheckNoPendingCheckpoint(
                  commit, current, pg::ReadPendingCheckpoint(tx, commit.job_id));
              !s.ok()) {
            return s;
          }
        }
        pg::WriteAudit(tx, commit.job_id, "", absl::StrCat("step ", commit.step));
        if (verdict == StepCommitVerdict::kRetry) return *committed;
        const pqxx::result updated =
            tx.Exec(pg::kCommitDatasetStep, commit.job_id, current, commit.cursor, commit.step);
        return pg::DatasetStateFromRow(updated[0]);
      });
}

}  // namespace reshard::coordinator
