#include "services/coordinator/server/config.h"

#include <unistd.h>

#include <climits>
#include <cstdlib>
#include <limits>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace reshard::coordinator {
namespace {

// One configurable field: its flag, its environment variable and how a
// string value is stored (InvalidArgument for a malformed value).
struct Setting {
  const char* flag;  // without "--"
  const char* env;
  const char* help;
  std::function<absl::Status(const std::string& value, CoordinatorConfig* config)> set;
  std::function<std::string(const CoordinatorConfig& defaults)> default_text;
  /// A boolean flag: `--flag` alone means true.
  bool boolean = false;
};

template <typename Int>
absl::Status ParseInt(const std::string& value, Int* out) {
  int64_t v = 0;
  if (!absl::SimpleAtoi(value, &v) || v < std::numeric_limits<Int>::min() ||
      v > std::numeric_limits<Int>::max()) {
    return absl::InvalidArgumentError("not an integer");
  }
  *out = static_cast<Int>(v);
  return absl::OkStatus();
}

template <typename Int>
Setting IntSetting(const char* flag, const char* env, const char* help,
                   Int CoordinatorConfig::*field) {
  return {flag, env, help,
          [field](const std::string& value, CoordinatorConfig* c) {
            return ParseInt(value, &(c->*field));
          },
          [field](const CoordinatorConfig& c) { return absl::StrCat(c.*field); }};
}

Setting StringSetting(const char* flag, const char* env, const char* help,
                      std::string CoordinatorConfig::*field) {
  return {flag, env, help,
          [field](const std::string& value, CoordinatorConfig* c) {
            c->*field = value;
            return absl::OkStatus();
          },
          [field](const CoordinatorConfig& c) { return c.*field; }};
}

const std::vector<Setting>& Settings() {
  static const auto* const kSettings = new std::vector<Setting>{
      StringSetting("listen", "RESHARD_LISTEN", "gRPC address host:port (port 0: any free port)",
                    &CoordinatorConfig::listen),
      StringSetting("dsn", "RESHARD_DSN",
                    "PostgreSQL connection string (required), e.g. "
                    "'host=/run/postgresql dbname=reshard'",
                    &CoordinatorConfig::dsn),
      StringSetting("metrics-listen", "RESHARD_METRICS_LISTEN",
                    "Prometheus /metrics address host:port (port 0: any free port)",
                    &CoordinatorConfig::metrics_listen),
      {"tls-cert", "RESHARD_TLS_CERT", "PEM certificate (chain) of this replica",
       [](const std::string& v, CoordinatorConfig* c) {
         c->tls.cert = v;
         return absl::OkStatus();
       },
       [](const CoordinatorConfig& c) { return c.tls.cert; }},
      {"tls-key", "RESHARD_TLS_KEY", "PEM private key of --tls-cert",
       [](const std::string& v, CoordinatorConfig* c) {
         c->tls.key = v;
         return absl::OkStatus();
       },
       [](const CoordinatorConfig& c) { return c.tls.key; }},
      {"tls-ca", "RESHARD_TLS_CA",
       "PEM CA bundle: client certificates (agents, services) must chain to it",
       [](const std::string& v, CoordinatorConfig* c) {
         c->tls.ca = v;
         return absl::OkStatus();
       },
       [](const CoordinatorConfig& c) { return c.tls.ca; }},
      {"tls-reload-s", "RESHARD_TLS_RELOAD_S",
       "seconds between checks of the TLS files for rotated certificates",
       [](const std::string& v, CoordinatorConfig* c) {
         return ParseInt(v, &c->tls.reload_seconds);
       },
       [](const CoordinatorConfig& c) { return absl::StrCat(c.tls.reload_seconds); }},
      {"insecure", "RESHARD_INSECURE",
       "plaintext gRPC and no authentication (every caller is admin); logs a warning",
       [](const std::string& v, CoordinatorConfig* c) { return ParseBool(v, &c->tls.insecure); },
       [](const CoordinatorConfig& c) { return std::string(c.tls.insecure ? "true" : "false"); },
       /*boolean=*/true},
      IntSetting("lease-ms", "RESHARD_LEASE_MS", "host lease: a host without heartbeat is LOST",
                 &CoordinatorConfig::lease_ms),
      IntSetting("transfer-timeout-ms", "RESHARD_TRANSFER_TIMEOUT_MS",
                 "a transfer running longer is ABORTED", &CoordinatorConfig::transfer_timeout_ms),
      IntSetting("stall-timeout-ms", "RESHARD_STALL_TIMEOUT_MS",
                 "a host's task without progress this long ABORTS its operation",
                 &CoordinatorConfig::stall_timeout_ms),
      IntSetting("tick-ms", "RESHARD_TICK_MS", "period of the leader's driver pass",
                 &CoordinatorConfig::tick_ms),
      IntSetting("leader-retry-ms", "RESHARD_LEADER_RETRY_MS",
                 "period of a follower's attempts to become leader",
                 &CoordinatorConfig::leader_retry_ms),
      IntSetting("pool-size", "RESHARD_POOL_SIZE", "PostgreSQL connections",
                 &CoordinatorConfig::pool_size),
      // PostgreSQL deadlines and the agents' reserve (issue 19, defects 5 and 6).
      IntSetting("pool-agent-reserve", "RESHARD_POOL_AGENT_RESERVE",
                 "of --pool-size, connections only agents' calls and the leader may take",
                 &CoordinatorConfig::pool_agent_reserve),
      IntSetting("store-acquire-timeout-ms", "RESHARD_STORE_ACQUIRE_TIMEOUT_MS",
                 "a call waiting this long for a PostgreSQL connection is UNAVAILABLE",
                 &CoordinatorConfig::store_acquire_timeout_ms),
      IntSetting("store-statement-timeout-ms", "RESHARD_STORE_STATEMENT_TIMEOUT_MS",
                 "a statement PostgreSQL does not answer this long: connection dropped, call "
                 "UNAVAILABLE (also the server's statement_timeout)",
                 &CoordinatorConfig::store_statement_timeout_ms),
      IntSetting("store-connect-timeout-s", "RESHARD_STORE_CONNECT_TIMEOUT_S",
                 "libpq connect_timeout of new PostgreSQL connections, seconds",
                 &CoordinatorConfig::store_connect_timeout_s),
      IntSetting("max-spec-bytes", "RESHARD_MAX_SPEC_BYTES",
                 "largest serialized JobSpec RegisterJob accepts",
                 &CoordinatorConfig::max_spec_bytes),
      // Watch streams (issue 19, defect 6).
      IntSetting("max-watch-streams", "RESHARD_MAX_WATCH_STREAMS",
                 "WatchJob + WatchOperation streams open at once on this replica",
                 &CoordinatorConfig::max_watch_streams),
      IntSetting("max-watch-streams-per-identity", "RESHARD_MAX_WATCH_STREAMS_PER_IDENTITY",
                 "watch streams open at once for one caller identity",
                 &CoordinatorConfig::max_watch_streams_per_identity),
      IntSetting("max-watch-streams-per-tenant", "RESHARD_MAX_WATCH_STREAMS_PER_TENANT",
                 "watch streams open at once for one tenant: its schedulers, viewers and its "
                 "jobs' worker tokens together; a caller of no tenant (admin) has a budget of "
                 "its own (0: a quarter of --max-watch-streams, at least "
                 "--max-watch-streams-per-identity)",
                 &CoordinatorConfig::max_watch_streams_per_tenant),
      IntSetting("watch-resync-ms", "RESHARD_WATCH_RESYNC_MS",
                 "the change feed's safety poll: how often the versions of the watched jobs and "
                 "operations are read, to catch a lost notification",
                 &CoordinatorConfig::watch_resync_ms),
      {"notify-tasks", "RESHARD_NOTIFY_TASKS",
       "NOTIFY other replicas of new tasks and LISTEN for theirs (false: they learn by the 1 s "
       "safety re-read)",
       [](const std::string& v, CoordinatorConfig* c) { return ParseBool(v, &c->notify_tasks); },
       [](const CoordinatorConfig& c) { return std::string(c.notify_tasks ? "true" : "false"); },
       /*boolean=*/true},
      IntSetting("step-boundary-timeout-ms", "RESHARD_STEP_BOUNDARY_TIMEOUT_MS",
                 "how long a resize at_step_boundary waits for a checkpoint naming it (its "
                 "request's step_boundary_timeout_ms 0) before it plans from the last commit",
                 &CoordinatorConfig::step_boundary_timeout_ms),
      IntSetting("max-rpc-threads", "RESHARD_MAX_RPC_THREADS",
                 "gRPC server threads for synchronous calls (0: no cap); watch streams hold none",
                 &CoordinatorConfig::max_rpc_threads),
      // Retention (issue 9, defect 10).
      IntSetting("retention-keep-retired", "RESHARD_RETENTION_KEEP_RETIRED",
                 "per job, newest RETIRED generations kept whatever their age",
                 &CoordinatorConfig::retention_keep_retired),
      IntSetting("retention-retired-age-ms", "RESHARD_RETENTION_RETIRED_AGE_MS",
                 "older RETIRED generations are pruned once retired this long ago (>= 3 leases)",
                 &CoordinatorConfig::retention_retired_age_ms),
      IntSetting("retention-discarded-age-ms", "RESHARD_RETENTION_DISCARDED_AGE_MS",
                 "DISCARDED generations are pruned once their operation ended this long ago "
                 "(>= 3 leases)",
                 &CoordinatorConfig::retention_discarded_age_ms),
      IntSetting("retention-keep-operations", "RESHARD_RETENTION_KEEP_OPERATIONS",
                 "per job, newest operations kept whatever their age",
                 &CoordinatorConfig::retention_keep_operations),
      IntSetting("retention-operation-age-ms", "RESHARD_RETENTION_OPERATION_AGE_MS",
                 "older finished operations are pruned once finished this long ago",
                 &CoordinatorConfig::retention_operation_age_ms),
      IntSetting("retention-audit-age-ms", "RESHARD_RETENTION_AUDIT_AGE_MS",
                 "audit rows are pruned once this old", &CoordinatorConfig::retention_audit_age_ms),
      IntSetting("retention-batch-rows", "RESHARD_RETENTION_BATCH_ROWS",
                 "rows deleted by one pruning statement", &CoordinatorConfig::retention_batch_rows),
      IntSetting("retention-batches", "RESHARD_RETENTION_BATCHES", "pruning batches per round",
                 &CoordinatorConfig::retention_batches),
      IntSetting("retention-interval-ms", "RESHARD_RETENTION_INTERVAL_MS",
                 "least time between two pruning rounds of the leader",
                 &CoordinatorConfig::retention_interval_ms),
      StringSetting("replica-id", "RESHARD_REPLICA_ID",
                    "this replica's name in logs (default hostname:pid)",
                    &CoordinatorConfig::replica_id),
      {"log-level", "RESHARD_LOG_LEVEL", "debug, info, warning or error",
       [](const std::string& value, CoordinatorConfig* c) {
         if (!ParseLogSeverity(value, &c->log_level)) {
           return absl::InvalidArgumentError("expected debug, info, warning or error");
         }
         return absl::OkStatus();
       },
       [](const CoordinatorConfig&) { return std::string("info"); }},
  };
  return *kSettings;
}

const Setting* FindSetting(const std::string& flag) {
  for (const Setting& s : Settings()) {
    if (flag == s.flag) return &s;
  }
  return nullptr;
}

std::string Name(const Setting& s) { return absl::StrCat("--", s.flag, " (", s.env, ")"); }

absl::Status Range(const char* flag, int64_t value, int64_t lo, int64_t hi) {
  if (value >= lo && value <= hi) return absl::OkStatus();
  const Setting* s = FindSetting(flag);
  return absl::InvalidArgumentError(
      absl::StrFormat("%s = %d: must be between %d and %d", Name(*s), value, lo, hi));
}

}  // namespace

