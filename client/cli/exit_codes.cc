#include "client/cli/exit_codes.h"

namespace reshard::cli {

const char kExitCodesHelp[] =
    "exit status (server commands):\n"
    "  0  success (for resize/migrate/recover/ops watch: the operation COMMITTED)\n"
    "  1  other error (bad file, INVALID_ARGUMENT, INTERNAL, ...)\n"
    "  2  usage error (unknown command or flag, missing argument)\n"
    "  3  the operation ended ABORTED or FAILED\n"
    "  4  NOT_FOUND: no such job or operation\n"
    "  5  conflict: FAILED_PRECONDITION (e.g. another operation is active),\n"
    "     ALREADY_EXISTS, ABORTED (the job moved to another generation)\n"
    "  6  coordinator unreachable: UNAVAILABLE or DEADLINE_EXCEEDED\n"
    "`reshardctl plan` (offline) uses 0, 1 and 2 only.\n";

int ExitCodeFor(const absl::Status& status) {
  switch (status.code()) {
    case absl::StatusCode::kOk:
      return kExitError;  // not an error: a caller bug, but never "success"
    case absl::StatusCode::kNotFound:
      return kExitNotFound;
    case absl::StatusCode::kFailedPrecondition:
    case absl::StatusCode::kAlreadyExists:
    case absl::StatusCode::kAborted:
      return kExitConflict;
    case absl::StatusCode::kUnavailable:
    case absl::StatusCode::kDeadlineExceeded:
      return kExitUnavailable;
    default:
      return kExitError;
  }
}

}  // namespace reshard::cli
