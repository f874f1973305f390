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
    // Not about TLS (agents with certificates: tests/client, deploy/local).
    if (it == env.end() && std::string(name) == "RESHARD_INSECURE") return "1";
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
  EXPECT_TRUE(absl::IsInvalidArgument(with({"--spare-bytes", "-1"})));
  EXPECT_TRUE(absl::IsInvalidArgument(with({"--copy-threads", "x"})));
  EXPECT_TRUE(absl::IsInvalidArgument(with({"--log-level", "loud"})));
  EXPECT_TRUE(absl::IsInvalidArgument(with({"--host-id", "a/b"})));
  EXPECT_TRUE(absl::IsInvalidArgument(with({"--heartbeat-ms"})));
}

TEST(AgentConfigTest, WorkerGroupAndModes) {
  const std::vector<std::string> base = {"--coordinator", "c:1", "--worker-socket", "/tmp/w"};
  absl::StatusOr<AgentConfig> c = Parse(base);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->worker_gid, -1);  // the agent's own group
  EXPECT_EQ(c->worker_socket_mode, 0660u);

  std::vector<std::string> args = base;
  args.insert(args.end(), {"--worker-group", "4242", "--worker-socket-mode", "0666"});
  c = Parse(args);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->worker_gid, 4242);
  EXPECT_EQ(c->worker_socket_mode, 0666u);
  // Retired (issue 19): shard files are the agent's alone.
  absl::Status retired = Parse(base, {{"RESHARD_SHARD_FILE_MODE", "640"}}).status();
  EXPECT_TRUE(absl::IsInvalidArgument(retired)) << retired;
  EXPECT_NE(retired.message().find("retired"), absl::string_view::npos) << retired;

  c = Parse(base, {{"RESHARD_WORKER_GROUP", "root"}});  // a name
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->worker_gid, 0);

  auto with = [&](std::vector<std::string> extra) {
    extra.insert(extra.begin(), base.begin(), base.end());
    return Parse(extra).status();
  };
  EXPECT_TRUE(absl::IsInvalidArgument(with({"--worker-group", "no-such-group-xyz"})));
  EXPECT_TRUE(absl::IsInvalidArgument(with({"--worker-socket-mode", "0860"})));
  EXPECT_TRUE(absl::IsInvalidArgument(with({"--worker-socket-mode", "4777"})));
  EXPECT_TRUE(absl::IsInvalidArgument(with({"--shard-file-mode", "0600"})));
}

TEST(AgentConfigTest, MetricsListen) {
  const std::vector<std::string> base = {"--coordinator", "c:1", "--worker-socket", "/tmp/w"};
  absl::StatusOr<AgentConfig> off = Parse(base);
  ASSERT_TRUE(off.ok()) << off.status();
  EXPECT_EQ(off->metrics_listen, "");  // disabled by default

  absl::StatusOr<AgentConfig> env = Parse(base, {{"RESHARD_METRICS_LISTEN", "0.0.0.0:9465"}});
  ASSERT_TRUE(env.ok()) << env.status();
  EXPECT_EQ(env->metrics_listen, "0.0.0.0:9465");

  std::vector<std::string> args = base;
  args.insert(args.end(), {"--metrics-listen=[::1]:0"});
  absl::StatusOr<AgentConfig> flag = Parse(args, {{"RESHARD_METRICS_LISTEN", "0.0.0.0:9465"}});
  ASSERT_TRUE(flag.ok()) << flag.status();
  EXPECT_EQ(flag->metrics_listen, "[::1]:0");  // the flag wins

  for (const std::string bad : {"9465", "host:", ":9465", "h:70000", "h:x", "::1:9", "[::1]"}) {
    std::vector<std::string> a = base;
    a.insert(a.end(), {"--metrics-listen", bad});
    absl::Status s = Parse(a).status();
    EXPECT_TRUE(absl::IsInvalidArgument(s)) << bad << ": " << s;
    // The message names the flag and the value.
    EXPECT_NE(s.message().find("--metrics-listen"), std::string::npos) << s;
    EXPECT_NE(s.message().find("\"" + bad + "\""), std::string::npos) << s;
  }
}

TEST(AgentConfigTest, DeviceComm) {
  const std::vector<std::string> base = {"--coordinator", "c:1", "--worker-socket", "/tmp/w"};
  absl::StatusOr<AgentConfig> c = Parse(base);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_FALSE(c->device_comm);  // opt-in
  c = Parse(base, {{"RESHARD_DEVICE_COMM", "auto"}});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_TRUE(c->device_comm);
  std::vector<std::string> args = base;
  args.insert(args.end(), {"--device-comm", "none"});
  c = Parse(args, {{"RESHARD_DEVICE_COMM", "auto"}});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_FALSE(c->device_comm);  // the flag wins
  args = base;
  args.insert(args.end(), {"--device-comm", "nccl"});
  absl::Status s = Parse(args).status();
  EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;
  EXPECT_NE(s.message().find("--device-comm"), std::string::npos) << s;
  EXPECT_NE(s.message().find("\"nccl\""), std::string::npos) << s;
}

TEST(AgentConfigTest, DeviceIpc) {
  const std::vector<std::string> base = {"--coordinator", "c:1", "--worker-socket", "/tmp/w"};
  absl::StatusOr<AgentConfig> c = Parse(base);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_FALSE(c->device_ipc);  // opt-in
  c = Parse(base, {{"RESHARD_DEVICE_IPC", "auto"}});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_TRUE(c->device_ipc);
  std::vector<std::string> args = base;
  args.insert(args.end(), {"--device-ipc", "none"});
  c = Parse(args, {{"RESHARD_DEVICE_IPC", "auto"}});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_FALSE(c->device_ipc);  // the flag wins
  args = base;
  args.insert(args.end(), {"--device-ipc", "cuda"});
  absl::Status s = Parse(args).status();
  EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;
  EXPECT_NE(s.message().find("--device-ipc"), std::string::npos) << s;
  EXPECT_NE(s.message().find("\"cuda\""), std::string::npos) << s;
}

TEST(AgentConfigTest, PeerWait) {
  const std::vector<std::string> base = {"--coordinator", "c:1", "--worker-socket", "/tmp/w"};
  absl::StatusOr<AgentConfig> c = Parse(base);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->peer_wait_ms, 60000);
  c = Parse(base, {{"RESHARD_PEER_WAIT_MS", "3000"}});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->peer_wait_ms, 3000);
  std::vector<std::string> args = base;
  args.insert(args.end(), {"--peer-wait-ms", "99"});
  absl::Status s = Parse(args).status();
  EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;
  EXPECT_NE(s.message().find("peer-wait-ms"), std::string::npos) << s;
}

}  // namespace
}  // namespace reshard::agent
