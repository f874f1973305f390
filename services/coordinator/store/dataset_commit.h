// The rules of CommitStep (docs/data.md, "Committing a step"), pure so that
// they are unit-tested alone; the store applies them under the job's row
// lock. Thread-safe (no state).
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "reshard/v1/ptc.pb.h"

namespace reshard::coordinator {

/// A step boundary a training loop commits (CommitStepRequest).
struct StepCommit {
  std::string job_id;
  int64_t generation = 0;
  int64_t step = 0;
  int64_t cursor = 0;
  std::string layout_fingerprint;
};

enum class StepCommitVerdict { kApply, kRetry };

/// Whether `commit` may follow `committed` (the dataset state of the job's
/// current generation `current_generation`). kRetry: the same step was
/// committed already with the same cursor (a retried call; nothing to
/// write). FailedPrecondition naming the job and the values when: the
/// generation is not the current one; the layout fingerprint differs; the
/// step is not after the committed one; the cursor moves backwards or is not
/// committed cursor + (step - committed step) x global_batch (a skip or a
/// repeat of samples).
[[nodiscard]] absl::Status CheckStepCommit(const v1::DatasetState& committed,
                                           int64_t current_generation, const StepCommit& commit,
                                           StepCommitVerdict* verdict);

/// A checkpoint operation of the job that has not ended (PENDING, PLANNED or
/// TRANSFERRING): its workers publish the model state of one step into
/// `to_generation`.
struct PendingCheckpoint {
  std::string operation_id;
  std::string state;  // its state's short name, for the message
  int64_t to_generation = 0;
  /// CheckpointRequest.with_step's step boundary; nullopt: a plain
  /// checkpoint, whose generation gets the dataset state committed when it
  /// was created.
  std::optional<StepCommit> step;
};

/// OK without `pending`. Else FailedPrecondition naming the job, the
/// checkpoint operation, its state and step, and the refused step: the
/// generation a checkpoint commits takes the cursor published with its
/// model state (docs/data.md, "One cursor per model state"), so a step that
/// would move the cursor meanwhile is committed on that generation once the
/// checkpoint commits (or on the current one, if it aborts). Callers ask
/// only for a commit that would move the cursor (kApply): a retried commit
/// of the committed step is not refused.
[[nodiscard]] absl::Status CheckNoPendingCheckpoint(
    const StepCommit& commit, int64_t current_generation,
    const std::optional<PendingCheckpoint>& pending);

}  // namespace reshard::coordinator
