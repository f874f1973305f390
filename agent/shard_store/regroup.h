// What a restarting agent does to the shard files an earlier agent left
// (issue 11 item 5, issue 19; docs/security.md, "Workers"): each gets the
// agent's own group and the agent-only mode (0600, sealed 0400), so that an
// agent restarted on files an earlier one gave a worker group (0660, sealed
// 0440) takes that group's access away. Not for new files: those get the
// mode when they are made. Thread-compatible (no state).
#pragma once

#include <sys/stat.h>
#include <sys/types.h>

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"

namespace reshard::agent::store_internal {

/// Gives the file open as `fd` (at `path`, for messages; `st` its fstat) the
/// group `gid` (-1: the agent's effective group) and the mode `mode`, each
/// only when it has another. Returns whether anything changed; the errno
/// error (naming the path, the group or mode) when it cannot.
[[nodiscard]] absl::StatusOr<bool> Regroup(int fd, const std::string& path, const struct stat& st,
                                           int64_t gid, mode_t mode);

}  // namespace reshard::agent::store_internal
