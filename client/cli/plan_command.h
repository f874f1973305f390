// `reshardctl plan`: plans a job's move to a new layout, offline (no server).
// Reads files, writes to the given streams; no other shared state.
#pragma once

#include <ostream>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace reshard::cli {

/// Usage text of `reshardctl plan`.
extern const char kPlanUsage[];

/// Options of `reshardctl plan`, as given on the command line.
struct PlanOptions {
  enum class Format { kSummary, kJson };

  std::string spec_path;    // --spec: a v1.JobSpec in JSON
  std::string target_path;  // --to: a v1.Layout in JSON
  std::string lost;         // --lost: raw list; empty when nothing is lost
  Format format = Format::kSummary;
  bool help = false;
};

/// Parses the arguments after `plan`. Every error is a usage error
/// (InvalidArgument naming the flag or value).
[[nodiscard]] absl::StatusOr<PlanOptions> ParsePlanArgs(const std::vector<std::string>& args);

/// Loads the job spec and target, plans, and writes the plan to `out` in the
/// chosen format. InvalidArgument for bad files or specs, NotFound for
/// missing files, FailedPrecondition when needed bytes have no surviving
/// holder (the planner's message lists them).
[[nodiscard]] absl::Status RunPlan(const PlanOptions& options, std::ostream& out);

/// `reshardctl plan ARGS`: returns the exit status: 0 success, 2 usage error,
/// 1 any other error. Errors go to `err` as "CODE_NAME: message".
int PlanMain(const std::vector<std::string>& args, std::ostream& out, std::ostream& err);

/// Writes "CODE_NAME: message" and a newline.
void PrintError(const absl::Status& status, std::ostream& err);

}  // namespace reshard::cli
