#include "agent/process/config.h"

#include <grp.h>
#include <unistd.h>

#include <cstdlib>
#include <map>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/log.h"

namespace reshard::agent {
namespace {

// Flag name -> environment variable (empty: flag only).
const std::map<std::string, std::string>& KnownFlags() {
  static const auto* flags = new std::map<std::string, std::string>{
      {"host-id", "RESHARD_HOST_ID"},
      {"coordinator", "RESHARD_COORDINATOR"},
      {"worker-socket", "RESHARD_WORKER_SOCKET"},
      {"address", "RESHARD_AGENT_ADDRESS"},
      {"shm-dir", "RESHARD_SHM_DIR"},
      {"memory-limit-bytes", "RESHARD_MEMORY_LIMIT_BYTES"},
      {"spare-bytes", "RESHARD_SPARE_BYTES"},
      {"ucx-net-devices", "UCX_NET_DEVICES"},
      {"ucx-tls", "UCX_TLS"},
      {"heartbeat-ms", "RESHARD_HEARTBEAT_MS"},
      {"peer-wait-ms", "RESHARD_PEER_WAIT_MS"},
      {"copy-threads", "RESHARD_COPY_THREADS"},
      {"worker-cache-bytes", "RESHARD_WORKER_CACHE_BYTES"},
      {"log-level", "RESHARD_LOG_LEVEL"},
      {"metrics-listen", "RESHARD_METRICS_LISTEN"},
      {"tls-cert", "RESHARD_TLS_CERT"},
      {"tls-key", "RESHARD_TLS_KEY"},
      {"tls-ca", "RESHARD_TLS_CA"},
      {"insecure", "RESHARD_INSECURE"},
      {"worker-group", "RESHARD_WORKER_GROUP"},
      {"worker-socket-mode", "RESHARD_WORKER_SOCKET_MODE"},
      {"shard-file-mode", "RESHARD_SHARD_FILE_MODE"},
      {"device", "RESHARD_DEVICE"},
      {"device-memory-limit-bytes", "RESHARD_DEVICE_MEMORY_LIMIT_BYTES"},
      {"device-comm", "RESHARD_DEVICE_COMM"},
      {"device-ipc", "RESHARD_DEVICE_IPC"},
  };
  return *flags;
}

absl::Status ParseInt(const std::string& flag, const std::string& text, int64_t min, int64_t max,
                      int64_t* out) {
  int64_t v = 0;
  if (!absl::SimpleAtoi(text, &v) || v < min || v > max) {
    return absl::InvalidArgumentError(
        absl::StrCat("--", flag, " \"", text, "\": expected an integer in [", min, ", ", max, "]"));
  }
  *out = v;
  return absl::OkStatus();
}

// HOST:PORT or [V6]:PORT with a port in [0, 65535] (0: any free port).
absl::Status CheckHostPort(const std::string& flag, const std::string& env,
                           const std::string& text) {
  auto bad = [&](const std::string& why) {
    return absl::InvalidArgumentError(
        absl::StrCat("--", flag, " (", env, ") \"", text, "\": ", why));
  };
  const size_t colon = text.rfind(':');
  if (colon == std::string::npos) return bad("expected HOST:PORT");
  std::string host = text.substr(0, colon);
  const std::string port = text.substr(colon + 1);
  if (absl::StartsWith(host, "[")) {
    if (host.size() < 3 || host.back() != ']') return bad("expected [IPV6]:PORT");
    host = host.substr(1, host.size() - 2);
  } else if (host.find(':') != std::string::npos) {
    return bad("an IPv6 address needs brackets: [ADDR]:PORT");
  }
  if (host.empty()) return bad("the host is empty (use 0.0.0.0 for every interface)");
  if (host.find_first_of(" \t/") != std::string::npos) return bad("the host has '/' or spaces");
  int64_t p = 0;
  if (port.empty() || !absl::SimpleAtoi(port, &p) || p < 0 || p > 65535) {
    return bad("the port must be an integer in [0, 65535]");
  }
  return absl::OkStatus();
}

// An octal file mode of at most 0777 (no set-id or sticky bits).
absl::Status ParseMode(const std::string& flag, const std::string& env, const std::string& text,
                       uint32_t* out) {
  uint32_t v = 0;
  if (text.empty() || text.size() > 4 || text.find_first_not_of("01234567") != std::string::npos ||
      (v = static_cast<uint32_t>(std::strtoul(text.c_str(), nullptr, 8))) > 0777) {
    return absl::InvalidArgumentError(absl::StrCat("--", flag, " (", env, ") \"", text,
                                                   "\": expected an octal mode such as 0660"));
  }
  *out = v;
  return absl::OkStatus();
}

// A group name or number.
absl::Status ResolveGroup(const std::string& text, int64_t* gid) {
  int64_t v = 0;
  if (absl::SimpleAtoi(text, &v) && v >= 0 && v < (int64_t{1} << 32) - 1) {
    *gid = v;
    return absl::OkStatus();
  }
  std::vector<char> buf(16384);
  struct group g {};
  struct group* found = nullptr;
  const int err = ::getgrnam_r(text.c_str(), &g, buf.data(), buf.size(), &found);
  if (err != 0 || found == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("--worker-group (RESHARD_WORKER_GROUP) \"", text, "\": no such group"));
  }
  *gid = found->gr_gid;
  return absl::OkStatus();
}

}  // namespace

