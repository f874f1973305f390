// reshardctl: command-line client of reshard. Dispatches to a subcommand.
#include <iostream>
#include <string>
#include <vector>

#include "client/cli/plan_command.h"

namespace {

constexpr char kUsage[] =
    "usage: reshardctl COMMAND [FLAGS]\n"
    "\n"
    "commands:\n"
    "  plan    plan moving a job's state to a new layout (offline, no server)\n"
    "\n"
    "Run \"reshardctl COMMAND --help\" for a command's flags.\n";

}  // namespace

int main(int argc, char** argv) {
  std::ios::sync_with_stdio(false);
  const std::vector<std::string> args(argv + 1, argv + argc);
  if (args.empty()) {
    std::cerr << kUsage;
    return 2;
  }
  const std::string& command = args.front();
  if (command == "-h" || command == "--help" || command == "help") {
    std::cout << kUsage;
    return 0;
  }
  const std::vector<std::string> rest(args.begin() + 1, args.end());
  if (command == "plan") return reshard::cli::PlanMain(rest, std::cout, std::cerr);
  std::cerr << "INVALID_ARGUMENT: unknown command \"" << command << "\"\n\n" << kUsage;
  return 2;
}
