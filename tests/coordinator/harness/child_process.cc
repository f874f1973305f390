#include "tests/coordinator/harness/child_process.h"

#include <fstream>
#include <sstream>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "tests/support/process.h"

namespace reshard::coordinator::testing {

absl::StatusOr<pid_t> SpawnChild(const ChildOptions& options) {
  if (options.argv.empty()) return absl::InvalidArgumentError("SpawnChild: empty argv");
  test_support::SpawnOptions spawn;
  spawn.argv = options.argv;
  spawn.cwd = options.cwd;
  spawn.in = test_support::Stream::Null();
  spawn.out = options.log_path.empty() ? test_support::Stream::Null()
                                       : test_support::Stream::File(options.log_path);
  spawn.err = test_support::Stream::SameAsOut();
  if (options.switch_user) spawn.user = std::make_pair(options.uid, options.gid);
  spawn.die_with_parent = options.die_with_parent;
  absl::StatusOr<test_support::ChildProcess> child = test_support::ChildProcess::Spawn(spawn);
  if (!child.ok()) return child.status();
  return child->Release();  // the caller waits for it (WaitChild, ChildExited)
}

int WaitChild(pid_t pid) { return test_support::WaitPid(pid); }

bool ChildExited(pid_t pid, int* status) { return test_support::PidExited(pid, status); }

absl::Status RunChild(const ChildOptions& options) {
  absl::StatusOr<pid_t> pid = SpawnChild(options);
  if (!pid.ok()) return pid.status();
  const int status = WaitChild(*pid);
  if (status == 0) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrCat("`", absl::StrJoin(options.argv, " "),
                                                    "` exited with status ", status, ":\n",
                                                    FileTail(options.log_path)));
}

std::string FileTail(const std::string& path, size_t max_bytes) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return "";
  std::stringstream ss;
  ss << in.rdbuf();
  const std::string all = ss.str();
  return all.size() <= max_bytes ? all : all.substr(all.size() - max_bytes);
}

}  // namespace reshard::coordinator::testing
