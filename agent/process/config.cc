#include "agent/process/config.h"

#include <grp.h>
#include <unistd.h>

#include <cstdlib>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace reshard::agent {
namespace {

using C = AgentConfig;
constexpr int64_t kMaxBytes = int64_t{1} << 50;

// A group name or number.
absl::Status ResolveGroup(const std::string& text, int64_t* gid) {
  int64_t v = 0;
  if (absl::SimpleAtoi(text, &v) && v >= 0 && v < (int64_t{1} << 32) - 1) {
    *gid = v;
    return absl::OkStatus();
  }
  std::vector<char> buf(16384);
  struct group g{};
  struct group* found = nullptr;
  const int err = ::getgrnam_r(text.c_str(), &g, buf.data(), buf.size(), &found);
  if (err != 0 || found == nullptr) return absl::InvalidArgumentError("no such group");
  *gid = found->gr_gid;
  return absl::OkStatus();
}

// An octal file mode of at most 0777 (no set-id or sticky bits).
absl::Status ParseMode(const std::string& text, uint32_t* out) {
  uint32_t v = 0;
  if (text.empty() || text.size() > 4 || text.find_first_not_of("01234567") != std::string::npos ||
      (v = static_cast<uint32_t>(std::strtoul(text.c_str(), nullptr, 8))) > 0777) {
    return absl::InvalidArgumentError("expected an octal mode such as 0660");
  }
  *out = v;
  return absl::OkStatus();
}

// A string the agent cannot run without: "--flag (ENV) is required (what)".
Setting<C> Required(Setting<C> s, std::string what) {
  s.default_text = "(required)";
  s.check = [what = std::move(what), field = s.show](const C& c, const std::string& name) {
    if (!field(c).empty()) return absl::OkStatus();
    return absl::InvalidArgumentError(absl::StrCat(name, " is required (", what, ")"));
  };
  return s;
}

// Every flag of reshard-agent: its variable, help, field, range and default
// (AgentConfig's). Parsing, the environment fallback, AgentUsage() and the
// checks all read this table.
const ConfigTable<C>& Table() {
  static const auto* const kTable = new ConfigTable<C>(
      {
          [] {
            Setting<C> s =
                StringSetting<C>("host-id", "RESHARD_HOST_ID",
                                 "the host's name in layouts and placements", &C::host_id, "ID");
            s.default_text = "hostname";
            s.check = [](const C& c, const std::string& name) {
              if (c.host_id.empty()) return absl::InvalidArgumentError(name + " is required");
              if (c.host_id.find_first_of("/ \t\n") == std::string::npos) return absl::OkStatus();
              return absl::InvalidArgumentError(
                  absl::StrFormat("%s = \"%s\": must not contain '/' or spaces", name, c.host_id));
            };
            return s;
          }(),
          Required(
              StringSetting<C>("coordinator", "RESHARD_COORDINATOR",
                               "HOST:PORT of a coordinator replica", &C::coordinator, "HOST:PORT"),
              "host:port"),
          [] {
            Setting<C> s = Required(
                StringSetting<C>("worker-socket", "RESHARD_WORKER_SOCKET",
                                 "unix socket path of the WorkerService (a unix: prefix is "
                                 "dropped); its descriptor socket is PATH.fds",
                                 &C::worker_socket, "PATH"),
                "a unix socket path");
            s.check = [required = s.check](const C& c, const std::string& name) {
              if (absl::Status st = required(c, name); !st.ok()) return st;
              if (c.worker_socket.size() < 100) return absl::OkStatus();
              return absl::InvalidArgumentError(absl::StrFormat(
                  "%s = \"%s\": longer than a unix socket path may be", name, c.worker_socket));
            };
            return s;
          }(),
          [] {
            Setting<C> s =
                StringSetting<C>("address", "RESHARD_AGENT_ADDRESS",
                                 "the address registered for this agent", &C::address, "ADDR");
            s.default_text = "unix:<worker socket>";
            return s;
          }(),
          [] {
            Setting<C> s =
                StringSetting<C>("shm-dir", "RESHARD_SHM_DIR", "where rank buffers live (a tmpfs)",
                                 &C::shm_dir, "DIR");
            s.check = [](const C& c, const std::string& name) {
              if (!c.shm_dir.empty()) return absl::OkStatus();
              return absl::InvalidArgumentError(name + " must not be empty");
            };
            return s;
          }(),
          IntSetting<C>("memory-limit-bytes", "RESHARD_MEMORY_LIMIT_BYTES",
                        "the most bytes of rank buffers held", &C::memory_limit_bytes, 1,
                        kMaxBytes),
          IntSetting<C>("spare-bytes", "RESHARD_SPARE_BYTES",
                        "shared memory kept allocated and zeroed ahead for new rank buffers "
                        "(within --memory-limit-bytes; tmpfs only); 0: none",
                        &C::spare_bytes, 0, kMaxBytes),
          IntSetting<C>("keep-dropped-ms", "RESHARD_KEEP_DROPPED_MS",
                        "how long a dropped rank buffer's pages are kept for a new buffer the "
                        "agent overwrites whole (within --memory-limit-bytes; tmpfs only); 0: "
                        "freed at once",
                        &C::keep_dropped_ms, 0, int64_t{24} * 3600 * 1000),
          IntSetting<C>("probe-bytes", "RESHARD_PROBE_BYTES",
                        "bytes the start-up probe copies and hashes to measure this host's rates "
                        "for the coordinator's cost model; 0: none measured",
                        &C::probe_bytes, 0, int64_t{1} << 30),
          [] {
            Setting<C> s =
                StringSetting<C>("ucx-net-devices", "UCX_NET_DEVICES",
                                 "UCX devices (lo on one machine)", &C::ucx_net_devices, "DEVS");
            s.default_text = "UCX's choice";
            return s;
          }(),
          [] {
            Setting<C> s = StringSetting<C>(
                "ucx-tls", "UCX_TLS", "UCX transports (tcp,self is safe)", &C::ucx_tls, "TLS");
            s.default_text = "UCX's choice";
            return s;
          }(),
          IntSetting<C>("heartbeat-ms", "RESHARD_HEARTBEAT_MS",
                        "heartbeat period; 0: a third of the coordinator's lease", &C::heartbeat_ms,
                        0, 600000),
          IntSetting<C>("peer-wait-ms", "RESHARD_PEER_WAIT_MS",
                        "how long a task waits for a peer's transfer proof or step seal, not "
                        "counting time the coordinator did not answer (100 ms to 1 h)",
                        &C::peer_wait_ms, 100, 3600000),
          IntSetting<C>("copy-threads", "RESHARD_COPY_THREADS", "threads for local strided copies",
                        &C::copy_threads, 1, 256),
          IntSetting<C>("worker-cache-bytes", "RESHARD_WORKER_CACHE_BYTES",
                        "the most bytes the worker service keeps of the jobs' PTCs, layouts and "
                        "worker-token hashes, least recently used out first (at least 64 KiB)",
                        &C::worker_cache_bytes, int64_t{64} << 10, int64_t{1} << 40),
          ChoiceSetting<C>("log-level", "RESHARD_LOG_LEVEL", "debug, info, warning or error",
                           &C::log_level,
                           std::vector<std::pair<std::string, std::string>>{{"debug", "debug"},
                                                                            {"info", "info"},
                                                                            {"warning", "warning"},
                                                                            {"error", "error"}}),
          [] {
            Setting<C> s = HostPortSetting<C>(
                "metrics-listen", "RESHARD_METRICS_LISTEN",
                "serves Prometheus metrics (reshard_agent_*) on http://HOST:PORT/metrics (port 0: "
                "any free port); empty: none",
                &C::metrics_listen, /*empty_ok=*/true);
            s.default_text = "(off)";
            return s;
          }(),
          StringSetting<C>(
              "tls-cert", "RESHARD_TLS_CERT",
              "this host's PEM certificate (common name agent:HOST_ID); re-read when "
              "it changes",
              [](auto& c) -> auto& { return c.tls.cert; }, "FILE"),
          StringSetting<C>(
              "tls-key", "RESHARD_TLS_KEY", "the PEM private key of --tls-cert",
              [](auto& c) -> auto& { return c.tls.key; }, "FILE"),
          StringSetting<C>(
              "tls-ca", "RESHARD_TLS_CA", "the PEM CA of the coordinator's certificate",
              [](auto& c) -> auto& { return c.tls.ca; }, "FILE"),
          BoolSetting<C>("insecure", "RESHARD_INSECURE",
                         "plaintext to the coordinator instead of TLS (a warning is logged)",
                         [](auto& c) -> auto& { return c.tls.insecure; }),
          [] {
            Setting<C> s;
            s.flag = "worker-group";
            s.env = "RESHARD_WORKER_GROUP";
            s.help =
                "the group (name or number) of the worker socket and of its descriptor socket "
                "PATH.fds, whose members (training processes) may use it";
            s.value_name = "GROUP";
            s.default_text = "the agent's";
            s.set = [](const std::string& value, C* c) {
              c->worker_group = value;
              return ResolveGroup(value, &c->worker_gid);
            };
            s.show = [](const C& c) { return c.worker_group; };
            return s;
          }(),
          [] {
            Setting<C> s;
            s.flag = "worker-socket-mode";
            s.env = "RESHARD_WORKER_SOCKET_MODE";
            s.help = "mode of the worker sockets (octal)";
            s.value_name = "MODE";
            s.set = [](const std::string& value, C* c) {
              return ParseMode(value, &c->worker_socket_mode);
            };
            s.show = [](const C& c) { return absl::StrFormat("0%o", c.worker_socket_mode); };
            return s;
          }(),
          // Issue 19: a worker group that may open shard files lets one job's
          // workers read or write another's.
          RetiredSetting<C>("shard-file-mode", "RESHARD_SHARD_FILE_MODE",
                            "shard files are the agent's alone (0600, sealed 0400) and workers "
                            "map file descriptors the agent hands them over the worker socket's "
                            "PATH.fds (docs/security.md, \"Workers\"); remove it"),
          [] {
            Setting<C> s = StringSetting<C>(
                "device", "RESHARD_DEVICE",
                "the device API of device-resident state and CUDA IPC: cuda, fake[:N[:BYTES]] "
                "(host memory behind the device API, for tests) or none",
                &C::device, "SPEC");
            s.default_text = "cuda when the CUDA runtime is loaded and sees a device, else none";
            return s;
          }(),
          IntSetting<C>("device-memory-limit-bytes", "RESHARD_DEVICE_MEMORY_LIMIT_BYTES",
                        "device bytes of rank buffers allowed per device; 0: the device's total",
                        &C::device_memory_limit_bytes, 0, kMaxBytes),
          ChoiceSetting<C>(
              "device-comm", "RESHARD_DEVICE_COMM",
              "auto: cross-host device steps over NCCL (the fake's with a fake "
              "device) when every host of an operation has it; none: staged through "
              "host memory. Opt-in: with it every cross-host step of a plain task "
              "goes through device memory, host-resident state included",
              &C::device_comm,
              std::vector<std::pair<std::string, bool>>{{"auto", true}, {"none", false}}),
          ChoiceSetting<C>(
              "device-ipc", "RESHARD_DEVICE_IPC",
              "auto: agents of one machine move cross-host device steps device to "
              "device through IPC handles when every host of an operation has it; "
              "none: not advertised. Opt-in, as --device-comm",
              &C::device_ipc,
              std::vector<std::pair<std::string, bool>>{{"auto", true}, {"none", false}}),
      },
      ParseOptions{/*repeated_flag_last_wins=*/true, /*empty_env_is_unset=*/true});
  return *kTable;
}

}  // namespace

