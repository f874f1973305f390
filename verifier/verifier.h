// Independent plan verifier: checks a TransferPlan against the rules of
// docs/partitioning.md by simulating every element of every buffer. Written
// from the docs alone and depending only on the API types, never on the
// planner, so that it does not share the planner's mistakes.
//
// A test tool for small shapes: it materialises every buffer. Pure;
// thread-safe (no shared state).
#pragma once

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "reshard/v1/plan.pb.h"
#include "reshard/v1/ptc.pb.h"

namespace reshard::verifier {

/// Checks that `plan` turns the buffers of layout `from` into those of `to`
/// for `ptc`, given the old hosts and ranks that are lost:
/// - every copy reads real elements (not padding) of a surviving old rank
///   inside its buffer, and its destinations are on one new host;
/// - every position of every new buffer is written exactly once, and ends
///   up holding exactly the element the target layout puts there (padding,
///   including axis padding, bucket gaps and regenerated blobs, zero-filled);
/// - sources are chosen same device first, then same host (rule 2);
/// - no element crosses to one host twice (rule 3) and the cross-host bytes
///   of each host equal the lower bound (rule 4);
/// - `regenerate` lists exactly the regenerable blobs of new ranks whose
///   value has no surviving holder, ascending by rank then item;
/// - each step's `bytes` and `cross_host`, `items`, `lost_ranks`, the
///   layouts echoed in the plan and every field of `stats` are right.
/// Returns InvalidArgument when the inputs themselves are invalid or too
/// large (more than kMaxModelElements elements), FailedPrecondition naming
/// the item, step, rank and position when the plan is wrong.
[[nodiscard]] absl::Status VerifyPlan(const reshard::v1::Ptc& ptc, const reshard::v1::Layout& from,
                                      const reshard::v1::Layout& to,
                                      const std::vector<std::string>& lost_hosts,
                                      const std::vector<int>& lost_ranks,
                                      const reshard::v1::TransferPlan& plan);

/// Names of the items (tensors, then blobs, in PTC order) of which some
/// element that `to` needs has no surviving holder in `from`: exactly the
/// items a planner must report as lost (regenerable blobs never are). InvalidArgument on invalid
/// inputs.
[[nodiscard]] absl::StatusOr<std::vector<std::string>> UnrecoverableItems(
    const reshard::v1::Ptc& ptc, const reshard::v1::Layout& from, const reshard::v1::Layout& to,
    const std::vector<std::string>& lost_hosts, const std::vector<int>& lost_ranks);

}  // namespace reshard::verifier
