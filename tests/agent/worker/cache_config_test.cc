// --worker-cache-bytes (RESHARD_WORKER_CACHE_BYTES): the worker service's
// job cache bound in the agent's configuration.
#include <gtest/gtest.h>

#include <map>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "agent/process/config.h"
#include "agent/process/worker_service.h"

namespace reshard::agent {
namespace {

absl::StatusOr<AgentConfig> Parse(std::vector<std::string> extra,
                                  const std::map<std::string, std::string>& env = {}) {
  std::vector<std::string> args = {"--coordinator", "c:1", "--worker-socket", "/tmp/w",
                                   "--insecure"};
  args.insert(args.end(), extra.begin(), extra.end());
  return ParseAgentConfig(args, [&env](const char* name) -> const char* {
    auto it = env.find(name);
    return it == env.end() ? nullptr : it->second.c_str();
  });
}

TEST(WorkerCacheConfigTest, DefaultsTo64MiB) {
  absl::StatusOr<AgentConfig> c = Parse({});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->worker_cache_bytes, int64_t{64} << 20);
  EXPECT_EQ(c->worker_cache_bytes, WorkerServiceImpl::kDefaultCacheBytes);
}

TEST(WorkerCacheConfigTest, FlagWinsOverEnvironment) {
  absl::StatusOr<AgentConfig> c = Parse({}, {{"RESHARD_WORKER_CACHE_BYTES", "1048576"}});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->worker_cache_bytes, 1048576);
  c = Parse({"--worker-cache-bytes", "65536"}, {{"RESHARD_WORKER_CACHE_BYTES", "1048576"}});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->worker_cache_bytes, 65536);
}

TEST(WorkerCacheConfigTest, RefusesLessThan64KiBNamingTheFlag) {
  for (const char* bad : {"65535", "0", "-1", "lots"}) {
    absl::StatusOr<AgentConfig> c = Parse({"--worker-cache-bytes", bad});
    EXPECT_TRUE(absl::IsInvalidArgument(c.status())) << bad << ": " << c.status();
    EXPECT_TRUE(absl::StrContains(c.status().message(), "--worker-cache-bytes")) << c.status();
  }
  EXPECT_TRUE(absl::StrContains(AgentUsage(), "--worker-cache-bytes"));
}

}  // namespace
}  // namespace reshard::agent