std::vector<SettingInfo> AgentSettings() {
  std::vector<SettingInfo> out;
  for (const Setting<C>& row : Table().rows()) out.push_back(row);
  return out;
}

std::string AgentUsage() {
  return absl::StrCat(
      "usage: reshard-agent --coordinator HOST:PORT --worker-socket PATH [flags]\n"
      "  (--tls-cert FILE --tls-key FILE --tls-ca FILE | --insecure)\n"
      "\n"
      "Every flag may also come from its environment variable; a flag wins.\n"
      "\n",
      Table().Usage(AgentConfig{}), "  -h, --help\n");
}

absl::StatusOr<AgentConfig> ParseAgentConfig(
    const std::vector<std::string>& args, const std::function<const char*(const char*)>& getenv) {
  const GetEnvFn env = [&getenv](const std::string& name) -> std::optional<std::string> {
    const char* v = getenv(name.c_str());
    if (v == nullptr) return std::nullopt;
    return std::string(v);
  };
  AgentConfig c;
  bool help = false;
  if (absl::Status s = Table().Parse(args, 0, env, &c, &help); !s.ok()) return s;
  if (help) {
    return absl::InvalidArgumentError("--help asks for the usage (AgentUsage()), not a run");
  }
  // Defaults that depend on the host or on other fields.
  if (c.host_id.empty()) {
    char name[256] = {0};
    if (gethostname(name, sizeof(name) - 1) == 0) c.host_id = name;
  }
  if (absl::StartsWith(c.worker_socket, "unix:")) c.worker_socket = c.worker_socket.substr(5);
  if (c.address.empty() && !c.worker_socket.empty()) c.address = "unix:" + c.worker_socket;
  if (absl::Status s = Table().Check(c); !s.ok()) return s;
  if (absl::Status s = ValidateTlsFiles(c.tls, /*need_identity=*/true); !s.ok()) return s;
  return c;
}

}  // namespace reshard::agent
