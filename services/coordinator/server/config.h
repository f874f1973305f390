// The reshard-coordinator binary's configuration: one struct, filled from
// command-line flags and then from the environment (a flag wins over its
// variable, either wins over the default), validated once at start-up.
// Pure functions; thread-safe.
#pragma once

#include <algorithm>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/config_table.h"
#include "common/log.h"
#include "common/tls.h"

namespace reshard::coordinator {

struct CoordinatorConfig {
  /// gRPC address (host:port); port 0 picks a free one. Loopback by
  /// default: reaching other machines is a deliberate choice.
  std::string listen = "127.0.0.1:7070";
  /// PostgreSQL connection string (libpq key=value or postgresql:// URI). Required.
  std::string dsn;
  /// Prometheus /metrics address (host:port); port 0 picks a free one.
  std::string metrics_listen = "127.0.0.1:9464";
  // ---- Transport security (docs/security.md) ----
  /// This replica's certificate and key, and the CA that client
  /// certificates must chain to; re-read when they change. All required
  /// unless `tls.insecure` (plaintext, no authentication: every caller is
  /// trusted as admin, and a warning is logged).
  TlsFiles tls;
  /// How long a host stays ALIVE without a heartbeat.
  int64_t lease_ms = 10000;
  /// TRANSFERRING longer than this: ABORTED.
  int64_t transfer_timeout_ms = 30 * 60 * 1000;
  /// An operation none of whose hosts' tasks progressed (state or
  /// bytes_done changed) this long: ABORTED naming its first waiting host.
  int64_t stall_timeout_ms = 20000;
  /// Period of the leader's OperationDriver::Tick.
  int tick_ms = 200;
  // ---- The cost model's seeds (docs/scheduler.md, "The cost of an operation") ----
  /// A host's NIC rate, each direction, until a committed operation
  /// measured it (Mbit/s).
  int64_t cost_link_mbit = 10000;
  /// An operation's time beyond its hosts' tasks (hand-out, reports,
  /// commit) until a commit measured it.
  int64_t cost_overhead_ms = 500;
  /// Period of a follower's attempts to take the leader lock.
  int leader_retry_ms = 500;
  /// PostgreSQL connections held by the store.
  int pool_size = 8;
  // ---- PostgreSQL (docs/coordinator.md, "When PostgreSQL does not answer") ----
  /// Of pool_size, connections only agents' calls and the leader may take:
  /// client calls never make heartbeats or progress reports wait.
  int pool_agent_reserve = 2;
  /// A call waits this long for a free connection, then UNAVAILABLE.
  int64_t store_acquire_timeout_ms = 5000;
  /// A statement without the server's answer this long: the connection is
  /// dropped and the call is UNAVAILABLE (a client-side deadline: a stopped
  /// server still ACKs TCP). Also the server's statement_timeout, and twice
  /// it its idle_in_transaction_session_timeout.
  int64_t store_statement_timeout_ms = 5000;
  /// libpq connect_timeout of new connections, seconds.
  int64_t store_connect_timeout_s = 5;
  /// Largest serialized JobSpec accepted by RegisterJob.
  int64_t max_spec_bytes = 64 << 20;
  // ---- Watch streams (docs/coordinator.md, "Limits") ----
  /// WatchJob and WatchOperation streams open at once on this replica, and
  /// per caller identity; past either: RESOURCE_EXHAUSTED naming the limit.
  /// A stream holds no thread and reads nothing while nothing changes (the
  /// change feed), so the bound is memory: a few KiB a stream.
  int64_t max_watch_streams = 32768;
  int64_t max_watch_streams_per_identity = 4096;
  /// Per tenant, every identity of it together (schedulers, viewers, the
  /// worker tokens of its jobs), so that no one tenant's jobs take every
  /// slot; a caller of no tenant (admin) has a budget of its own. 0: a quarter of
  /// max_watch_streams, and at least max_watch_streams_per_identity (WatchTenantBudget).
  int64_t max_watch_streams_per_tenant = 0;
  /// The change feed's safety poll: how often the versions of every watched
  /// job and operation are read (one query each), to catch a lost
  /// notification.
  int64_t watch_resync_ms = 1000;
  /// Task-creating transactions NOTIFY, and a listener wakes this replica's
  /// WaitForTasks on other replicas' (docs/coordinator.md, "Agents are
  /// told"). false: only this replica's own tasks wake them; the rest wait
  /// for the 1 s safety re-read (tests of a lost notification).
  bool notify_tasks = true;
  /// How long a Resize/Migrate with at_step_boundary and no timeout of its
  /// own waits for a checkpoint naming it (docs/coordinator.md, "Checkpoints
  /// and operations").
  int64_t step_boundary_timeout_ms = 120000;
  /// gRPC server threads for synchronous calls
  /// (grpc::ResourceQuota::SetMaxThreads); 0: gRPC's own (no cap). Watch
  /// streams hold none.
  int64_t max_rpc_threads = 0;
  // ---- Retention (docs/coordinator.md, "Retention") ----
  /// Per job, the newest RETIRED generations kept whatever their age.
  int64_t retention_keep_retired = 2;
  /// Older RETIRED generations are pruned once retired this long ago (at
  /// least 3 leases, so every live agent has seen them in `release`).
  int64_t retention_retired_age_ms = 60 * 60 * 1000;
  /// DISCARDED generations are pruned once their operation ended this long
  /// ago (at least 3 leases, for the same reason with `discard`).
  int64_t retention_discarded_age_ms = 10 * 60 * 1000;
  /// Per job, the newest operations kept whatever their age.
  int64_t retention_keep_operations = 100;
  /// Older finished operations are pruned once finished this long ago.
  int64_t retention_operation_age_ms = 7LL * 24 * 60 * 60 * 1000;
  /// Audit rows are pruned once this old.
  int64_t retention_audit_age_ms = 90LL * 24 * 60 * 60 * 1000;
  /// Rows per pruning statement, batches per round, and rounds' period.
  int64_t retention_batch_rows = 500;
  int64_t retention_batches = 4;
  int64_t retention_interval_ms = 60 * 1000;
  /// Names this replica in logs and operation records; default hostname:pid.
  std::string replica_id;
  LogSeverity log_level = LogSeverity::kInfo;
};

enum class CoordinatorCommand { kServe, kMigrate };

struct CommandLine {
  CoordinatorCommand command = CoordinatorCommand::kServe;
  CoordinatorConfig config;
  bool help = false;  // -h / --help: print Usage() and exit 0
};

/// Reads an environment variable (nullopt when unset); the process's own:
/// ProcessEnv().
using ::reshard::GetEnvFn;
using ::reshard::ProcessEnv;

/// Parses `reshard-coordinator [serve|migrate] [flags]` (`args` without the
/// program name), fills the config from flags then `getenv`, fills defaults
/// (replica id) and validates. Flags take `--name value` or `--name=value`.
/// InvalidArgument naming the flag (or variable) and the value on any error;
/// with `help` set, nothing is validated.
[[nodiscard]] absl::StatusOr<CommandLine> ParseCommandLine(const std::vector<std::string>& args,
                                                           const GetEnvFn& getenv);

/// Checks every field but the TLS files (ValidateTlsFiles, which `serve`
/// and CoordinatorServer::Start apply); InvalidArgument naming the flag and
/// the value.
[[nodiscard]] absl::Status ValidateConfig(const CoordinatorConfig& config);

/// Splits "host:port" ("[v6]:port" too). InvalidArgument naming the flag.
using ::reshard::SplitHostPort;

/// `hostname:pid` of this process.
std::string DefaultReplicaId();

/// Every row of the flag table (flag, variable, help, default), in order.
std::vector<SettingInfo> CoordinatorSettings();

/// The --help text: commands, every flag with its variable and default
/// (from the one table that parsing and ValidateConfig read too).
std::string Usage();

/// The per-tenant watch budget in force: max_watch_streams_per_tenant, or
/// when 0, max(max_watch_streams / 4, max_watch_streams_per_identity).
inline int64_t WatchTenantBudget(const CoordinatorConfig& c) {
  if (c.max_watch_streams_per_tenant > 0) return c.max_watch_streams_per_tenant;
  return std::max(c.max_watch_streams / 4, c.max_watch_streams_per_identity);
}

}  // namespace reshard::coordinator
