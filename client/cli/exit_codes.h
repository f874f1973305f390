// Exit status of reshardctl's server commands: one number per kind of
// outcome a script acts on. Pure; thread-safe.
#pragma once

#include "absl/status/status.h"

namespace reshard::cli {

enum ExitCode : int {
  kExitOk = 0,
  kExitError = 1,            // anything else (bad file, INVALID_ARGUMENT, INTERNAL, ...)
  kExitUsage = 2,            // bad command line
  kExitOperationFailed = 3,  // the operation ended ABORTED or FAILED
  kExitNotFound = 4,         // NOT_FOUND: unknown job, operation or host
  kExitConflict = 5,         // FAILED_PRECONDITION, ALREADY_EXISTS, ABORTED (RPC)
  kExitUnavailable = 6,      // UNAVAILABLE, DEADLINE_EXCEEDED: coordinator unreachable
};

/// The exit status for an error from the coordinator (or reading files):
/// never kExitOk, kExitUsage or kExitOperationFailed.
int ExitCodeFor(const absl::Status& status);

/// The table printed by `reshardctl --help`.
extern const char kExitCodesHelp[];

}  // namespace reshard::cli
