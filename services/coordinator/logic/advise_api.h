// Logic behind the Advise RPC and "let the coordinator choose" resizes: turns
// an AdviseRequest and the job's stored PTC and layout into the advisor's
// inputs (advisor/advisor.h), runs it, and answers its Pareto set with the
// cost of each move and the best candidate for the horizon. Defaults and
// rules: docs/advisor.md, "The Advise RPC". Thread-safe: holds no mutable
// state of its own.
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "planner/planner.h"
#include "reshard/v1/coordinator.pb.h"
#include "services/coordinator/store/store.h"

namespace reshard::coordinator {

/// Defaults of AdviseRequest fields left 0 (documented in the proto too).
inline constexpr double kDefaultAdviseHorizonS = 3600;
inline constexpr double kDefaultIntraHostBytesPerS = 240e9;
inline constexpr double kDefaultInterHostBytesPerS = 160e9;
inline constexpr char kDefaultGpuType[] = "A100";
/// Limits of AdviseRequest fields (InvalidArgument above them).
inline constexpr int kMaxAdviseGpus = 1 << 16;
inline constexpr int kMaxAdviseHosts = 1 << 14;

/// A policy's advice (ElasticPolicy.advise) for a job of `ptc`: the facts
/// the advisor needs are given or the PTC says them, and none is negative.
/// INVALID_ARGUMENT naming `field`.advise's field.
[[nodiscard]] absl::Status CheckPolicyAdvice(const v1::PolicyAdvice& advice, const v1::Ptc& ptc,
                                             absl::string_view field);

/// The AdviseRequest of a policy's advice for `gpus` devices on `hosts`.
v1::AdviseRequest AdviceRequest(const v1::PolicyAdvice& advice, const std::string& job_id, int gpus,
                                const std::vector<std::string>& hosts);

class AdviseApi {
 public:
  explicit AdviseApi(StorePtr store) : store_(std::move(store)) {}

  /// The Pareto set for `request.job_id`: NotFound for an unknown job;
  /// InvalidArgument naming the field and value for bad input (gpus <= 0,
  /// unknown or duplicate host, a model fact missing that the PTC cannot
  /// supply, ...); FailedPrecondition when the offered hosts have fewer
  /// devices than `gpus`, a named host is lost, or no layout fits (saying
  /// how many were considered and the memory limit).
  [[nodiscard]] absl::StatusOr<v1::AdviseResponse> Advise(const v1::AdviseRequest& request);

  /// Advise for `job` (loaded with its PTC), whatever request.job_id says.
  /// With `lost` (may be null) the hosts it names are not offered and every
  /// move is priced as a recovery from the survivors.
  [[nodiscard]] absl::StatusOr<v1::AdviseResponse> AdviseJob(
      const v1::AdviseRequest& request, const v1::Job& job, const planner::LostSet* lost = nullptr);

  /// The layout "let the coordinator choose" moves `job` to: the best
  /// candidate for the horizon (most steps completed after its move).
  /// Errors as AdviseJob; FailedPrecondition when no candidate could be
  /// planned from the current layout or none completes a step within the
  /// horizon (the message says which).
  [[nodiscard]] absl::StatusOr<v1::Layout> Choose(const v1::AdviseRequest& request,
                                                  const v1::Job& job,
                                                  const planner::LostSet* lost = nullptr);

 private:
  StorePtr store_;
};

}  // namespace reshard::coordinator