std::string AgentUsage() {
  return "usage: reshard-agent --coordinator HOST:PORT --worker-socket PATH [--host-id ID]\n"
         "  [--address ADDR] [--shm-dir DIR] [--memory-limit-bytes N] [--spare-bytes N]\n"
         "  [--ucx-net-devices DEVS] [--ucx-tls TLS] [--heartbeat-ms N] [--copy-threads N]\n"
         "  [--peer-wait-ms N]\n"
         "  [--log-level LEVEL] [--metrics-listen HOST:PORT] [--worker-cache-bytes N]\n"
         "  [--worker-group GROUP] [--worker-socket-mode MODE]\n"
         "  [--device SPEC] [--device-memory-limit-bytes N] [--device-comm auto|none]\n"
         "  [--device-ipc auto|none]\n"
         "  (--tls-cert FILE --tls-key FILE --tls-ca FILE | --insecure)\n"
         "--worker-group: the group (name or number) of the worker socket (and of its\n"
         "descriptor socket PATH.fds), whose members (training processes) may use it;\n"
         "default the agent's. --worker-socket-mode: octal, default 0660. Shard files are\n"
         "the agent's alone (0600, sealed 0400); workers map descriptors the agent hands\n"
         "them (--shard-file-mode is retired).\n"
         "--tls-cert/--tls-key: this host's certificate (common name agent:HOST_ID) and\n"
         "key; --tls-ca: the CA of the coordinator's certificate. Re-read when they\n"
         "change. --insecure: plaintext to the coordinator (a warning is logged).\n"
         "--spare-bytes keeps that much shared memory allocated and zeroed ahead (within\n"
         "--memory-limit-bytes; tmpfs only) for new buffers; 0: none. Default 1 GiB.\n"
         "--worker-cache-bytes bounds what the worker service keeps of the jobs' PTCs,\n"
         "layouts and worker-token hashes (least recently used out first); default 64 MiB.\n"
         "--device: the device API of device-resident state and CUDA IPC: cuda, fake[:N[:BYTES]]\n"
         "(host memory behind the device API, for tests), none; default: cuda when the CUDA\n"
         "runtime is loaded and sees a device, else none. --device-memory-limit-bytes: device\n"
         "bytes of rank buffers allowed per device; 0 (default): the device's total.\n"
         "--device-comm auto: cross-host device steps over NCCL (the fake's with a fake device)\n"
         "when every host of an operation has it; none (default): staged through host memory.\n"
         "--device-ipc auto: agents of one machine move cross-host device steps device to device\n"
         "through IPC handles when every host of an operation has it; none (default): not\n"
         "advertised. Both are opt-in: with them, every cross-host step of a plain task between\n"
         "such agents goes through device memory, host-resident state included.\n"
         "--metrics-listen serves Prometheus metrics (reshard_agent_*) on\n"
         "http://HOST:PORT/metrics (port 0: any free port); unset or empty: none.\n"
         "Each flag may also come from its environment variable (RESHARD_HOST_ID,\n"
         "RESHARD_COORDINATOR, RESHARD_WORKER_SOCKET, RESHARD_AGENT_ADDRESS, RESHARD_SHM_DIR,\n"
         "RESHARD_MEMORY_LIMIT_BYTES, RESHARD_SPARE_BYTES, UCX_NET_DEVICES, UCX_TLS,\n"
         "RESHARD_HEARTBEAT_MS, RESHARD_COPY_THREADS, RESHARD_WORKER_CACHE_BYTES,\n"
         "RESHARD_LOG_LEVEL,\n"
         "RESHARD_METRICS_LISTEN, RESHARD_TLS_CERT, RESHARD_TLS_KEY, RESHARD_TLS_CA,\n"
         "RESHARD_INSECURE, RESHARD_WORKER_GROUP, RESHARD_WORKER_SOCKET_MODE, RESHARD_DEVICE,\n"
         "RESHARD_DEVICE_MEMORY_LIMIT_BYTES); flags win.\n";
}

