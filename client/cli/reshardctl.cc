// reshardctl: command-line client of reshard. Dispatches to a subcommand.
#include <unistd.h>

#include <cstdlib>
#include <iostream>
#include <string>
#include <vector>

#include "client/cli/exit_codes.h"
#include "client/cli/plan_command.h"
#include "client/cli/server_commands.h"

namespace {

constexpr char kUsage[] =
    "usage: reshardctl [GLOBAL FLAGS] COMMAND [ARGS] [FLAGS]\n"
    "\n"
    "commands:\n"
    "  jobs list                      list jobs\n"
    "  jobs show JOB                  show a job: state, generation, layout, lost hosts\n"
    "  jobs register --spec JOB.json  register a job\n"
    "  jobs delete JOB                delete a job\n"
    "  jobs worker-token JOB          the token the job's workers give their agent\n"
    "  resize JOB --to LAYOUT.json    move a job to a new layout (waits, with progress)\n"
    "  migrate JOB --to LAYOUT.json   move a job's ranks to other devices, same config\n"
    "  recover JOB --lost HOSTS [--to LAYOUT.json]\n"
    "                                 rebuild a job's state from the survivors\n"
    "  preview JOB --to LAYOUT.json [--lost LIST]\n"
    "                                 plan a move and show its traffic; nothing moves\n"
    "  hosts list                     list hosts and their agents' lease\n"
    "  ops show OP | ops watch OP | ops cancel OP\n"
    "                                 show, follow or abort an operation\n"
    "  auth create | auth revoke ID | auth list\n"
    "                                 bearer tokens (admin only)\n"
    "  audit [--job J] [--tenant T] [--since WHEN] [--limit N]\n"
    "                                 who changed what, and what was refused\n"
    "  advise JOB --gpus N [--hosts H1,H2] [--horizon 1h] --heads N --seq N --batch N\n"
    "                                 which layouts suit the job on N devices (resize\n"
    "                                 JOB --choose --gpus N ...: move to the best)\n"
    "  plan                           plan a move offline from files (no server)\n"
    "\n"
    "global flags:\n"
    "  --coordinator HOST:PORT   the coordinator (default $RESHARD_COORDINATOR, else "
    "127.0.0.1:7070)\n"
    "  --output table|json       json: the reply as proto JSON with original field names\n"
    "  --timeout DURATION        deadline of each call, retries included (default 30s)\n"
    "  --tls-ca FILE             CA of the coordinator's certificate ($RESHARD_TLS_CA)\n"
    "  --tls-cert FILE, --tls-key FILE\n"
    "                            client certificate for mutual TLS ($RESHARD_TLS_CERT/KEY)\n"
    "  --token-file FILE         bearer token ($RESHARD_TOKEN_FILE, or the token in\n"
    "                            $RESHARD_TOKEN)\n"
    "  --insecure                plaintext (a coordinator run with --insecure)\n"
    "\n"
    "Errors go to stderr as \"CODE_NAME: message\".\n";

bool IsGlobalFlag(const std::string& arg, const char* name) {
  const std::string flag = std::string("--") + name;
  return arg == flag || arg.rfind(flag + "=", 0) == 0;
}

}  // namespace

int main(int argc, char** argv) {
  std::ios::sync_with_stdio(false);
  const std::vector<std::string> args(argv + 1, argv + argc);
  // Global flags may come before the command; they are handed to it.
  std::vector<std::string> globals;
  size_t i = 0;
  std::string output;
  while (i < args.size()) {
    const std::string& a = args[i];
    if (a == "--insecure") {
      globals.push_back(a);
      ++i;
      continue;
    }
    if (!IsGlobalFlag(a, "coordinator") && !IsGlobalFlag(a, "output") &&
        !IsGlobalFlag(a, "timeout") && !IsGlobalFlag(a, "tls-ca") && !IsGlobalFlag(a, "tls-cert") &&
        !IsGlobalFlag(a, "tls-key") && !IsGlobalFlag(a, "token-file")) {
      break;
    }
    globals.push_back(a);
    if (a.find('=') == std::string::npos) {
      if (i + 1 >= args.size()) {
        std::cerr << "INVALID_ARGUMENT: flag \"" << a << "\" needs a value\n";
        return reshard::cli::kExitUsage;
      }
      globals.push_back(args[++i]);
    }
    if (IsGlobalFlag(a, "output")) output = globals.back().substr(globals.back().find('=') + 1);
    ++i;
  }
  if (i >= args.size()) {
    std::cerr << kUsage;
    return reshard::cli::kExitUsage;
  }
  const std::string& command = args[i];
  if (command == "-h" || command == "--help" || command == "help") {
    std::cout << kUsage << "\n" << reshard::cli::kExitCodesHelp;
    return reshard::cli::kExitOk;
  }
  std::vector<std::string> rest(args.begin() + i + 1, args.end());
  if (command == "plan") {
    // Offline: only --output carries over.
    if (!output.empty()) rest.insert(rest.begin(), {"--output", output});
    return reshard::cli::PlanMain(rest, std::cout, std::cerr);
  }
  if (reshard::cli::IsServerCommand(command)) {
    rest.insert(rest.end(), globals.begin(), globals.end());
    const char* env = std::getenv("RESHARD_COORDINATOR");
    reshard::cli::CommandEnv command_env;
    command_env.stderr_is_tty = ::isatty(STDERR_FILENO) == 1;
    command_env.getenv = [](const char* name) { return std::getenv(name); };
    return reshard::cli::ServerMain(command, rest, std::cout, std::cerr, env ? env : "",
                                    command_env);
  }
  std::cerr << "INVALID_ARGUMENT: unknown command \"" << command << "\"\n\n" << kUsage;
  return reshard::cli::kExitUsage;
}
