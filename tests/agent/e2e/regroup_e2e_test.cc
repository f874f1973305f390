// A restarted agent regroups what an earlier agent left (issue 11 item 5):
// the real reshard-agent holds a published job's sealed shard files; it is
// killed and started again with another --worker-group and
// --worker-socket-mode, then once more without a group. Each time its worker
// socket has the configured group and mode, its shard files stay the agent's
// alone (0400 sealed, the agent's group: issue 19), and the job's bytes still
// verify through the socket.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "tests/agent/e2e/e2e_fixture.h"

namespace reshard::agent::testing {
namespace {

class RegroupE2eTest : public AgentE2eTest {
 protected:
  // Kills `h`'s agent and starts it again (same shm dir and socket) with
  // `flags` added.
  void RestartWith(const std::string& h, const std::vector<std::string>& flags) {
    agents_[h]->Kill();
    AgentProcess::Options o;
    o.host_id = h;
    o.coordinator = coordinator_->address();
    o.worker_socket = sockets_[h];
    o.shm_dir = dir_ + "/shm-" + h;
    o.extra_args = {"--memory-limit-bytes", std::to_string(int64_t{1} << 30), "--insecure"};
    for (const std::string& f : flags) o.extra_args.push_back(f);
    o.env = {{"UCX_NET_DEVICES", "lo"}, {"UCX_TLS", "tcp,self"}};
    auto a = AgentProcess::Start(o);
    ASSERT_TRUE(a.ok()) << a.status();
    agents_[h] = std::move(*a);
    ASSERT_NO_FATAL_FAILURE(WaitHostsAlive());
  }

  // (mode, group) of the socket of `h` and of each of its shard files of
  // the job (not the sidecars).
  std::vector<std::pair<mode_t, gid_t>> Files(const std::string& h) {
    std::vector<std::string> paths = {sockets_[h]};
    for (const auto& e : std::filesystem::directory_iterator(dir_ + "/shm-" + h)) {
      const std::string name = e.path().filename().string();
      if (absl::StrContains(name, job_id_) && !absl::EndsWith(name, ".meta")) {
        paths.push_back(e.path().string());
      }
    }
    std::vector<std::pair<mode_t, gid_t>> out;
    for (const std::string& p : paths) {
      struct stat st {};
      EXPECT_EQ(::stat(p.c_str(), &st), 0) << p;
      out.emplace_back(st.st_mode & 07777, st.st_gid);
    }
    return out;
  }

  static std::vector<std::pair<mode_t, gid_t>> Expected(size_t n, mode_t socket_mode, gid_t gid) {
    std::vector<std::pair<mode_t, gid_t>> out = {{socket_mode, gid}};
    for (size_t i = 1; i < n; ++i) out.emplace_back(0400, ::getegid());
    return out;
  }
};

TEST_F(RegroupE2eTest, ARestartedAgentGivesOlderFilesAndItsSocketTheConfiguredGroupAndMode) {
  if (::geteuid() != 0) GTEST_SKIP() << "giving files another group needs root";
  ASSERT_NO_FATAL_FAILURE(RegisterAndPublish(test_support::GptJobSpec("gpt", "e2e", {"h0", "h1"})));
  const gid_t own = ::getegid();
  auto before = Files("h0");
  ASSERT_GT(before.size(), 1u) << "no shard files on h0";
  EXPECT_EQ(before, Expected(before.size(), 0660, own));

  ASSERT_NO_FATAL_FAILURE(
      RestartWith("h0", {"--worker-group", "4242", "--worker-socket-mode", "0600"}));
  EXPECT_EQ(Files("h0"), Expected(before.size(), 0600, 4242));
  absl::Status v = Verify(sockets_, job_id_, 1, contents_);
  EXPECT_TRUE(v.ok()) << v;

  // The group is taken away again: back to the agent's own.
  ASSERT_NO_FATAL_FAILURE(RestartWith("h0", {}));
  EXPECT_EQ(Files("h0"), Expected(before.size(), 0660, own));
  v = Verify(sockets_, job_id_, 1, contents_);
  EXPECT_TRUE(v.ok()) << v;
}

}  // namespace
}  // namespace reshard::agent::testing
