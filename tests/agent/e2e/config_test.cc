// reshard-agent's configuration: flags, environment, validation.
#include "agent/process/config.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <string>

#include "absl/strings/str_cat.h"

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

// ---- The declared table itself (issue 33): every row parsed, shown and
// documented; the messages of the machinery every row shares.

// Every field of AgentConfig by name, as text.
std::map<std::string, std::string> Fields(const AgentConfig& c) {
  return {{"host_id", c.host_id},
          {"coordinator", c.coordinator},
          {"worker_socket", c.worker_socket},
          {"address", c.address},
          {"shm_dir", c.shm_dir},
          {"memory_limit_bytes", absl::StrCat(c.memory_limit_bytes)},
          {"spare_bytes", absl::StrCat(c.spare_bytes)},
          {"keep_dropped_ms", absl::StrCat(c.keep_dropped_ms)},
          {"probe_bytes", absl::StrCat(c.probe_bytes)},
          {"ucx_net_devices", c.ucx_net_devices},
          {"ucx_tls", c.ucx_tls},
          {"heartbeat_ms", absl::StrCat(c.heartbeat_ms)},
          {"peer_wait_ms", absl::StrCat(c.peer_wait_ms)},
          {"copy_threads", absl::StrCat(c.copy_threads)},
          {"worker_cache_bytes", absl::StrCat(c.worker_cache_bytes)},
          {"log_level", c.log_level},
          {"metrics_listen", c.metrics_listen},
          {"tls.cert", c.tls.cert},
          {"tls.key", c.tls.key},
          {"tls.ca", c.tls.ca},
          {"tls.insecure", absl::StrCat(c.tls.insecure)},
          {"tls.reload_seconds", absl::StrCat(c.tls.reload_seconds)},
          {"worker_gid", absl::StrCat(c.worker_gid)},
          {"worker_group", c.worker_group},
          {"worker_socket_mode", absl::StrCat(c.worker_socket_mode)},
          {"device", c.device},
          {"device_memory_limit_bytes", absl::StrCat(c.device_memory_limit_bytes)},
          {"device_comm", absl::StrCat(c.device_comm)},
          {"device_ipc", absl::StrCat(c.device_ipc)}};
}

// A readable file for the TLS flags (their PEM is read by gRPC, not here).
std::string PemFile(const std::string& name) {
  const std::string path = ::testing::TempDir() + "/agent_config_test_" + name + ".pem";
  FILE* f = std::fopen(path.c_str(), "w");
  EXPECT_NE(f, nullptr) << path;
  if (f != nullptr) {
    std::fputs("pem", f);
    std::fclose(f);
  }
  return path;
}

// One row's flag, a value other than its default, and the fields (with
// their values as Fields() shows them) that the value changes.
struct RowCase {
  std::string flag;
  std::string value;
  std::map<std::string, std::string> changes;
};

std::vector<RowCase> RowCases(const std::string& pem) {
  return {
      {"host-id", "h9", {{"host_id", "h9"}}},
      {"coordinator", "other:2", {{"coordinator", "other:2"}}},
      {"worker-socket",
       "unix:/tmp/w2",
       {{"worker_socket", "/tmp/w2"}, {"address", "unix:/tmp/w2"}}},
      {"address", "10.0.0.1:7", {{"address", "10.0.0.1:7"}}},
      {"shm-dir", "/tmp/shm2", {{"shm_dir", "/tmp/shm2"}}},
      {"memory-limit-bytes", "12345", {{"memory_limit_bytes", "12345"}}},
      {"spare-bytes", "0", {{"spare_bytes", "0"}}},
      {"keep-dropped-ms", "0", {{"keep_dropped_ms", "0"}}},
      {"probe-bytes", "0", {{"probe_bytes", "0"}}},
      {"ucx-net-devices", "lo", {{"ucx_net_devices", "lo"}}},
      {"ucx-tls", "tcp,self", {{"ucx_tls", "tcp,self"}}},
      {"heartbeat-ms", "250", {{"heartbeat_ms", "250"}}},
      {"peer-wait-ms", "3000", {{"peer_wait_ms", "3000"}}},
      {"copy-threads", "7", {{"copy_threads", "7"}}},
      {"worker-cache-bytes", "65536", {{"worker_cache_bytes", "65536"}}},
      {"log-level", "debug", {{"log_level", "debug"}}},
      {"metrics-listen", "127.0.0.1:0", {{"metrics_listen", "127.0.0.1:0"}}},
      {"tls-cert", pem, {{"tls.cert", pem}}},
      {"tls-key", pem, {{"tls.key", pem}}},
      {"tls-ca", pem, {{"tls.ca", pem}}},
      {"worker-group", "4242", {{"worker_group", "4242"}, {"worker_gid", "4242"}}},
      {"worker-socket-mode", "0600", {{"worker_socket_mode", "384"}}},
      {"device", "fake:2", {{"device", "fake:2"}}},
      {"device-memory-limit-bytes", "1024", {{"device_memory_limit_bytes", "1024"}}},
      {"device-comm", "auto", {{"device_comm", "1"}}},
      {"device-ipc", "auto", {{"device_ipc", "1"}}},
  };
}

