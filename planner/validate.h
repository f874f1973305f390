// Validation of PTC specs and layouts. Every error is InvalidArgument and
// names the tensor, the field and the bad value. Pure; thread-safe.
#pragma once

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "reshard/v1/ptc.pb.h"

namespace reshard::planner {

/// Bytes per element of `dtype`; 0 for unknown values.
int ElementBytes(v1::DType dtype);

/// Checks tensors and blobs on their own (names, dtypes, shapes, partition
/// fields, byte sizes).
[[nodiscard]] absl::Status ValidatePtc(const v1::Ptc& ptc);

/// Checks a layout against a valid PTC: config, stage boundaries, placement,
/// and that no holding rank is left empty unless the tensor allows it.
/// `what` names the layout in messages ("layout", "target").
[[nodiscard]] absl::Status ValidateLayout(const v1::Ptc& ptc, const v1::Layout& layout,
                                          absl::string_view what);

/// ValidatePtc + ValidateLayout + job-level fields.
[[nodiscard]] absl::Status ValidateJobSpec(const v1::JobSpec& spec);

}  // namespace reshard::planner
