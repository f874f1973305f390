// reshardctl's commands that talk to a coordinator: jobs, resize, migrate,
// recover, preview, hosts, ops. Argument parsing is pure (unit-tested);
// RunServerCommand does the RPCs through reshard::client::CoordinatorClient.
// Not thread-safe: one command per process.
#pragma once

#include <cstdint>
#include <functional>
#include <ostream>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/tls.h"
#include "reshard/v1/coordinator.pb.h"
#include "reshard/v1/ptc.pb.h"

namespace reshard::cli {

/// Default coordinator when neither --coordinator nor RESHARD_COORDINATOR is set.
inline constexpr char kDefaultCoordinator[] = "127.0.0.1:7070";

/// Flags every server command accepts (before or after the command).
struct GlobalOptions {
  enum class Output { kTable, kJson };
  std::string coordinator;  // host:port
  Output output = Output::kTable;
  absl::Duration timeout = absl::Seconds(30);  // per RPC, retries included
  /// --tls-ca/--tls-cert/--tls-key/--insecure, else RESHARD_TLS_CA,
  /// RESHARD_TLS_CERT, RESHARD_TLS_KEY, RESHARD_INSECURE.
  TlsFiles tls;
  /// The bearer token: from --token-file, else $RESHARD_TOKEN_FILE, else
  /// $RESHARD_TOKEN. Never printed.
  std::string token;
};

/// One parsed server command line.
struct ServerInvocation {
  std::string command;  // "jobs list", "resize", "ops watch", ...
  GlobalOptions global;
  std::vector<std::string> positional;                  // JOB / OP
  absl::flat_hash_map<std::string, std::string> flags;  // command flags (no "--")
  bool help = false;
};

/// Whether `name` is a server command or command group (jobs, hosts, ops).
bool IsServerCommand(const std::string& name);

/// The usage text of a command ("resize") or group ("jobs").
std::string ServerUsage(const std::string& command);

/// Reads an environment variable (nullptr when unset).
using GetEnv = std::function<const char*(const char*)>;

/// Parses `args` (what follows `command` on the command line) of a server
/// command. `coordinator_env` is $RESHARD_COORDINATOR (may be empty);
/// `getenv` gives the TLS and token variables (empty: none set).
/// Every error is a usage error (InvalidArgument naming the flag or value).
[[nodiscard]] absl::StatusOr<ServerInvocation> ParseServerArgs(const std::string& command,
                                                               const std::vector<std::string>& args,
                                                               const std::string& coordinator_env,
                                                               const GetEnv& getenv = {});

/// `--timeout`: an absl duration ("30s", "1m", "500ms") or plain seconds ("2.5").
[[nodiscard]] absl::StatusOr<absl::Duration> ParseTimeout(const std::string& text);

/// `--deadline`, `--leaves`: a duration from `now_unix_ms` (as
/// ParseTimeout) or an RFC 3339 time; unix milliseconds. InvalidArgument
/// naming the flag and the text.
[[nodiscard]] absl::StatusOr<int64_t> ParseWhen(const std::string& flag, const std::string& text,
                                                int64_t now_unix_ms);

/// `audit --since`: a duration back from `now_unix_ms` (as ParseTimeout)
/// or an RFC 3339 time; unix milliseconds. InvalidArgument naming the text.
[[nodiscard]] absl::StatusOr<int64_t> ParseSince(const std::string& text, int64_t now_unix_ms);

/// What the commands need from outside: the terminal and the clock.
struct CommandEnv {
  bool stderr_is_tty = false;
  std::function<int64_t()> now_unix_ms;  // empty: the system clock
  GetEnv getenv;                         // empty: no variables
};

/// Runs a parsed invocation; returns the exit status (client/cli/exit_codes.h).
/// Results go to `out`; errors ("CODE_NAME: message") and progress to `err`.
int RunServerCommand(const ServerInvocation& invocation, std::ostream& out, std::ostream& err,
                     const CommandEnv& env);

/// Parses and runs `reshardctl <command> <args>`, printing usage errors
/// (exit 2) and help (exit 0).
int ServerMain(const std::string& command, const std::vector<std::string>& args, std::ostream& out,
               std::ostream& err, const std::string& coordinator_env, const CommandEnv& env);

}  // namespace reshard::cli