// The command line every row case starts from: TLS files, so that the TLS
// rows can change them.
std::vector<std::string> TlsBase() {
  return {"--coordinator", "c:1",           "--worker-socket", "/tmp/w",
          "--tls-cert",    PemFile("cert"), "--tls-key",       PemFile("key"),
          "--tls-ca",      PemFile("ca"),   "--host-id",       "h1"};
}

// Every AgentConfig field is set by exactly one row: each row's flag alone
// changes its own fields (and only those) from the base, every row of the
// table has a case here, and every field some row.
TEST(AgentConfigTableTest, EachRowSetsExactlyItsFields) {
  const std::string pem = PemFile("other");
  const std::map<std::string, std::string> env = {{"RESHARD_INSECURE", "0"}};
  absl::StatusOr<AgentConfig> base = Parse(TlsBase(), env);
  ASSERT_TRUE(base.ok()) << base.status();
  const std::map<std::string, std::string> before = Fields(*base);
  std::set<std::string> covered_flags, covered_fields;
  for (const RowCase& row : RowCases(pem)) {
    std::vector<std::string> args = TlsBase();
    args.insert(args.end(), {"--" + row.flag, row.value});
    absl::StatusOr<AgentConfig> c = Parse(args, env);
    ASSERT_TRUE(c.ok()) << row.flag << ": " << c.status();
    std::map<std::string, std::string> expected = before;
    for (const auto& [field, value] : row.changes) {
      ASSERT_TRUE(expected.count(field)) << field;
      EXPECT_NE(before.at(field), value) << row.flag << " must change " << field;
      expected[field] = value;
      covered_fields.insert(field);
    }
    EXPECT_EQ(Fields(*c), expected) << "--" << row.flag << " " << row.value;
    covered_flags.insert(row.flag);
  }
  // --insecure: the one boolean flag; it changes tls.insecure (and takes no
  // files).
  absl::StatusOr<AgentConfig> insecure =
      Parse({"--coordinator", "c:1", "--worker-socket", "/tmp/w", "--host-id", "h1", "--insecure"},
            {{"RESHARD_INSECURE", "0"}});
  ASSERT_TRUE(insecure.ok()) << insecure.status();
  std::map<std::string, std::string> expected = before;
  expected["tls.cert"] = expected["tls.key"] = expected["tls.ca"] = "";
  expected["tls.insecure"] = "1";
  EXPECT_EQ(Fields(*insecure), expected);
  covered_flags.insert("insecure");
  covered_fields.insert("tls.insecure");
  // The retired row is refused whatever its value.
  covered_flags.insert("shard-file-mode");

  std::set<std::string> table_flags;
  for (const SettingInfo& row : AgentSettings()) {
    EXPECT_TRUE(table_flags.insert(row.flag).second) << "--" << row.flag << " twice in the table";
  }
  EXPECT_EQ(covered_flags, table_flags);
  std::set<std::string> all_fields;
  for (const auto& [field, value] : before) all_fields.insert(field);
  all_fields.erase("tls.reload_seconds");  // the coordinator's setting; agents keep the default
  EXPECT_EQ(covered_fields, all_fields);
}

// One command line naming every flag (both spellings) sets every field to
// exactly its value.
TEST(AgentConfigTableTest, FullCommandLineSetsEveryField) {
  const std::string pem = PemFile("other");
  const std::map<std::string, std::string> env = {{"RESHARD_INSECURE", "0"}};
  absl::StatusOr<AgentConfig> base = Parse(TlsBase(), env);
  ASSERT_TRUE(base.ok()) << base.status();
  std::map<std::string, std::string> expected = Fields(*base);
  std::vector<std::string> args;
  bool equals = false;
  for (const RowCase& row : RowCases(pem)) {
    if (equals) {
      args.push_back("--" + row.flag + "=" + row.value);
    } else {
      args.insert(args.end(), {"--" + row.flag, row.value});
    }
    equals = !equals;
    for (const auto& [field, value] : row.changes) expected[field] = value;
  }
  // worker-socket sets address unless --address is given: it is.
  expected["address"] = "10.0.0.1:7";
  absl::StatusOr<AgentConfig> c = Parse(args, env);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(Fields(*c), expected);
  EXPECT_EQ(c->host_id, "h9");
  EXPECT_EQ(c->worker_socket, "/tmp/w2");
  EXPECT_EQ(c->memory_limit_bytes, 12345);
  EXPECT_EQ(c->worker_socket_mode, 0600u);
  EXPECT_EQ(c->worker_gid, 4242);
  EXPECT_TRUE(c->device_comm);
  EXPECT_TRUE(c->device_ipc);
}

