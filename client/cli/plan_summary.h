// The human-readable form of a TransferPlan printed by `reshardctl plan`.
// Pure; thread-safe.
#pragma once

#include <cstdint>
#include <string>

#include "reshard/v1/plan.pb.h"
#include "reshard/v1/ptc.pb.h"

namespace reshard::cli {

/// Binary units with three significant digits: "512 B", "1.23 GiB".
std::string FormatBytes(int64_t bytes);

/// cross / lower bound as "1.000"; "n/a" when both are zero.
std::string FormatRatio(int64_t cross, int64_t lower_bound);

/// What the summary describes besides the plan itself.
struct SummaryContext {
  std::string job_name;
  std::string spec_path;
  std::string target_path;
  int num_layers = 0;
  std::vector<std::string> lost_hosts;  // as given with --lost
  double plan_ms = 0;                   // MakePlan
  double to_proto_ms = 0;               // ToProto
};

/// Configurations, per-host traffic, totals, steps and timings.
std::string FormatPlanSummary(const SummaryContext& context, const v1::TransferPlan& plan);

}  // namespace reshard::cli
