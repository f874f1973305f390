#include "client/cli/args.h"

#include <algorithm>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace reshard::cli {

absl::StatusOr<ParsedArgs> ParseArgs(const std::vector<std::string>& args,
                                     const std::vector<std::string>& value_flags,
                                     const std::vector<std::string>& bool_flags) {
  ParsedArgs out;
  bool flags_done = false;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& arg = args[i];
    if (flags_done || arg.empty() || arg[0] != '-' || arg == "-") {
      out.positional.push_back(arg);
      continue;
    }
    if (arg == "--") {
      flags_done = true;
      continue;
    }
    if (arg == "-h" || arg == "--help") {
      out.help = true;
      continue;
    }
    if (!absl::StartsWith(arg, "--")) {
      return absl::InvalidArgumentError(absl::StrCat("unknown flag \"", arg, "\""));
    }
    std::string name = arg.substr(2);
    std::string value;
    bool has_value = false;
    if (const size_t eq = name.find('='); eq != std::string::npos) {
      value = name.substr(eq + 1);
      name.resize(eq);
      has_value = true;
    }
    if (std::find(bool_flags.begin(), bool_flags.end(), name) != bool_flags.end()) {
      if (has_value) {
        return absl::InvalidArgumentError(absl::StrCat("flag \"--", name, "\" takes no value"));
      }
      if (!out.values.emplace(name, "true").second) {
        return absl::InvalidArgumentError(absl::StrCat("flag \"--", name, "\" given twice"));
      }
      continue;
    }
    if (std::find(value_flags.begin(), value_flags.end(), name) == value_flags.end()) {
      return absl::InvalidArgumentError(absl::StrCat("unknown flag \"--", name, "\""));
    }
    if (!has_value) {
      if (i + 1 >= args.size()) {
        return absl::InvalidArgumentError(absl::StrCat("flag \"--", name, "\" needs a value"));
      }
      value = args[++i];
    }
    if (!out.values.emplace(name, value).second) {
      return absl::InvalidArgumentError(absl::StrCat("flag \"--", name, "\" given twice"));
    }
  }
  return out;
}

}  // namespace reshard::cli
