// What a restarting agent does to the shard files an earlier agent left
// (issue 11 item 5; docs/security.md, "Workers"): each gets the group and
// mode the agent is configured with now, so that changing --worker-group or
// --shard-file-mode and restarting takes access away from the old group as
// well as giving it to the new one. Not for new files: those get the group
// and mode when they are made. Thread-compatible (no state).
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