GetEnvFn ProcessEnv() {
  return [](const std::string& name) -> std::optional<std::string> {
    const char* v = std::getenv(name.c_str());
    if (v == nullptr) return std::nullopt;
    return std::string(v);
  };
}

absl::Status SplitHostPort(const std::string& address, const std::string& flag, std::string* host,
                           int* port) {
  const size_t colon = address.rfind(':');
  auto bad = [&](const std::string& why) {
    return absl::InvalidArgumentError(
        absl::StrFormat("%s = \"%s\": %s (expected host:port)", flag, address, why));
  };
  if (colon == std::string::npos) return bad("no port");
  std::string h = address.substr(0, colon);
  if (h.empty()) return bad("no host");
  if (absl::StartsWith(h, "[") != absl::EndsWith(h, "]")) return bad("unbalanced brackets");
  if (!absl::StartsWith(h, "[") && h.find(':') != std::string::npos) {
    return bad("an IPv6 host needs brackets");
  }
  int p = 0;
  if (!absl::SimpleAtoi(address.substr(colon + 1), &p) || p < 0 || p > 65535) {
    return bad("port must be an integer between 0 and 65535");
  }
  if (host != nullptr) *host = std::move(h);
  if (port != nullptr) *port = p;
  return absl::OkStatus();
}

