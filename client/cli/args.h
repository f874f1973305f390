// Command-line flag splitting shared by reshardctl's subcommands.
// Pure functions; thread-safe.
#pragma once

#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"

namespace reshard::cli {

/// A subcommand's arguments split into flags and positionals.
struct ParsedArgs {
  absl::flat_hash_map<std::string, std::string> values;  // flag name (no "--") -> value
  std::vector<std::string> positional;
  bool help = false;  // -h or --help was given
};

/// Accepts `--name value` and `--name=value` for every name in `value_flags`,
/// `--name` alone for every name in `bool_flags` (its value is "true"),
/// plus -h/--help; "--" ends the flags. InvalidArgument, naming the flag, on
/// an unknown flag, a missing value or a flag given twice.
[[nodiscard]] absl::StatusOr<ParsedArgs> ParseArgs(const std::vector<std::string>& args,
                                                   const std::vector<std::string>& value_flags,
                                                   const std::vector<std::string>& bool_flags = {});

}  // namespace reshard::cli