absl::StatusOr<AgentConfig> ParseAgentConfig(
    const std::vector<std::string>& args, const std::function<const char*(const char*)>& getenv) {
  std::map<std::string, std::string> values;
  for (const auto& [flag, env] : KnownFlags()) {
    const char* v = env.empty() ? nullptr : getenv(env.c_str());
    if (v != nullptr && *v != '\0') values[flag] = v;
  }
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (!absl::StartsWith(a, "--")) {
      return absl::InvalidArgumentError(absl::StrCat("unexpected argument \"", a, "\""));
    }
    std::string name = a.substr(2), value;
    const size_t eq = name.find('=');
    if (eq != std::string::npos) {
      value = name.substr(eq + 1);
      name = name.substr(0, eq);
    } else if (name == "insecure") {
      value = "true";  // the one boolean flag
    } else {
      if (i + 1 >= args.size()) {
        return absl::InvalidArgumentError(absl::StrCat("--", name, " needs a value"));
      }
      value = args[++i];
    }
    if (KnownFlags().count(name) == 0) {
      return absl::InvalidArgumentError(absl::StrCat("unknown flag --", name));
    }
    values[name] = value;
  }

  AgentConfig c;
  auto get = [&](const char* flag, std::string* out) {
    auto it = values.find(flag);
    if (it != values.end()) *out = it->second;
  };
  get("host-id", &c.host_id);
  get("coordinator", &c.coordinator);
  get("worker-socket", &c.worker_socket);
  get("address", &c.address);
  get("shm-dir", &c.shm_dir);
  get("ucx-net-devices", &c.ucx_net_devices);
  get("ucx-tls", &c.ucx_tls);
  get("log-level", &c.log_level);
  get("metrics-listen", &c.metrics_listen);
  get("device", &c.device);
  get("tls-cert", &c.tls.cert);
  get("tls-key", &c.tls.key);
  get("tls-ca", &c.tls.ca);
  if (auto it = values.find("insecure"); it != values.end()) {
    if (!ParseBool(it->second, &c.tls.insecure).ok()) {
      return absl::InvalidArgumentError(absl::StrCat("--insecure (RESHARD_INSECURE) \"", it->second,
                                                     "\": expected true or false"));
    }
  }
  if (auto it = values.find("worker-group"); it != values.end()) {
    c.worker_group = it->second;
    if (absl::Status s = ResolveGroup(it->second, &c.worker_gid); !s.ok()) return s;
  }
  if (auto it = values.find("worker-socket-mode"); it != values.end()) {
    absl::Status s =
        ParseMode(it->first, "RESHARD_WORKER_SOCKET_MODE", it->second, &c.worker_socket_mode);
    if (!s.ok()) return s;
  }
  if (auto it = values.find("shard-file-mode"); it != values.end()) {
    // Issue 19: a worker group that may open shard files lets one job's
    // workers read or write another's.
    return absl::InvalidArgumentError(absl::StrCat(
        "--shard-file-mode (RESHARD_SHARD_FILE_MODE) \"", it->second,
        "\" is retired: shard files are the agent's alone (0600, sealed 0400) and workers map "
        "file descriptors the agent hands them over the worker socket's PATH.fds "
        "(docs/security.md, \"Workers\"); remove it"));
  }
  int64_t v = 0;
  if (auto it = values.find("memory-limit-bytes"); it != values.end()) {
    absl::Status s = ParseInt(it->first, it->second, 1, int64_t{1} << 50, &v);
    if (!s.ok()) return s;
    c.memory_limit_bytes = v;
  }
  if (auto it = values.find("spare-bytes"); it != values.end()) {
    absl::Status s = ParseInt(it->first, it->second, 0, int64_t{1} << 50, &v);
    if (!s.ok()) return s;
    c.spare_bytes = v;
  }
  if (auto it = values.find("heartbeat-ms"); it != values.end()) {
    absl::Status s = ParseInt(it->first, it->second, 0, 600000, &v);
    if (!s.ok()) return s;
    c.heartbeat_ms = static_cast<int>(v);
  }
  if (auto it = values.find("peer-wait-ms"); it != values.end()) {
    absl::Status s = ParseInt(it->first, it->second, 100, 3600000, &v);
    if (!s.ok()) return s;
    c.peer_wait_ms = v;
  }
  if (auto it = values.find("copy-threads"); it != values.end()) {
    absl::Status s = ParseInt(it->first, it->second, 1, 256, &v);
    if (!s.ok()) return s;
    c.copy_threads = static_cast<int>(v);
  }
  if (auto it = values.find("device-memory-limit-bytes"); it != values.end()) {
    absl::Status s = ParseInt(it->first, it->second, 0, int64_t{1} << 50, &v);
    if (!s.ok()) return s;
    c.device_memory_limit_bytes = v;
  }
  if (auto it = values.find("device-comm"); it != values.end()) {
    if (it->second != "auto" && it->second != "none") {
      return absl::InvalidArgumentError(absl::StrCat("--device-comm (RESHARD_DEVICE_COMM) \"",
                                                     it->second, "\": expected auto or none"));
    }
    c.device_comm = it->second == "auto";
  }
  if (auto it = values.find("device-ipc"); it != values.end()) {
    if (it->second != "auto" && it->second != "none") {
      return absl::InvalidArgumentError(absl::StrCat("--device-ipc (RESHARD_DEVICE_IPC) \"",
                                                     it->second, "\": expected auto or none"));
    }
    c.device_ipc = it->second == "auto";
  }
  if (auto it = values.find("worker-cache-bytes"); it != values.end()) {
    absl::Status s = ParseInt(it->first, it->second, int64_t{64} << 10, int64_t{1} << 40, &v);
    if (!s.ok()) return s;
    c.worker_cache_bytes = v;
  }

  if (c.host_id.empty()) {
    char name[256] = {0};
    if (gethostname(name, sizeof(name) - 1) == 0) c.host_id = name;
  }
  if (c.host_id.empty()) return absl::InvalidArgumentError("--host-id is required");
  if (c.host_id.find_first_of("/ \t\n") != std::string::npos) {
    return absl::InvalidArgumentError(
        absl::StrCat("--host-id \"", c.host_id, "\": must not contain '/' or spaces"));
  }
  if (c.coordinator.empty()) {
    return absl::InvalidArgumentError("--coordinator is required (host:port)");
  }
  if (c.worker_socket.empty()) {
    return absl::InvalidArgumentError("--worker-socket is required (a unix socket path)");
  }
  if (absl::StartsWith(c.worker_socket, "unix:")) c.worker_socket = c.worker_socket.substr(5);
  if (c.worker_socket.size() >= 100) {
    return absl::InvalidArgumentError(absl::StrCat("--worker-socket \"", c.worker_socket,
                                                   "\": longer than a unix socket path may be"));
  }
  if (c.shm_dir.empty()) return absl::InvalidArgumentError("--shm-dir must not be empty");
  if (c.address.empty()) c.address = "unix:" + c.worker_socket;
  if (!c.metrics_listen.empty()) {
    absl::Status s = CheckHostPort("metrics-listen", "RESHARD_METRICS_LISTEN", c.metrics_listen);
    if (!s.ok()) return s;
  }
  if (absl::Status s = ValidateTlsFiles(c.tls, /*need_identity=*/true); !s.ok()) return s;
  LogSeverity sev;
  if (!ParseLogSeverity(c.log_level, &sev)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--log-level \"", c.log_level, "\": expected debug, info, warning or error"));
  }
  return c;
}

}  // namespace reshard::agent