std::string DefaultReplicaId() {
  char host[256] = {};
  if (gethostname(host, sizeof(host) - 1) != 0 || host[0] == '\0') {
    return absl::StrCat("coordinator:", getpid());
  }
  return absl::StrCat(host, ":", getpid());
}

absl::Status ValidateConfig(const CoordinatorConfig& c) {
  int listen_port = 0, metrics_port = 0;
  if (absl::Status s = SplitHostPort(c.listen, "--listen (RESHARD_LISTEN)", nullptr, &listen_port);
      !s.ok()) {
    return s;
  }
  if (absl::Status s = SplitHostPort(c.metrics_listen, "--metrics-listen (RESHARD_METRICS_LISTEN)",
                                     nullptr, &metrics_port);
      !s.ok()) {
    return s;
  }
  if (listen_port != 0 && listen_port == metrics_port) {
    return absl::InvalidArgumentError(
        absl::StrFormat("--listen = \"%s\" and --metrics-listen = \"%s\" use the same port %d",
                        c.listen, c.metrics_listen, listen_port));
  }
  if (c.dsn.empty()) {
    return absl::InvalidArgumentError(
        "--dsn (RESHARD_DSN) is required: a PostgreSQL connection string");
  }
  constexpr int64_t kDay = 24 * 3600 * 1000;
  for (absl::Status s :
       {Range("lease-ms", c.lease_ms, 100, kDay),
        Range("transfer-timeout-ms", c.transfer_timeout_ms, 1000, 7 * kDay),
        Range("stall-timeout-ms", c.stall_timeout_ms, 100, kDay),
        Range("tick-ms", c.tick_ms, 1, 60000),
        Range("leader-retry-ms", c.leader_retry_ms, 1, 60000),
        Range("pool-size", c.pool_size, 1, 256),
        Range("store-acquire-timeout-ms", c.store_acquire_timeout_ms, 1, kDay),
        Range("store-statement-timeout-ms", c.store_statement_timeout_ms, 100, kDay),
        Range("store-connect-timeout-s", c.store_connect_timeout_s, 2, 3600),
        Range("max-spec-bytes", c.max_spec_bytes, 1024, int64_t{1} << 30),
        Range("max-watch-streams", c.max_watch_streams, 1, 100000),
        Range("max-watch-streams-per-identity", c.max_watch_streams_per_identity, 1,
              c.max_watch_streams),
        Range("max-watch-streams-per-tenant", c.max_watch_streams_per_tenant, 0,
              c.max_watch_streams),
        Range("watch-resync-ms", c.watch_resync_ms, 50, 600000),
        Range("step-boundary-timeout-ms", c.step_boundary_timeout_ms, 1, kDay),
        Range("max-rpc-threads", c.max_rpc_threads, 0, 1000000),
        Range("retention-keep-retired", c.retention_keep_retired, 0, 1000000),
        Range("retention-retired-age-ms", c.retention_retired_age_ms, 3 * c.lease_ms, 365 * kDay),
        Range("retention-discarded-age-ms", c.retention_discarded_age_ms, 3 * c.lease_ms,
              365 * kDay),
        Range("retention-keep-operations", c.retention_keep_operations, 0, 1000000),
        Range("retention-operation-age-ms", c.retention_operation_age_ms, 0, 3650 * kDay),
        Range("retention-audit-age-ms", c.retention_audit_age_ms, 0, 3650 * kDay),
        Range("retention-batch-rows", c.retention_batch_rows, 1, 100000),
        Range("retention-batches", c.retention_batches, 1, 1000),
        Range("retention-interval-ms", c.retention_interval_ms, 0, kDay)}) {
    if (!s.ok()) return s;
  }
  if (c.pool_agent_reserve < 0 || c.pool_agent_reserve >= c.pool_size) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "--pool-agent-reserve (RESHARD_POOL_AGENT_RESERVE) = %d: must be at least 0 and less "
        "than --pool-size = %d, or client calls get no connection",
        c.pool_agent_reserve, c.pool_size));
  }
  if (c.tick_ms >= c.lease_ms) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "--tick-ms = %d must be shorter than --lease-ms = %d, or leases expire between ticks",
        c.tick_ms, c.lease_ms));
  }
  if (c.tls.reload_seconds < 1 || c.tls.reload_seconds > 86400) {
    return absl::InvalidArgumentError(
        absl::StrFormat("--tls-reload-s (RESHARD_TLS_RELOAD_S) = %d: must be between 1 and 86400",
                        c.tls.reload_seconds));
  }
  if (c.replica_id.empty()) {
    return absl::InvalidArgumentError("--replica-id (RESHARD_REPLICA_ID) is empty");
  }
  for (char ch : c.replica_id) {
    if (ch == ' ' || ch == '\t' || ch == '\n' || ch == '\r') {
      return absl::InvalidArgumentError(absl::StrFormat(
          "--replica-id (RESHARD_REPLICA_ID) = \"%s\": must not contain whitespace", c.replica_id));
    }
  }
  return absl::OkStatus();
}

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
  std::vector<bool> given(Settings().size(), false);
  for (; i < args.size(); ++i) {
    const std::string& arg = args[i];
    if (arg == "-h" || arg == "--help") {
      out.help = true;
      return out;
    }
    if (!absl::StartsWith(arg, "--")) {
      return absl::InvalidArgumentError(absl::StrFormat("unexpected argument \"%s\"", arg));
    }
    std::string name = arg.substr(2), value;
    const size_t eq = name.find('=');
    bool has_value = eq != std::string::npos;
    if (has_value) {
      value = name.substr(eq + 1);
      name.resize(eq);
    }
    const Setting* s = FindSetting(name);
    if (s == nullptr) {
      return absl::InvalidArgumentError(absl::StrFormat("unknown flag --%s (see --help)", name));
    }
    if (!has_value && s->boolean) {
      value = "true";
    } else if (!has_value) {
      if (i + 1 >= args.size()) {
        return absl::InvalidArgumentError(absl::StrFormat("flag --%s needs a value", name));
      }
      value = args[++i];
    }
    const size_t index = s - Settings().data();
    if (given[index]) {
      return absl::InvalidArgumentError(absl::StrFormat("flag --%s given twice", name));
    }
    given[index] = true;
    if (absl::Status st = s->set(value, &out.config); !st.ok()) {
      return absl::InvalidArgumentError(
          absl::StrFormat("--%s = \"%s\": %s", name, value, st.message()));
    }
  }
  for (size_t k = 0; k < Settings().size(); ++k) {
    if (given[k]) continue;
    const Setting& s = Settings()[k];
    std::optional<std::string> value = getenv(s.env);
    if (!value.has_value()) continue;
    if (absl::Status st = s.set(*value, &out.config); !st.ok()) {
      return absl::InvalidArgumentError(
          absl::StrFormat("%s = \"%s\": %s", s.env, *value, st.message()));
    }
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

std::string Usage() {
  const CoordinatorConfig defaults;
  std::string out =
      "usage: reshard-coordinator [serve] [flags]   run a coordinator replica\n"
      "       reshard-coordinator migrate --dsn DSN  apply the schema migrations and exit\n"
      "\n"
      "Every flag may also come from its environment variable; a flag wins.\n"
      "\n";
  for (const Setting& s : Settings()) {
    std::string def = s.default_text(defaults);
    if (std::string(s.flag) == "replica-id") def = "hostname:pid";
    absl::StrAppendFormat(&out, "  --%-20s env %s", absl::StrCat(s.flag, s.boolean ? "" : " V"),
                          s.env);
    if (!def.empty()) absl::StrAppend(&out, ", default ", def);
    absl::StrAppend(&out, "\n      ", s.help, "\n");
  }
  absl::StrAppend(&out, "  -h, --help\n");
  return out;
}

}  // namespace reshard::coordinator