// Every row's flag and variable are in the usage text, with its default.
TEST(AgentConfigTableTest, UsageListsEveryRow) {
  const std::string usage = AgentUsage();
  for (const SettingInfo& row : AgentSettings()) {
    EXPECT_NE(usage.find("--" + row.flag + " "), std::string::npos) << row.flag;
    EXPECT_NE(usage.find("env " + row.env), std::string::npos) << row.env;
    EXPECT_NE(usage.find(row.help), std::string::npos) << row.flag;
  }
  EXPECT_NE(usage.find("--memory-limit-bytes N"), std::string::npos) << usage;
  EXPECT_NE(usage.find("env RESHARD_MEMORY_LIMIT_BYTES, default 68719476736"), std::string::npos)
      << usage;
  EXPECT_NE(usage.find("env RESHARD_WORKER_SOCKET_MODE, default 0660"), std::string::npos) << usage;
  EXPECT_NE(usage.find("env RESHARD_DEVICE_COMM, default none"), std::string::npos) << usage;
  EXPECT_NE(usage.find("env RESHARD_SHM_DIR, default /dev/shm"), std::string::npos) << usage;
}

// The machinery's messages: InvalidArgument naming the flag (or variable)
// and the value.
TEST(AgentConfigTableTest, ErrorsNameTheFlagAndValue) {
  const std::vector<std::string> base = {"--coordinator", "c:1", "--worker-socket", "/tmp/w"};
  auto with = [&](std::vector<std::string> extra, std::map<std::string, std::string> env = {}) {
    extra.insert(extra.begin(), base.begin(), base.end());
    return Parse(extra, env).status();
  };
  struct Case {
    absl::Status status;
    std::string message;
  };
  for (const Case& c : std::vector<Case>{
           {with({"--bogus", "1"}), "unknown flag --bogus (see --help)"},
           {with({"--copy-threads", "0"}),
            "--copy-threads (RESHARD_COPY_THREADS) = 0: must be between 1 and 256"},
           {with({"--peer-wait-ms=99"}),
            "--peer-wait-ms (RESHARD_PEER_WAIT_MS) = 99: must be between 100 and 3600000"},
           {with({"--copy-threads=x"}), "--copy-threads = \"x\": not an integer"},
           {with({}, {{"RESHARD_COPY_THREADS", "x"}}),
            "RESHARD_COPY_THREADS = \"x\": not an integer"},
           {with({"--device-comm", "nccl"}), "--device-comm = \"nccl\": expected auto or none"},
           {with({"--log-level", "loud"}),
            "--log-level = \"loud\": expected debug, info, warning or error"},
           {with({"--worker-socket-mode", "0860"}),
            "--worker-socket-mode = \"0860\": expected an octal mode such as 0660"},
           {with({"--metrics-listen", "h:70000"}),
            "--metrics-listen (RESHARD_METRICS_LISTEN) = \"h:70000\": port must be an integer "
            "between 0 and 65535 (expected host:port)"},
           {with({"--heartbeat-ms"}), "flag --heartbeat-ms needs a value"},
           {with({"stray"}), "unexpected argument \"stray\""},
           {Parse({"--worker-socket", "/tmp/w"}).status(),
            "--coordinator (RESHARD_COORDINATOR) is required (host:port)"},
       }) {
    EXPECT_EQ(c.status.code(), absl::StatusCode::kInvalidArgument) << c.status;
    EXPECT_EQ(c.status.message(), c.message);
  }
  // A flag given twice: the last wins (as before the table); an empty
  // variable counts as unset.
  absl::StatusOr<AgentConfig> twice = Parse({"--coordinator", "c:1", "--worker-socket", "/tmp/w",
                                             "--copy-threads", "2", "--copy-threads", "3"},
                                            {{"RESHARD_HEARTBEAT_MS", ""}});
  ASSERT_TRUE(twice.ok()) << twice.status();
  EXPECT_EQ(twice->copy_threads, 3);
  EXPECT_EQ(twice->heartbeat_ms, 0);
}

// README's table of the agent's flags ("Running an agent") lists every row
// of the table with its variable.
TEST(AgentConfigTableTest, ReadmeListsEveryFlag) {
  std::ifstream in(std::string(RESHARD_SOURCE_DIR) + "/README.md");
  ASSERT_TRUE(in.good());
  std::stringstream text;
  text << in.rdbuf();
  const std::string readme = text.str();
  const size_t start = readme.find("## Running an agent");
  ASSERT_NE(start, std::string::npos);
  const std::string section = readme.substr(start, readme.find("\n## ", start + 1) - start);
  for (const SettingInfo& row : AgentSettings()) {
    EXPECT_NE(section.find("| `--" + row.flag + "` | `" + row.env + "` |"), std::string::npos)
        << "README.md, \"Running an agent\": no row for --" << row.flag << " (" << row.env << ")";
  }
}

}  // namespace
}  // namespace reshard::agent
