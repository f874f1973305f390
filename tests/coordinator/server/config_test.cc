// Unit tests of the coordinator's command line and configuration.
#include "services/coordinator/server/config.h"

#include <cctype>
#include <cstdio>
#include <fstream>
#include <map>
#include <ostream>
#include <set>
#include <sstream>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace reshard::coordinator {
namespace {

using ::testing::HasSubstr;

GetEnvFn Env(std::map<std::string, std::string> vars) {
  return [vars = std::move(vars)](const std::string& name) -> std::optional<std::string> {
    auto it = vars.find(name);
    if (it == vars.end()) return std::nullopt;
    return it->second;
  };
}

absl::StatusOr<CommandLine> Parse(std::vector<std::string> args,
                                  std::map<std::string, std::string> env = {}) {
  return ParseCommandLine(args, Env(std::move(env)));
}

TEST(ConfigTest, DefaultsWithDsnAndInsecure) {
  absl::StatusOr<CommandLine> cl = Parse({"--dsn", "dbname=x", "--insecure"});
  ASSERT_TRUE(cl.ok()) << cl.status();
  EXPECT_EQ(cl->command, CoordinatorCommand::kServe);
  EXPECT_FALSE(cl->help);
  const CoordinatorConfig& c = cl->config;
  EXPECT_EQ(c.dsn, "dbname=x");
  // Loopback unless told otherwise.
  EXPECT_EQ(c.listen, "127.0.0.1:7070");
  EXPECT_EQ(c.metrics_listen, "127.0.0.1:9464");
  EXPECT_TRUE(c.tls.insecure);
  EXPECT_EQ(c.lease_ms, 10000);
  EXPECT_EQ(c.max_spec_bytes, 64 << 20);
  EXPECT_EQ(c.log_level, LogSeverity::kInfo);
  // hostname:pid
  EXPECT_THAT(c.replica_id, HasSubstr(":"));
  EXPECT_EQ(c.replica_id, DefaultReplicaId());
}

TEST(ConfigTest, EveryFlagBothSpellings) {
  absl::StatusOr<CommandLine> cl =
      Parse({"serve", "--listen=127.0.0.1:0", "--dsn", "host=/tmp", "--metrics-listen", "[::1]:0",
             "--lease-ms=3000", "--transfer-timeout-ms", "60000", "--tick-ms=50",
             "--leader-retry-ms", "100", "--pool-size=3", "--max-spec-bytes", "4096",
             "--replica-id=r1", "--log-level", "debug", "--insecure=true", "--cost-link-mbit",
             "25000", "--cost-overhead-ms=0"});
  ASSERT_TRUE(cl.ok()) << cl.status();
  const CoordinatorConfig& c = cl->config;
  EXPECT_EQ(c.listen, "127.0.0.1:0");
  EXPECT_EQ(c.dsn, "host=/tmp");
  EXPECT_EQ(c.metrics_listen, "[::1]:0");
  EXPECT_EQ(c.lease_ms, 3000);
  EXPECT_EQ(c.transfer_timeout_ms, 60000);
  EXPECT_EQ(c.tick_ms, 50);
  EXPECT_EQ(c.cost_link_mbit, 25000);
  EXPECT_EQ(c.cost_overhead_ms, 0);
  EXPECT_EQ(c.leader_retry_ms, 100);
  EXPECT_EQ(c.pool_size, 3);
  EXPECT_EQ(c.max_spec_bytes, 4096);
  EXPECT_EQ(c.replica_id, "r1");
  EXPECT_EQ(c.log_level, LogSeverity::kDebug);
}

TEST(ConfigTest, StoreDeadlinesAndAgentReserve) {
  absl::StatusOr<CommandLine> defaults = Parse({"--insecure", "--dsn", "x"});
  ASSERT_TRUE(defaults.ok()) << defaults.status();
  EXPECT_EQ(defaults->config.pool_agent_reserve, 2);
  EXPECT_EQ(defaults->config.store_acquire_timeout_ms, 5000);
  EXPECT_EQ(defaults->config.store_statement_timeout_ms, 5000);
  EXPECT_EQ(defaults->config.store_connect_timeout_s, 5);
  absl::StatusOr<CommandLine> cl =
      Parse({"--insecure", "--dsn", "x", "--pool-size", "4", "--pool-agent-reserve=3",
             "--store-statement-timeout-ms", "1000", "--store-connect-timeout-s=2"},
            {{"RESHARD_STORE_ACQUIRE_TIMEOUT_MS", "750"}});
  ASSERT_TRUE(cl.ok()) << cl.status();
  EXPECT_EQ(cl->config.pool_agent_reserve, 3);
  EXPECT_EQ(cl->config.store_acquire_timeout_ms, 750);
  EXPECT_EQ(cl->config.store_statement_timeout_ms, 1000);
  EXPECT_EQ(cl->config.store_connect_timeout_s, 2);
  for (const char* name :
       {"--pool-agent-reserve", "--store-acquire-timeout-ms", "--store-statement-timeout-ms",
        "--store-connect-timeout-s", "RESHARD_STORE_STATEMENT_TIMEOUT_MS"}) {
    EXPECT_THAT(Usage(), HasSubstr(name));
  }
}

TEST(ConfigTest, EnvironmentFillsWhatFlagsLeaveAndFlagsWin) {
  absl::StatusOr<CommandLine> cl =
      Parse({"--lease-ms", "2000"}, {{"RESHARD_DSN", "dbname=env"},
                                     {"RESHARD_LEASE_MS", "9000"},
                                     {"RESHARD_LISTEN", "127.0.0.1:0"},
                                     {"RESHARD_REPLICA_ID", "from-env"},
                                     {"RESHARD_LOG_LEVEL", "warning"},
                                     {"RESHARD_INSECURE", "1"}});
  ASSERT_TRUE(cl.ok()) << cl.status();
  EXPECT_EQ(cl->config.dsn, "dbname=env");
  EXPECT_EQ(cl->config.lease_ms, 2000);
  EXPECT_EQ(cl->config.listen, "127.0.0.1:0");
  EXPECT_EQ(cl->config.replica_id, "from-env");
  EXPECT_EQ(cl->config.log_level, LogSeverity::kWarning);
}

TEST(ConfigTest, MigrateCommand) {
  absl::StatusOr<CommandLine> cl =
      Parse({"migrate", "--dsn=dbname=x"});  // no TLS: it listens nowhere
  ASSERT_TRUE(cl.ok()) << cl.status();
  EXPECT_EQ(cl->command, CoordinatorCommand::kMigrate);
}

TEST(ConfigTest, HelpSkipsValidation) {
  absl::StatusOr<CommandLine> cl = Parse({"--help"});
  ASSERT_TRUE(cl.ok()) << cl.status();
  EXPECT_TRUE(cl->help);
  const std::string usage = Usage();
  for (const char* name :
       {"--listen", "--dsn", "--metrics-listen", "--lease-ms", "--transfer-timeout-ms", "--tick-ms",
        "--leader-retry-ms", "--pool-size", "--max-spec-bytes", "--replica-id", "--log-level",
        "RESHARD_DSN", "migrate", "--tls-cert", "--tls-key", "--tls-ca", "RESHARD_TLS_CA",
        "--insecure", "--tls-reload-s"}) {
    EXPECT_THAT(usage, HasSubstr(name));
  }
}

struct BadCase {
  std::vector<std::string> args;
  std::map<std::string, std::string> env;
  std::string message_part;  // the message names the flag / variable and value
};

// Names the case in test listings (CTest shows the parameter).
void PrintTo(const BadCase& c, std::ostream* os) {
  std::string name;
  for (const std::string& a : c.args) name += a + "_";
  for (const auto& [k, v] : c.env) name += k + "=" + v + "_";
  for (char& ch : name) {
    if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
  }
  *os << (name.empty() ? std::string("no_args") : name);
}

class ConfigErrorTest : public ::testing::TestWithParam<BadCase> {};

TEST_P(ConfigErrorTest, InvalidArgumentNamingTheProblem) {
  const BadCase& c = GetParam();
  absl::StatusOr<CommandLine> cl = Parse(c.args, c.env);
  ASSERT_FALSE(cl.ok());
  EXPECT_EQ(cl.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(cl.status().message()), HasSubstr(c.message_part));
}

INSTANTIATE_TEST_SUITE_P(
    Cases, ConfigErrorTest,
    ::testing::Values(
        BadCase{{"--insecure"}, {}, "--dsn"}, BadCase{{"--insecure", "--dsn="}, {}, "--dsn"},
        BadCase{{"--insecure", "--dsn", "x", "--listen", "nohost"}, {}, "nohost"},
        BadCase{{"--insecure", "--dsn", "x", "--listen", ":7070"}, {}, "--listen"},
        BadCase{{"--insecure", "--dsn", "x", "--listen", "h:70000"}, {}, "h:70000"},
        BadCase{{"--insecure", "--dsn", "x", "--metrics-listen", "h:-1"}, {}, "--metrics-listen"},
        BadCase{{"--insecure", "--dsn", "x", "--metrics-listen", "::1:80"}, {}, "brackets"},
        BadCase{{"--insecure", "--dsn", "x", "--listen", "a:80", "--metrics-listen", "b:80"},
                {},
                "same port"},
        BadCase{{"--insecure", "--dsn", "x", "--lease-ms", "abc"}, {}, "--lease-ms = \"abc\""},
        BadCase{{"--insecure", "--dsn", "x", "--lease-ms", "5"}, {}, "--lease-ms"},
        BadCase{{"--insecure", "--dsn", "x", "--tick-ms", "0"}, {}, "--tick-ms"},
        BadCase{{"--insecure", "--dsn", "x", "--tick-ms", "5000", "--lease-ms", "1000"},
                {},
                "--tick-ms"},
        BadCase{{"--insecure", "--dsn", "x", "--pool-size", "0"}, {}, "--pool-size"},
        BadCase{{"--insecure", "--dsn", "x", "--cost-link-mbit", "0"}, {}, "--cost-link-mbit"},
        BadCase{{"--insecure", "--dsn", "x", "--cost-overhead-ms", "-1"}, {}, "--cost-overhead-ms"},
        BadCase{{"--insecure", "--dsn", "x", "--pool-size", "2", "--pool-agent-reserve", "2"},
                {},
                "--pool-agent-reserve (RESHARD_POOL_AGENT_RESERVE) = 2"},
        BadCase{
            {"--insecure", "--dsn", "x", "--pool-agent-reserve", "-1"}, {}, "--pool-agent-reserve"},
        BadCase{{"--insecure", "--dsn", "x", "--store-statement-timeout-ms", "10"},
                {},
                "--store-statement-timeout-ms"},
        BadCase{{"--insecure", "--dsn", "x", "--store-connect-timeout-s", "1"},
                {},
                "--store-connect-timeout-s"},
        BadCase{{"--insecure", "--dsn", "x"},
                {{"RESHARD_STORE_ACQUIRE_TIMEOUT_MS", "0"}},
                "--store-acquire-timeout-ms"},
        BadCase{{"--insecure", "--dsn", "x", "--max-spec-bytes", "10"}, {}, "--max-spec-bytes"},
        BadCase{{"--insecure", "--dsn", "x", "--transfer-timeout-ms", "99999999999999999999"},
                {},
                "--transfer-timeout-ms"},
        BadCase{{"--insecure", "--dsn", "x", "--log-level", "loud"}, {}, "loud"},
        BadCase{{"--insecure", "--dsn", "x", "--replica-id", "a b"}, {}, "--replica-id"},
        BadCase{{"--insecure", "--dsn", "x", "--bogus", "1"}, {}, "--bogus"},
        BadCase{{"--insecure", "--dsn", "x", "--lease-ms"}, {}, "--lease-ms"},
        BadCase{{"--insecure", "--dsn", "x", "--dsn", "y"}, {}, "twice"},
        BadCase{{"frobnicate"}, {}, "frobnicate"},
        BadCase{{"--insecure", "--dsn", "x", "stray"}, {}, "stray"},
        BadCase{{"--insecure", "--dsn", "x"}, {{"RESHARD_POOL_SIZE", "many"}}, "RESHARD_POOL_SIZE"},
        BadCase{{"--insecure", "--dsn", "x"}, {{"RESHARD_LEASE_MS", "1"}}, "RESHARD_LEASE_MS"},
        // Transport security: TLS unless --insecure, files named and readable.
        BadCase{{"--dsn", "x"}, {}, "--tls-ca (RESHARD_TLS_CA) is required"},
        BadCase{{"--dsn", "x", "--tls-ca", "/nonexistent/ca.pem"}, {}, "--tls-cert"},
        BadCase{{"--dsn", "x", "--tls-ca", "/nonexistent/ca.pem", "--tls-cert", "/nonexistent/c",
                 "--tls-key", "/nonexistent/k"},
                {},
                "\"/nonexistent/c"},
        BadCase{{"--dsn", "x", "--insecure", "--tls-ca", "/etc/hostname"}, {}, "contradict"},
        BadCase{{"--dsn", "x", "--insecure=maybe"}, {}, "--insecure = \"maybe\""},
        BadCase{{"--dsn", "x"}, {{"RESHARD_INSECURE", "sure"}}, "RESHARD_INSECURE"}));

TEST(ConfigTest, TlsFilesFromFlagsAndEnvironment) {
  // Any readable files pass the configuration check (their PEM is read by gRPC).
  const std::string file = ::testing::TempDir() + "/config_test_tls.pem";
  FILE* f = std::fopen(file.c_str(), "w");
  ASSERT_NE(f, nullptr);
  std::fputs("pem", f);
  std::fclose(f);
  absl::StatusOr<CommandLine> cl = Parse({"--dsn", "x", "--tls-cert", file, "--tls-key", file},
                                         {{"RESHARD_TLS_CA", file}, {"RESHARD_TLS_RELOAD_S", "2"}});
  ASSERT_TRUE(cl.ok()) << cl.status();
  EXPECT_FALSE(cl->config.tls.insecure);
  EXPECT_EQ(cl->config.tls.cert, file);
  EXPECT_EQ(cl->config.tls.key, file);
  EXPECT_EQ(cl->config.tls.ca, file);
  EXPECT_EQ(cl->config.tls.reload_seconds, 2u);
}

TEST(SplitHostPortTest, Forms) {
  std::string host;
  int port = -1;
  ASSERT_TRUE(SplitHostPort("127.0.0.1:0", "--listen", &host, &port).ok());
  EXPECT_EQ(host, "127.0.0.1");
  EXPECT_EQ(port, 0);
  ASSERT_TRUE(SplitHostPort("[::]:7070", "--listen", &host, &port).ok());
  EXPECT_EQ(host, "[::]");
  EXPECT_EQ(port, 7070);
  ASSERT_TRUE(SplitHostPort("localhost:65535", "--listen", &host, &port).ok());
  EXPECT_EQ(port, 65535);
}

// ---- The declared table itself (issue 33).

// Every row's flag and variable are in --help, with its help text.
TEST(ConfigTableTest, UsageListsEveryRow) {
  const std::string usage = Usage();
  std::set<std::string> flags;
  for (const SettingInfo& row : CoordinatorSettings()) {
    EXPECT_TRUE(flags.insert(row.flag).second) << "--" << row.flag << " twice in the table";
    EXPECT_THAT(usage, HasSubstr("--" + row.flag + " "));
    EXPECT_THAT(usage, HasSubstr("env " + row.env));
    EXPECT_THAT(usage, HasSubstr(row.help));
  }
  EXPECT_THAT(usage, HasSubstr("env RESHARD_LEASE_MS, default 10000"));
  EXPECT_THAT(usage, HasSubstr("env RESHARD_REPLICA_ID, default hostname:pid"));
  EXPECT_THAT(usage, HasSubstr("env RESHARD_LOG_LEVEL, default info"));
  EXPECT_THAT(usage, HasSubstr("--insecure             env RESHARD_INSECURE, default false"));
}

// The machinery's messages, exactly: InvalidArgument naming the flag (or
// variable) and the value.
TEST(ConfigTableTest, ErrorsNameTheFlagAndValue) {
  struct Case {
    std::vector<std::string> args;
    std::map<std::string, std::string> env;
    std::string message;
  };
  for (const Case& c : std::vector<Case>{
           {{"--insecure", "--dsn", "x", "--bogus", "1"}, {}, "unknown flag --bogus (see --help)"},
           {{"--insecure", "--dsn", "x", "--lease-ms", "5"},
            {},
            "--lease-ms (RESHARD_LEASE_MS) = 5: must be between 100 and 86400000"},
           {{"--insecure", "--dsn", "x", "--lease-ms=abc"},
            {},
            "--lease-ms = \"abc\": not an integer"},
           {{"--insecure", "--dsn", "x"},
            {{"RESHARD_POOL_SIZE", "many"}},
            "RESHARD_POOL_SIZE = \"many\": not an integer"},
           {{"--insecure", "--dsn", "x", "--retention-retired-age-ms", "1000"},
            {},
            "--retention-retired-age-ms (RESHARD_RETENTION_RETIRED_AGE_MS) = 1000: must be "
            "between 30000 and 31536000000"},
           {{"--insecure", "--dsn", "x", "--log-level", "loud"},
            {},
            "--log-level = \"loud\": expected debug, info, warning or error"},
           {{"--insecure", "--dsn", "x", "--listen", "h:70000"},
            {},
            "--listen (RESHARD_LISTEN) = \"h:70000\": port must be an integer between 0 and "
            "65535 (expected host:port)"},
           {{"--insecure", "--dsn", "x", "--listen", "a b:80"},
            {},
            "--listen (RESHARD_LISTEN) = \"a b:80\": the host has '/' or spaces (expected "
            "host:port)"},
       }) {
    absl::StatusOr<CommandLine> cl = Parse(c.args, c.env);
    EXPECT_EQ(cl.status().code(), absl::StatusCode::kInvalidArgument) << cl.status();
    EXPECT_EQ(cl.status().message(), c.message);
  }
}

// README's table of the coordinator's flags ("Running the coordinator")
// lists every row of the table with its variable.
TEST(ConfigTableTest, ReadmeListsEveryFlag) {
  std::ifstream in(std::string(RESHARD_SOURCE_DIR) + "/README.md");
  ASSERT_TRUE(in.good());
  std::stringstream text;
  text << in.rdbuf();
  const std::string readme = text.str();
  const size_t start = readme.find("## Running the coordinator");
  ASSERT_NE(start, std::string::npos);
  const std::string section = readme.substr(start, readme.find("\n## ", start + 1) - start);
  for (const SettingInfo& row : CoordinatorSettings()) {
    EXPECT_THAT(section, HasSubstr("| `--" + row.flag + "` | `" + row.env + "` |"))
        << "README.md, \"Running the coordinator\": no row for --" << row.flag;
  }
}

}  // namespace
}  // namespace reshard::coordinator
