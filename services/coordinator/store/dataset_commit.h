// The rules of CommitStep (docs/data.md, "Committing a step"), pure so that
// they are unit-tested alone; the store applies them under the job's row
// lock. Thread-safe (no state).
#pragma once

#include <cstdint>
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

}  // namespace reshard::coordinator
