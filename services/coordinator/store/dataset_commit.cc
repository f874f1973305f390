#include "services/coordinator/store/dataset_commit.h"

#include <limits>

#include "absl/strings/str_cat.h"

namespace reshard::coordinator {

absl::Status CheckStepCommit(const v1::DatasetState& committed, int64_t current_generation,
                             const StepCommit& commit, StepCommitVerdict* verdict) {
  const std::string job = absl::StrCat("job \"", commit.job_id, "\"");
  if (commit.generation != current_generation) {
    return absl::FailedPreconditionError(
        absl::StrCat(job, ": generation ", commit.generation, " is not the current generation ",
                     current_generation,
                     "; restore the sampler from the job's dataset state before committing"));
  }
  if (commit.layout_fingerprint != committed.layout_fingerprint()) {
    return absl::FailedPreconditionError(
        absl::StrCat(job, ": layout_fingerprint \"", commit.layout_fingerprint,
                     "\" does not match the committed \"", committed.layout_fingerprint(),
                     "\" (another dataset, order or global batch)"));
  }
  if (commit.step == committed.step() && commit.cursor == committed.cursor()) {
    *verdict = StepCommitVerdict::kRetry;
    return absl::OkStatus();
  }
  if (commit.cursor < committed.cursor()) {
    return absl::FailedPreconditionError(absl::StrCat(job, ": cursor ", commit.cursor,
                                                      " would move backwards from the committed ",
                                                      committed.cursor()));
  }
  if (commit.step <= committed.step()) {
    return absl::FailedPreconditionError(
        absl::StrCat(job, ": step ", commit.step, " is not after the committed step ",
                     committed.step(), " (cursor ", committed.cursor(), ")"));
  }
  const int64_t steps = commit.step - committed.step();
  const int64_t batch = committed.global_batch();
  const int64_t room = std::numeric_limits<int64_t>::max() - committed.cursor();
  if (batch <= 0 || steps > room / batch || committed.cursor() + steps * batch != commit.cursor) {
    return absl::FailedPreconditionError(absl::StrCat(
        job, ": cursor ", commit.cursor, " is not the committed cursor ", committed.cursor(),
        " + (step ", commit.step, " - committed step ", committed.step(), ") x global_batch ",
        batch, "; samples would be skipped or repeated"));
  }
  *verdict = StepCommitVerdict::kApply;
  return absl::OkStatus();
}

absl::Status CheckNoPendingCheckpoint(const StepCommit& commit, int64_t current_generation,
                                      const std::optional<PendingCheckpoint>& pending) {
  if (!pending.has_value()) return absl::OkStatus();
  const std::string published =
      pending->step.has_value()
          ? absl::StrCat("step ", pending->step->step, " (cursor ", pending->step->cursor, ")")
          : std::string("the dataset state committed when it was created");
  return absl::FailedPreconditionError(absl::StrCat(
      "job \"", commit.job_id, "\": checkpoint operation \"", pending->operation_id, "\" (",
      pending->state, ") publishes ", published, " into generation ", pending->to_generation,
      "; step ", commit.step, " (cursor ", commit.cursor, ") cannot be committed on generation ",
      current_generation,
      " until it ends, since a generation's cursor is the one published with its model state: "
      "commit it on generation ",
      pending->to_generation, " once the checkpoint commits (on generation ", current_generation,
      " if it aborts)"));
}

}  // namespace reshard::coordinator
