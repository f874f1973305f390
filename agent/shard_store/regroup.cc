#include "agent/shard_store/regroup.h"

#include <unistd.h>

#include <cerrno>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "agent/shard_store/rank_buffer_file.h"

namespace reshard::agent::store_internal {

absl::StatusOr<bool> Regroup(int fd, const std::string& path, const struct stat& st, int64_t gid,
                             mode_t mode) {
  const gid_t want = gid >= 0 ? static_cast<gid_t>(gid) : ::getegid();
  bool changed = false;
  if (st.st_gid != want) {
    if (::fchown(fd, static_cast<uid_t>(-1), want) != 0) {
      return ErrnoStatus(absl::StrCat("cannot give group ", want, " (it has ", st.st_gid, ") to"),
                         path, errno);
    }
    changed = true;
  }
  if ((st.st_mode & 07777) != mode) {
    if (::fchmod(fd, mode) != 0) {
      return ErrnoStatus(
          absl::StrFormat("cannot set mode %04o (it has %04o) on", mode, st.st_mode & 07777), path,
          errno);
    }
    changed = true;
  }
  return changed;
}

}  // namespace reshard::agent::store_internal
