#include "services/coordinator/logic/dataset_state.h"

#include <cstdint>
#include <limits>

#include "absl/strings/str_cat.h"
#include "common/data/data_share.h"
#include "services/coordinator/logic/request_checks.h"

namespace reshard::coordinator {
namespace {

constexpr size_t kMaxFingerprintBytes = 256;

absl::Status Invalid(absl::string_view field, int64_t value, absl::string_view rule) {
  return absl::InvalidArgumentError(absl::StrCat(field, ": ", value, " ", rule));
}

absl::Status CheckFingerprint(absl::string_view field, const std::string& value) {
  if (value.size() > kMaxFingerprintBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, " is ", value.size(), " bytes; the limit is ", kMaxFingerprintBytes));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status NormalizeDatasetState(v1::DatasetState* state) {
  const v1::DatasetDescriptor& dataset = state->dataset();
  if (dataset.id().empty()) {
    return absl::InvalidArgumentError("dataset_state.dataset.id is required");
  }
  if (absl::Status s = CheckFingerprint("dataset_state.dataset.id", dataset.id()); !s.ok()) {
    return s;
  }
  if (absl::Status s = CheckFingerprint("dataset_state.dataset.fingerprint", dataset.fingerprint());
      !s.ok()) {
    return s;
  }
  if (dataset.num_samples() < 1) {
    return Invalid("dataset_state.dataset.num_samples", dataset.num_samples(), "must be >= 1");
  }
  if (!v1::SampleShuffle_IsValid(state->order().shuffle())) {
    return Invalid("dataset_state.order.shuffle", state->order().shuffle(),
                   "is not a known SampleShuffle");
  }
  if (state->order().block_size() < 0) {
    return Invalid("dataset_state.order.block_size", state->order().block_size(), "must be >= 0");
  }
  data::Order order;
  order.seed = state->order().seed();
  order.shuffle = static_cast<data::Shuffle>(state->order().shuffle());
  order.block_size = static_cast<uint64_t>(state->order().block_size());
  if (absl::Status s = data::ValidateOrder(dataset.num_samples(), order); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("dataset_state.", s.message()));
  }
  if (state->global_batch() < 1) {
    return Invalid("dataset_state.global_batch", state->global_batch(), "must be >= 1");
  }
  if (state->cursor() < 0) return Invalid("dataset_state.cursor", state->cursor(), "must be >= 0");
  if (state->step() < 0) return Invalid("dataset_state.step", state->step(), "must be >= 0");
  if (state->cursor() > std::numeric_limits<int64_t>::max() - state->global_batch()) {
    return Invalid("dataset_state.cursor", state->cursor(),
                   "leaves no room for a step of global_batch samples below 2^63");
  }
  if (absl::Status s =
          CheckFingerprint("dataset_state.layout_fingerprint", state->layout_fingerprint());
      !s.ok()) {
    return s;
  }
  if (state->layout_fingerprint().empty()) {
    state->set_layout_fingerprint(data::LayoutFingerprint(
        dataset.id(), dataset.num_samples(), dataset.fingerprint(), order, state->global_batch()));
  }
  state->clear_committed_generation();
  state->clear_committed_unix_ms();
  return absl::OkStatus();
}

absl::Status CheckCommitStepRequest(const v1::CommitStepRequest& request) {
  if (absl::Status s = RequireNonEmpty("job_id", request.job_id()); !s.ok()) return s;
  if (request.generation() < 1) return Invalid("generation", request.generation(), "must be >= 1");
  if (request.step() < 1) return Invalid("step", request.step(), "must be >= 1");
  if (request.cursor() < 0) return Invalid("cursor", request.cursor(), "must be >= 0");
  if (request.layout_fingerprint().empty()) {
    return absl::InvalidArgumentError("layout_fingerprint is empty");
  }
  return CheckFingerprint("layout_fingerprint", request.layout_fingerprint());
}

StepCommit ToStepCommit(const v1::CommitStepRequest& request) {
  StepCommit commit;
  commit.job_id = request.job_id();
  commit.generation = request.generation();
  commit.step = request.step();
  commit.cursor = request.cursor();
  commit.layout_fingerprint = request.layout_fingerprint();
  return commit;
}

}  // namespace reshard::coordinator
