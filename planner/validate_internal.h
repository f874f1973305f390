// Helpers shared by validate.cc and validate_kinds.cc (the checks of the
// partition kinds of docs/partitioning.md). Internal to the planner.
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"
#include "reshard/v1/ptc.pb.h"

namespace reshard::planner::internal {

// Upper bound on ranks in one layout: far beyond any cluster, small enough
// that rank arithmetic cannot overflow.
inline constexpr int64_t kMaxWorld = 1 << 20;

inline absl::Status TensorError(const v1::TensorSpec& t, absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat("tensor \"", t.name(), "\": ", what));
}

inline std::string ShapeString(const v1::TensorSpec& t) {
  return absl::StrCat("[", absl::StrJoin(t.shape(), ", "), "]");
}

/// Granularity, padding, experts and a DP_BUCKET tensor's group.
[[nodiscard]] absl::Status ValidateNewFields(const v1::TensorSpec& t, const v1::Ptc& ptc);

/// Bucket groups: names, sizes, and members all dense or all expert.
[[nodiscard]] absl::Status ValidateBuckets(const v1::Ptc& ptc);

/// The layout-dependent checks of one tensor: its held shape within the
/// element limit, blocks of fewer units than tp ranks dividing them, and no
/// holding rank left empty unless allowed. `what` names the layout.
[[nodiscard]] absl::Status CheckTensorUnderLayout(const v1::TensorSpec& t,
                                                  const v1::ParallelConfig& c,
                                                  absl::string_view what);

}  // namespace reshard::planner::internal
