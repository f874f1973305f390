// reshard-agent's configuration: flags, environment, validation.
#include "agent/process/config.h"

#include <gtest/gtest.h>

#include <map>
#include <string>

namespace reshard::agent {
namespace {

absl::StatusOr<AgentConfig> Parse(const std::vector<std::string>& args,
                                  const std::map<std::string, std::string>& env = {}) {
  return ParseAgentConfig(args, [&env](const char* name) -> const char* {
    auto it = env.find(name);
    return it == env.end() ? nullptr : it->second.c_str();
  });
}

TEST(AgentConfigTest, FlagsWinOverEnvironment) {
  absl::StatusOr<AgentConfig> c = Parse({"--host-id", "h7", "--coordinator=c:1", "--worker-socket",
                                         "/tmp/w.sock", "--heartbeat-ms", "250"},
                                        {{"RESHARD_HOST_ID", "env-host"},
                                         {"UCX_NET_DEVICES", "lo"},
                                         {"RESHARD_SHM_DIR", "/tmp/shm"}});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->host_id, "h7");
  EXPECT_EQ(c->coordinator, "c:1");
  EXPECT_EQ(c->worker_socket, "/tmp/w.sock");
  EXPECT_EQ(c->address, "unix:/tmp/w.sock");
  EXPECT_EQ(c->heartbeat_ms, 250);
  EXPECT_EQ(c->ucx_net_devices, "lo");
  EXPECT_EQ(c->shm_dir, "/tmp/shm");
}

TEST(AgentConfigTest, RefusesBadInput) {
  const std::vector<std::string> base = {"--coordinator", "c:1", "--worker-socket", "/tmp/w"};
  auto with = [&](std::vector<std::string> extra) {
    extra.insert(extra.begin(), base.begin(), base.end());
    return Parse(extra).status();
  };
  EXPECT_TRUE(absl::IsInvalidArgument(Parse({"--worker-socket", "/tmp/w"}).status()));
  EXPECT_TRUE(absl::IsInvalidArgument(Parse({"--coordinator", "c:1"}).status()));
  EXPECT_TRUE(absl::IsInvalidArgument(with({"--unknown", "1"})));
  EXPECT_TRUE(absl::IsInvalidArgument(with({"--memory-limit-bytes", "0"})));
  EXPECT_TRUE(absl::IsInvalidArgument(with({"--copy-threads", "x"})));
  EXPECT_TRUE(absl::IsInvalidArgument(with({"--log-level", "loud"})));
  EXPECT_TRUE(absl::IsInvalidArgument(with({"--host-id", "a/b"})));
  EXPECT_TRUE(absl::IsInvalidArgument(with({"--heartbeat-ms"})));
}

}  // namespace
}  // namespace reshard::agent
