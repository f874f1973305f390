#include "services/coordinator/server/config.h"

#include <unistd.h>

#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace reshard::coordinator {
namespace {

using C = CoordinatorConfig;
constexpr int64_t kDay = 24 * 3600 * 1000;

// Every flag of reshard-coordinator: its variable, help, field, range and
// default (the struct's). Parsing, the environment fallback, --help and
// ValidateConfig all read this table.
const ConfigTable<C>& Table() {
  static const auto* const kTable = new ConfigTable<C>(
      {
          [] {
            Setting<C> s =
                HostPortSetting<C>("listen", "RESHARD_LISTEN",
                                   "gRPC address host:port (port 0: any free port)", &C::listen);
            s.value_name = "V";
            return s;
          }(),
          [] {
            Setting<C> s = StringSetting<C>("dsn", "RESHARD_DSN",
                                            "PostgreSQL connection string (required), e.g. "
                                            "'host=/run/postgresql dbname=reshard'",
                                            &C::dsn);
            s.check = [](const C& c, const std::string&) {
              if (!c.dsn.empty()) return absl::OkStatus();
              return absl::InvalidArgumentError(
                  "--dsn (RESHARD_DSN) is required: a PostgreSQL connection string");
            };
            return s;
          }(),
          [] {
            Setting<C> s =
                HostPortSetting<C>("metrics-listen", "RESHARD_METRICS_LISTEN",
                                   "Prometheus /metrics address host:port (port 0: any free port)",
                                   &C::metrics_listen);
            s.value_name = "V";
            // After --listen's own check (the row above): one port each.
            s.check = [](const C& c, const std::string& name) {
              int listen_port = 0, metrics_port = 0;
              if (absl::Status st = SplitHostPort(c.metrics_listen, name, nullptr, &metrics_port);
                  !st.ok()) {
                return st;
              }
              (void)SplitHostPort(c.listen, "--listen", nullptr, &listen_port);
              if (listen_port != 0 && listen_port == metrics_port) {
                return absl::InvalidArgumentError(absl::StrFormat(
                    "--listen = \"%s\" and --metrics-listen = \"%s\" use the same port %d",
                    c.listen, c.metrics_listen, listen_port));
              }
              return absl::OkStatus();
            };
            return s;
          }(),
          StringSetting<C>("tls-cert", "RESHARD_TLS_CERT",
                           "PEM certificate (chain) of this replica",
                           [](auto& c) -> auto& { return c.tls.cert; }),
          StringSetting<C>("tls-key", "RESHARD_TLS_KEY", "PEM private key of --tls-cert",
                           [](auto& c) -> auto& { return c.tls.key; }),
          StringSetting<C>("tls-ca", "RESHARD_TLS_CA",
                           "PEM CA bundle: client certificates (agents, services) must chain to it",
                           [](auto& c) -> auto& { return c.tls.ca; }),
          IntSetting<C>(
              "tls-reload-s", "RESHARD_TLS_RELOAD_S",
              "seconds between checks of the TLS files for rotated certificates",
              [](auto& c) -> auto& { return c.tls.reload_seconds; }, 1, 86400, "V"),
          BoolSetting<C>(
              "insecure", "RESHARD_INSECURE",
              "plaintext gRPC and no authentication (every caller is admin); logs a warning",
              [](auto& c) -> auto& { return c.tls.insecure; }),
          IntSetting<C>("lease-ms", "RESHARD_LEASE_MS",
                        "host lease: a host without heartbeat is LOST", &C::lease_ms, 100, kDay,
                        "V"),
          IntSetting<C>("transfer-timeout-ms", "RESHARD_TRANSFER_TIMEOUT_MS",
                        "a transfer running longer is ABORTED", &C::transfer_timeout_ms, 1000,
                        7 * kDay, "V"),
          IntSetting<C>("stall-timeout-ms", "RESHARD_STALL_TIMEOUT_MS",
                        "a host's task without progress this long ABORTS its operation",
                        &C::stall_timeout_ms, 100, kDay, "V"),
          [] {
            Setting<C> s =
                IntSetting<C>("tick-ms", "RESHARD_TICK_MS", "period of the leader's driver pass",
                              &C::tick_ms, 1, 60000, "V");
            s.check = [range = s.check](const C& c, const std::string& name) {
              if (absl::Status st = range(c, name); !st.ok()) return st;
              if (c.tick_ms < c.lease_ms) return absl::OkStatus();
              return absl::InvalidArgumentError(absl::StrFormat(
                  "--tick-ms = %d must be shorter than --lease-ms = %d, or leases expire between "
                  "ticks",
                  c.tick_ms, c.lease_ms));
            };
            return s;
          }(),
          IntSetting<C>("cost-link-mbit", "RESHARD_COST_LINK_MBIT",
                        "the cost model's NIC rate of a host, each way, until an operation "
                        "measured it (Mbit/s)",
                        &C::cost_link_mbit, 1, 100000000, "V"),
          IntSetting<C>("cost-overhead-ms", "RESHARD_COST_OVERHEAD_MS",
                        "the cost model's time of an operation beyond its hosts' tasks, until a "
                        "commit measured it",
                        &C::cost_overhead_ms, 0, kDay, "V"),
          IntSetting<C>("leader-retry-ms", "RESHARD_LEADER_RETRY_MS",
                        "period of a follower's attempts to become leader", &C::leader_retry_ms, 1,
                        60000, "V"),
          IntSetting<C>("pool-size", "RESHARD_POOL_SIZE", "PostgreSQL connections", &C::pool_size,
                        1, 256, "V"),
          // PostgreSQL deadlines and the agents' reserve (issue 19, defects 5 and 6).
          [] {
            Setting<C> s = IntSetting<C>(
                "pool-agent-reserve", "RESHARD_POOL_AGENT_RESERVE",
                "of --pool-size, connections only agents' calls and the leader may take",
                &C::pool_agent_reserve, 0, 255, "V");
            s.check = [](const C& c, const std::string& name) {
              if (c.pool_agent_reserve >= 0 && c.pool_agent_reserve < c.pool_size) {
                return absl::OkStatus();
              }
              return absl::InvalidArgumentError(absl::StrFormat(
                  "%s = %d: must be at least 0 and less than --pool-size = %d, or client calls "
                  "get no connection",
                  name, c.pool_agent_reserve, c.pool_size));
            };
            return s;
          }(),
          IntSetting<C>("store-acquire-timeout-ms", "RESHARD_STORE_ACQUIRE_TIMEOUT_MS",
                        "a call waiting this long for a PostgreSQL connection is UNAVAILABLE",
                        &C::store_acquire_timeout_ms, 1, kDay, "V"),
          IntSetting<C>("store-statement-timeout-ms", "RESHARD_STORE_STATEMENT_TIMEOUT_MS",
                        "a statement PostgreSQL does not answer this long: connection dropped, "
                        "call UNAVAILABLE (also the server's statement_timeout)",
                        &C::store_statement_timeout_ms, 100, kDay, "V"),
          IntSetting<C>("store-connect-timeout-s", "RESHARD_STORE_CONNECT_TIMEOUT_S",
                        "libpq connect_timeout of new PostgreSQL connections, seconds",
                        &C::store_connect_timeout_s, 2, 3600, "V"),
          IntSetting<C>("max-spec-bytes", "RESHARD_MAX_SPEC_BYTES",
                        "largest serialized JobSpec RegisterJob accepts", &C::max_spec_bytes, 1024,
                        int64_t{1} << 30, "V"),
          // Watch streams (issue 19, defect 6).
          IntSetting<C>("max-watch-streams", "RESHARD_MAX_WATCH_STREAMS",
                        "WatchJob + WatchOperation streams open at once on this replica",
                        &C::max_watch_streams, 1, 100000, "V"),
          IntSetting<C>(
              "max-watch-streams-per-identity", "RESHARD_MAX_WATCH_STREAMS_PER_IDENTITY",
              "watch streams open at once for one caller identity",
              &C::max_watch_streams_per_identity,
              [](const C& c) { return std::pair<int64_t, int64_t>(1, c.max_watch_streams); }, "V"),
          IntSetting<C>(
              "max-watch-streams-per-tenant", "RESHARD_MAX_WATCH_STREAMS_PER_TENANT",
              "watch streams open at once for one tenant: its schedulers, viewers and its jobs' "
              "worker tokens together; a caller of no tenant (admin) has a budget of its own (0: "
              "a quarter of --max-watch-streams, at least --max-watch-streams-per-identity)",
              &C::max_watch_streams_per_tenant,
              [](const C& c) { return std::pair<int64_t, int64_t>(0, c.max_watch_streams); }, "V"),
          IntSetting<C>("watch-resync-ms", "RESHARD_WATCH_RESYNC_MS",
                        "the change feed's safety poll: how often the versions of the watched jobs "
                        "and operations are read, to catch a lost notification",
                        &C::watch_resync_ms, 50, 600000, "V"),
          BoolSetting<C>("notify-tasks", "RESHARD_NOTIFY_TASKS",
                         "NOTIFY other replicas of new tasks and LISTEN for theirs (false: they "
                         "learn by the 1 s safety re-read)",
                         &C::notify_tasks),
          IntSetting<C>("step-boundary-timeout-ms", "RESHARD_STEP_BOUNDARY_TIMEOUT_MS",
                        "how long a resize at_step_boundary waits for a checkpoint naming it (its "
                        "request's step_boundary_timeout_ms 0) before it plans from the last "
                        "commit",
                        &C::step_boundary_timeout_ms, 1, kDay, "V"),
          IntSetting<C>(
              "max-rpc-threads", "RESHARD_MAX_RPC_THREADS",
              "gRPC server threads for synchronous calls (0: no cap); watch streams hold none",
              &C::max_rpc_threads, 0, 1000000, "V"),
          // Retention (issue 9, defect 10).
          IntSetting<C>("retention-keep-retired", "RESHARD_RETENTION_KEEP_RETIRED",
                        "per job, newest RETIRED generations kept whatever their age",
                        &C::retention_keep_retired, 0, 1000000, "V"),
          IntSetting<C>(
              "retention-retired-age-ms", "RESHARD_RETENTION_RETIRED_AGE_MS",
              "older RETIRED generations are pruned once retired this long ago (>= 3 leases)",
              &C::retention_retired_age_ms,
              [](const C& c) { return std::pair<int64_t, int64_t>(3 * c.lease_ms, 365 * kDay); },
              "V"),
          IntSetting<C>(
              "retention-discarded-age-ms", "RESHARD_RETENTION_DISCARDED_AGE_MS",
              "DISCARDED generations are pruned once their operation ended this long ago (>= 3 "
              "leases)",
              &C::retention_discarded_age_ms,
              [](const C& c) { return std::pair<int64_t, int64_t>(3 * c.lease_ms, 365 * kDay); },
              "V"),
          IntSetting<C>("retention-keep-operations", "RESHARD_RETENTION_KEEP_OPERATIONS",
                        "per job, newest operations kept whatever their age",
                        &C::retention_keep_operations, 0, 1000000, "V"),
          IntSetting<C>("retention-operation-age-ms", "RESHARD_RETENTION_OPERATION_AGE_MS",
                        "older finished operations are pruned once finished this long ago",
                        &C::retention_operation_age_ms, 0, 3650 * kDay, "V"),
          IntSetting<C>("retention-audit-age-ms", "RESHARD_RETENTION_AUDIT_AGE_MS",
                        "audit rows are pruned once this old", &C::retention_audit_age_ms, 0,
                        3650 * kDay, "V"),
          IntSetting<C>("retention-batch-rows", "RESHARD_RETENTION_BATCH_ROWS",
                        "rows deleted by one pruning statement", &C::retention_batch_rows, 1,
                        100000, "V"),
          IntSetting<C>("retention-batches", "RESHARD_RETENTION_BATCHES",
                        "pruning batches per round", &C::retention_batches, 1, 1000, "V"),
          IntSetting<C>("retention-interval-ms", "RESHARD_RETENTION_INTERVAL_MS",
                        "least time between two pruning rounds of the leader",
                        &C::retention_interval_ms, 0, kDay, "V"),
          [] {
            Setting<C> s = StringSetting<C>("replica-id", "RESHARD_REPLICA_ID",
                                            "this replica's name in logs (default hostname:pid)",
                                            &C::replica_id);
            s.default_text = "hostname:pid";
            s.check = [](const C& c, const std::string& name) {
              if (c.replica_id.empty()) {
                return absl::InvalidArgumentError(absl::StrCat(name, " is empty"));
              }
              if (c.replica_id.find_first_of(" \t\n\r") != std::string::npos) {
                return absl::InvalidArgumentError(absl::StrFormat(
                    "%s = \"%s\": must not contain whitespace", name, c.replica_id));
              }
              return absl::OkStatus();
            };
            return s;
          }(),
          [] {
            Setting<C> s = ChoiceSetting<C>(
                "log-level", "RESHARD_LOG_LEVEL", "debug, info, warning or error", &C::log_level,
                std::vector<std::pair<std::string, LogSeverity>>{{"debug", LogSeverity::kDebug},
                                                                 {"info", LogSeverity::kInfo},
                                                                 {"warning", LogSeverity::kWarning},
                                                                 {"error", LogSeverity::kError}});
            s.value_name = "V";
            return s;
          }(),
      },
      ParseOptions{});
  return *kTable;
}

}  // namespace

