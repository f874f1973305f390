#include "common/config_table.h"

#include <cstdlib>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_format.h"

namespace reshard {

GetEnvFn ProcessEnv() {
  return [](const std::string& name) -> std::optional<std::string> {
    const char* v = std::getenv(name.c_str());
    if (v == nullptr) return std::nullopt;
    return std::string(v);
  };
}

absl::Status ParseBool(const std::string& text, bool* out) {
  const std::string t = absl::AsciiStrToLower(text);
  if (t == "1" || t == "true" || t == "yes" || t == "on") {
    *out = true;
  } else if (t == "0" || t == "false" || t == "no" || t == "off") {
    *out = false;
  } else {
    return absl::InvalidArgumentError("expected true or false");
  }
  return absl::OkStatus();
}

absl::Status SplitHostPort(const std::string& address, const std::string& name, std::string* host,
                           int* port) {
  const size_t colon = address.rfind(':');
  auto bad = [&](const std::string& why) {
    return absl::InvalidArgumentError(
        absl::StrFormat("%s = \"%s\": %s (expected host:port)", name, address, why));
  };
  if (colon == std::string::npos) return bad("no port");
  std::string h = address.substr(0, colon);
  if (h.empty() || h == "[]") return bad("no host");
  if (absl::StartsWith(h, "[") != absl::EndsWith(h, "]")) return bad("unbalanced brackets");
  if (!absl::StartsWith(h, "[") && h.find(':') != std::string::npos) {
    return bad("an IPv6 host needs brackets");
  }
  if (h.find_first_of(" \t\n/") != std::string::npos) return bad("the host has '/' or spaces");
  int p = 0;
  if (!absl::SimpleAtoi(address.substr(colon + 1), &p) || p < 0 || p > 65535) {
    return bad("port must be an integer between 0 and 65535");
  }
  if (host != nullptr) *host = std::move(h);
  if (port != nullptr) *port = p;
  return absl::OkStatus();
}

std::string SettingName(const SettingInfo& row) {
  return absl::StrCat("--", row.flag, " (", row.env, ")");
}

namespace config_table_internal {

absl::Status Collect(const std::vector<const SettingInfo*>& rows,
                     const std::vector<std::string>& args, size_t begin, const GetEnvFn& getenv,
                     const ParseOptions& options, std::vector<std::optional<Found>>* found,
                     bool* help) {
  *help = false;
  found->assign(rows.size(), std::nullopt);
  for (size_t i = begin; i < args.size(); ++i) {
    const std::string& arg = args[i];
    if (arg == "-h" || arg == "--help") {
      *help = true;
      return absl::OkStatus();
    }
    if (!absl::StartsWith(arg, "--")) {
      return absl::InvalidArgumentError(absl::StrFormat("unexpected argument \"%s\"", arg));
    }
    std::string name = arg.substr(2), value;
    const size_t eq = name.find('=');
    const bool has_value = eq != std::string::npos;
    if (has_value) {
      value = name.substr(eq + 1);
      name.resize(eq);
    }
    size_t index = 0;
    while (index < rows.size() && rows[index]->flag != name) ++index;
    if (index == rows.size()) {
      return absl::InvalidArgumentError(absl::StrFormat("unknown flag --%s (see --help)", name));
    }
    if (!has_value && rows[index]->value_name.empty()) {
      value = "true";
    } else if (!has_value) {
      if (i + 1 >= args.size()) {
        return absl::InvalidArgumentError(absl::StrFormat("flag --%s needs a value", name));
      }
      value = args[++i];
    }
    if ((*found)[index].has_value() && !options.repeated_flag_last_wins) {
      return absl::InvalidArgumentError(absl::StrFormat("flag --%s given twice", name));
    }
    (*found)[index] = Found{std::move(value), /*from_env=*/false};
  }
  for (size_t k = 0; k < rows.size(); ++k) {
    if ((*found)[k].has_value()) continue;
    std::optional<std::string> value = getenv(rows[k]->env);
    if (!value.has_value() || (value->empty() && options.empty_env_is_unset)) continue;
    (*found)[k] = Found{std::move(*value), /*from_env=*/true};
  }
  return absl::OkStatus();
}

absl::Status ValueError(const SettingInfo& row, const Found& found, const absl::Status& why) {
  const std::string name = found.from_env ? row.env : absl::StrCat("--", row.flag);
  return absl::InvalidArgumentError(
      absl::StrFormat("%s = \"%s\": %s", name, found.value, why.message()));
}

absl::Status RangeCheck(const std::string& name, int64_t value, int64_t lo, int64_t hi) {
  if (value >= lo && value <= hi) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrFormat("%s = %d: must be between %d and %d", name, value, lo, hi));
}

std::string UsageEntry(const SettingInfo& row, const std::string& default_text) {
  std::string out = absl::StrFormat(
      "  --%-20s env %s", absl::StrCat(row.flag, row.value_name.empty() ? "" : " ", row.value_name),
      row.env);
  if (!default_text.empty()) absl::StrAppend(&out, ", default ", default_text);
  absl::StrAppend(&out, "\n      ", row.help, "\n");
  return out;
}

}  // namespace config_table_internal
}  // namespace reshard
