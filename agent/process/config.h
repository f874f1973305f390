// reshard-agent's configuration: flags, then environment variables for the
// flags not given, then defaults; validated once at start-up. One declared
// table in config.cc (common/config_table.h) says every flag's variable,
// help, field, range and default; parsing, AgentUsage() and the checks are
// derived from it. See README.md, "Running an agent".
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/config_table.h"
#include "common/tls.h"

namespace reshard::agent {

struct AgentConfig {
  std::string host_id;               // --host-id, RESHARD_HOST_ID; default: hostname
  std::string coordinator;           // --coordinator, RESHARD_COORDINATOR (host:port)
  std::string worker_socket;         // --worker-socket, RESHARD_WORKER_SOCKET
  std::string address;               // --address, RESHARD_AGENT_ADDRESS; default unix:<socket>
  std::string shm_dir = "/dev/shm";  // --shm-dir, RESHARD_SHM_DIR
  int64_t memory_limit_bytes = int64_t{64} << 30;  // --memory-limit-bytes
  int64_t spare_bytes = int64_t{1} << 30;          // --spare-bytes, RESHARD_SPARE_BYTES
  int64_t keep_dropped_ms = 60'000;                // --keep-dropped-ms, RESHARD_KEEP_DROPPED_MS
  int64_t probe_bytes = int64_t{32} << 20;         // --probe-bytes, RESHARD_PROBE_BYTES
  std::string ucx_net_devices;                     // --ucx-net-devices, UCX_NET_DEVICES
  std::string ucx_tls;                             // --ucx-tls, UCX_TLS
  int heartbeat_ms = 0;                            // --heartbeat-ms; 0: a third of the lease
  /// How long a task waits for a peer's transfer proof or step seal, not
  /// counting time the coordinator did not answer (peer_wait.h).
  /// --peer-wait-ms, RESHARD_PEER_WAIT_MS; 100 ms to 1 h.
  int64_t peer_wait_ms = 60000;
  int copy_threads = 4;  // --copy-threads
  /// Bytes the worker service may keep of the jobs' PTCs, layouts and
  /// worker-token hashes (docs/agent.md, "Worker service memory").
  /// --worker-cache-bytes, RESHARD_WORKER_CACHE_BYTES; at least 64 KiB.
  int64_t worker_cache_bytes = int64_t{64} << 20;
  std::string log_level = "info";  // --log-level, RESHARD_LOG_LEVEL
  /// Prometheus /metrics address HOST:PORT (port 0: any free port); empty:
  /// no metrics served. --metrics-listen, RESHARD_METRICS_LISTEN.
  std::string metrics_listen;
  /// The channel to the coordinator: this host's certificate (common name
  /// `agent:<host id>`) and key, the CA of the coordinator's certificate;
  /// re-read when they change. --tls-cert, --tls-key, --tls-ca
  /// (RESHARD_TLS_CERT, RESHARD_TLS_KEY, RESHARD_TLS_CA), all required
  /// unless --insecure (RESHARD_INSECURE): plaintext, logged as a warning.
  TlsFiles tls;
  /// Who may use the worker socket and its descriptor socket PATH.fds
  /// (docs/security.md, "Workers"): their group (-1: the agent's own), given
  /// as a name or a number (--worker-group, RESHARD_WORKER_GROUP), and mode
  /// (--worker-socket-mode, RESHARD_WORKER_SOCKET_MODE, octal). Shard files
  /// are the agent's alone; --shard-file-mode is retired (InvalidArgument).
  int64_t worker_gid = -1;
  std::string worker_group;  // as given
  uint32_t worker_socket_mode = 0660;
  /// The device API (MakeDeviceApi's spec: "cuda", "fake[:N[:BYTES]]",
  /// "none"; "" picks CUDA when it is loaded and sees a device).
  /// --device, RESHARD_DEVICE.
  std::string device;
  /// Device bytes of rank buffers allowed per device; 0: the device's total.
  /// --device-memory-limit-bytes, RESHARD_DEVICE_MEMORY_LIMIT_BYTES.
  int64_t device_memory_limit_bytes = 0;
  /// Cross-host device steps over a device communicator (NCCL; the fake's
  /// with a fake device) when the agent has a device API: --device-comm
  /// auto (true) or none (false, default), RESHARD_DEVICE_COMM. Opt-in: once
  /// every host of an operation advertises it, every cross-host step of a
  /// plain task goes through device memory, host-resident state included
  /// (docs/agent.md, "GPU / memory kinds").
  bool device_comm = false;
  /// Cross-host device steps between agents of one machine through device
  /// IPC handles (device_ipc_steps.h), advertised as DeviceIpcEntry:
  /// --device-ipc auto (true) or none (false, default), RESHARD_DEVICE_IPC.
  /// Opt-in, as device_comm.
  bool device_ipc = false;
};

/// Reads `args` (without argv[0]; `--flag value` or `--flag=value`; a flag
/// given twice: the last wins) and, for the flags not given, the environment
/// through `getenv` (returns nullptr when unset; an empty value counts as
/// unset). InvalidArgument naming the flag (or variable) and the value on
/// anything unknown, missing, malformed or out of range.
[[nodiscard]] absl::StatusOr<AgentConfig> ParseAgentConfig(
    const std::vector<std::string>& args, const std::function<const char*(const char*)>& getenv);

/// The usage text printed with --help and on a bad configuration: every
/// flag with its variable, default and help.
std::string AgentUsage();

/// Every row of the table (flag, variable, help, default), in order.
std::vector<SettingInfo> AgentSettings();

}  // namespace reshard::agent