std::string DefaultReplicaId() {
  char host[256] = {};
  if (gethostname(host, sizeof(host) - 1) != 0 || host[0] == '\0') {
    return absl::StrCat("coordinator:", getpid());
  }
  return absl::StrCat(host, ":", getpid());
}

absl::Status ValidateConfig(const CoordinatorConfig& c) { return Table().Check(c); }

absl::StatusOr<CommandLine> ParseCommandLine(const std::vector<std::string>& args,
                                             const GetEnvFn& getenv) {
  CommandLine out;
  size_t i = 0;
  if (i < args.size() && !absl::StartsWith(args[i], "-")) {
    if (args[i] == "serve") {
      out.command = CoordinatorCommand::kServe;
    } else if (args[i] == "migrate") {
      out.command = CoordinatorCommand::kMigrate;
    } else {
      return absl::InvalidArgumentError(
          absl::StrFormat("unknown command \"%s\" (expected serve or migrate)", args[i]));
    }
    ++i;
  }
  if (absl::Status st = Table().Parse(args, i, getenv, &out.config, &out.help);
      !st.ok() || out.help) {
    return st.ok() ? absl::StatusOr<CommandLine>(out) : st;
  }
  if (out.config.replica_id.empty()) out.config.replica_id = DefaultReplicaId();
  if (absl::Status st = ValidateConfig(out.config); !st.ok()) return st;
  // Only `serve` listens; `migrate` talks to PostgreSQL alone.
  if (out.command == CoordinatorCommand::kServe) {
    if (absl::Status st = ValidateTlsFiles(out.config.tls, /*need_identity=*/true); !st.ok()) {
      return st;
    }
  }
  return out;
}

std::vector<SettingInfo> CoordinatorSettings() {
  std::vector<SettingInfo> out;
  for (const Setting<C>& row : Table().rows()) out.push_back(row);
  return out;
}

std::string Usage() {
  const CoordinatorConfig defaults;
  std::string out =
      "usage: reshard-coordinator [serve] [flags]   run a coordinator replica\n"
      "       reshard-coordinator migrate --dsn DSN  apply the schema migrations and exit\n"
      "\n"
      "Every flag may also come from its environment variable; a flag wins.\n"
      "\n";
  out += Table().Usage(defaults);
  absl::StrAppend(&out, "  -h, --help\n");
  return out;
}

}  // namespace reshard::coordinator
