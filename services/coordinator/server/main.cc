// reshard-coordinator: `serve` (the default) runs one replica until SIGTERM
// or SIGINT; `migrate` applies the schema migrations and exits.
// Exit status: 0 clean, 1 runtime error, 2 bad command line or configuration.

#include <cstdio>
#include <string>
#include <vector>

#include "common/log.h"
#include "common/runtime.h"
#include "common/signals.h"
#include "services/coordinator/server/config.h"
#include "services/coordinator/server/server.h"
#include "services/coordinator/store/migrator.h"

namespace {

using reshard::coordinator::CommandLine;
using reshard::coordinator::CoordinatorCommand;

int RunMigrate(const reshard::coordinator::CoordinatorConfig& config) {
  if (absl::Status s = reshard::coordinator::Migrate(config.dsn); !s.ok()) {
    std::fprintf(stderr, "reshard-coordinator migrate: %s\n", s.ToString().c_str());
    return 1;
  }
  absl::StatusOr<int> version = reshard::coordinator::CurrentSchemaVersion(config.dsn);
  if (!version.ok()) {
    std::fprintf(stderr, "reshard-coordinator migrate: %s\n", version.status().ToString().c_str());
    return 1;
  }
  std::printf("reshard-coordinator migrate: schema at version %d\n", *version);
  return 0;
}

int RunServe(const reshard::coordinator::CoordinatorConfig& config) {
  reshard::BlockTerminationSignals();

  reshard::coordinator::CoordinatorServer server(config);
  if (absl::Status s = server.Start(); !s.ok()) {
    std::fprintf(stderr, "reshard-coordinator: cannot start: %s\n", s.ToString().c_str());
    return 1;
  }
  std::printf("%s\n", server.StartupLine().c_str());
  std::fflush(stdout);

  const int received = reshard::WaitForTerminationSignal();
  RESHARD_LOG(INFO) << "replica=" << config.replica_id << " received signal " << received
                    << ", shutting down";
  server.Shutdown();
  RESHARD_LOG(INFO) << "replica=" << config.replica_id << " stopped";
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  reshard::UseReleaseRuntime();
  const std::vector<std::string> args(argv + 1, argv + argc);
  absl::StatusOr<CommandLine> cl =
      reshard::coordinator::ParseCommandLine(args, reshard::coordinator::ProcessEnv());
  if (!cl.ok()) {
    std::fprintf(stderr, "reshard-coordinator: %s\n(see reshard-coordinator --help)\n",
                 std::string(cl.status().message()).c_str());
    return 2;
  }
  if (cl->help) {
    std::fputs(reshard::coordinator::Usage().c_str(), stdout);
    return 0;
  }
  reshard::SetMinLogSeverity(cl->config.log_level);
  if (cl->command == CoordinatorCommand::kMigrate) return RunMigrate(cl->config);
  return RunServe(cl->config);
}
