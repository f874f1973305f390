// Checks of the dataset state that arrives with RegisterJob and CommitStep
// (docs/data.md). Pure: no store, no clock. Thread-safe.
#pragma once

#include "absl/status/status.h"
#include "reshard/v1/coordinator.pb.h"
#include "reshard/v1/ptc.pb.h"
#include "services/coordinator/store/dataset_commit.h"

namespace reshard::coordinator {

/// RegisterJobRequest.dataset_state: INVALID_ARGUMENT naming the field and
/// value (dataset_state.dataset.id empty, num_samples < 1, an unknown
/// shuffle, block_size against the shuffle, global_batch < 1, cursor or step
/// < 0, cursor + global_batch >= 2^63, a layout_fingerprint over 256 bytes).
/// Clears the output-only fields and fills an empty layout_fingerprint with
/// the one of common/data/data_share.h.
[[nodiscard]] absl::Status NormalizeDatasetState(v1::DatasetState* state);

/// A CommitStepRequest's fields: INVALID_ARGUMENT naming the field and value.
[[nodiscard]] absl::Status CheckCommitStepRequest(const v1::CommitStepRequest& request);

/// The request as the store's StepCommit.
StepCommit ToStepCommit(const v1::CommitStepRequest& request);

}  // namespace reshard::coordinator
