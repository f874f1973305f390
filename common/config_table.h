// A binary's configuration as one declared table: a row per setting (its
// flag, environment variable, help, the field it sets, how a value is parsed
// and the range it must fall in, and how its default reads), from which the
// command-line parsing, the environment fallback (a flag wins over its
// variable, either over the default), the usage text and the range checks
// are all derived. reshard-coordinator (services/coordinator/server/config.cc)
// and reshard-agent (agent/process/config.cc) each declare their table; this
// is the machinery they share.
//
// Messages name the setting and the value: `--lease-ms = "abc": not an
// integer` (a flag), `RESHARD_LEASE_MS = "abc": not an integer` (its
// variable), `--lease-ms (RESHARD_LEASE_MS) = 5: must be between 100 and
// 86400000` (a range), all InvalidArgument.
//
// Pure functions; a table is immutable once built and thread-safe.
#pragma once

#include <cstdint>
#include <functional>
#include <limits>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace reshard {

/// Reads an environment variable; nullopt when unset.
using GetEnvFn = std::function<std::optional<std::string>(const std::string& name)>;

/// The process environment (std::getenv).
GetEnvFn ProcessEnv();

/// Parses a boolean flag or variable value: 1/true/yes/on or 0/false/no/off
/// (any case); else InvalidArgument "expected true or false".
[[nodiscard]] absl::Status ParseBool(const std::string& text, bool* out);

/// Parses a decimal integer that fits `Int`; else InvalidArgument "not an
/// integer".
template <typename Int>
[[nodiscard]] absl::Status ParseInteger(const std::string& text, Int* out) {
  static_assert(sizeof(Int) < sizeof(int64_t) || std::is_signed_v<Int>,
                "values are read as int64_t");
  int64_t v = 0;
  if (!absl::SimpleAtoi(text, &v) || v < static_cast<int64_t>(std::numeric_limits<Int>::min()) ||
      v > static_cast<int64_t>(std::numeric_limits<Int>::max())) {
    return absl::InvalidArgumentError("not an integer");
  }
  *out = static_cast<Int>(v);
  return absl::OkStatus();
}

/// Splits "host:port" ("[v6]:port" too; the host keeps its brackets) with a
/// port in [0, 65535] (0: any free port). InvalidArgument naming `name` (a
/// flag as errors show it, e.g. "--listen (RESHARD_LISTEN)") and the value.
[[nodiscard]] absl::Status SplitHostPort(const std::string& address, const std::string& name,
                                         std::string* host, int* port);

/// What every row has whatever its configuration type.
struct SettingInfo {
  std::string flag;  ///< without "--"
  std::string env;
  std::string help;
  /// The value's name in the usage (`--flag N`); empty for a boolean flag,
  /// which `--flag` alone sets true.
  std::string value_name = "V";
  /// The default as the usage shows it, when the field's own value does not
  /// say it (e.g. "hostname:pid"); empty: the field's default value.
  std::string default_text;
};

/// One row of `Config`'s table. Build rows with the functions below.
template <typename Config>
struct Setting : SettingInfo {
  /// Stores a value; InvalidArgument saying what is wrong with it (the
  /// table adds the flag or variable and the value).
  std::function<absl::Status(const std::string& value, Config* config)> set;
  /// The field's value as the usage shows it.
  std::function<std::string(const Config& config)> show;
  /// Checks the field of a whole configuration (a range, which may depend
  /// on other fields; an address); null: nothing to check. `name` is the
  /// row's "--flag (ENV)".
  std::function<absl::Status(const Config& config, const std::string& name)> check;
};

/// The historical differences between the binaries' command lines.
struct ParseOptions {
  /// A flag given twice: its last value wins (reshard-agent); else
  /// InvalidArgument "flag --X given twice" (reshard-coordinator).
  bool repeated_flag_last_wins = false;
  /// An empty environment variable counts as unset (reshard-agent); else it
  /// is a value like any other (reshard-coordinator).
  bool empty_env_is_unset = false;
};

namespace config_table_internal {

/// A row's value and where it came from.
struct Found {
  std::string value;
  bool from_env = false;
};

/// Reads `args[begin..]` (`--flag value`, `--flag=value`, a boolean
/// `--flag`), then for every row no flag named, its variable. `*help` set on
/// -h/--help (then nothing further is read).
[[nodiscard]] absl::Status Collect(const std::vector<const SettingInfo*>& rows,
                                   const std::vector<std::string>& args, size_t begin,
                                   const GetEnvFn& getenv, const ParseOptions& options,
                                   std::vector<std::optional<Found>>* found, bool* help);

/// `--flag = "value": why` or `ENV = "value": why`.
absl::Status ValueError(const SettingInfo& row, const Found& found, const absl::Status& why);

/// `--flag (ENV) = value: must be between lo and hi`; OK within.
absl::Status RangeCheck(const std::string& name, int64_t value, int64_t lo, int64_t hi);

/// One flag's entry in the usage text.
std::string UsageEntry(const SettingInfo& row, const std::string& default_text);

/// The field of `config` (const or not) that `field` names.
template <typename C, typename Field>
decltype(auto) Get(C& config, const Field& field) {
  return std::invoke(field, config);
}

/// A row with its names and help; the builders below add the rest.
template <typename Config>
Setting<Config> Named(std::string flag, std::string env, std::string help,
                      std::string value_name) {
  Setting<Config> s;
  s.flag = std::move(flag);
  s.env = std::move(env);
  s.help = std::move(help);
  s.value_name = std::move(value_name);
  return s;
}

}  // namespace config_table_internal

/// "--flag (ENV)": how messages name a row.
std::string SettingName(const SettingInfo& row);

/// A table: its rows and how the command line is read.
template <typename Config>
class ConfigTable {
 public:
  ConfigTable(std::vector<Setting<Config>> rows, ParseOptions options)
      : rows_(std::move(rows)), options_(options) {}

  const std::vector<Setting<Config>>& rows() const { return rows_; }

  /// The row of `flag` (without "--"); null when none.
  const Setting<Config>* Find(const std::string& flag) const {
    for (const Setting<Config>& row : rows_) {
      if (row.flag == flag) return &row;
    }
    return nullptr;
  }

  /// Fills `config` from `args[begin..]` and then `getenv`, every row in
  /// table order; fields no flag or variable names keep their value.
  /// InvalidArgument naming the flag (or variable) and the value. `*help`
  /// set on -h/--help: then nothing is stored.
  [[nodiscard]] absl::Status Parse(const std::vector<std::string>& args, size_t begin,
                                   const GetEnvFn& getenv, Config* config, bool* help) const {
    std::vector<const SettingInfo*> infos;
    for (const Setting<Config>& row : rows_) infos.push_back(&row);
    std::vector<std::optional<config_table_internal::Found>> found;
    if (absl::Status s =
            config_table_internal::Collect(infos, args, begin, getenv, options_, &found, help);
        !s.ok() || *help) {
      return s;
    }
    for (size_t i = 0; i < rows_.size(); ++i) {
      if (!found[i].has_value()) continue;
      if (absl::Status s = rows_[i].set(found[i]->value, config); !s.ok()) {
        return config_table_internal::ValueError(rows_[i], *found[i], s);
      }
    }
    return absl::OkStatus();
  }

  /// Every row's check, in table order: the first failure.
  [[nodiscard]] absl::Status Check(const Config& config) const {
    for (const Setting<Config>& row : rows_) {
      if (!row.check) continue;
      if (absl::Status s = row.check(config, SettingName(row)); !s.ok()) return s;
    }
    return absl::OkStatus();
  }

  /// Every flag with its variable, default (as `defaults` hold it) and help.
  std::string Usage(const Config& defaults) const {
    std::string out;
    for (const Setting<Config>& row : rows_) {
      out += config_table_internal::UsageEntry(
          row, row.default_text.empty() ? row.show(defaults) : row.default_text);
    }
    return out;
  }

 private:
  std::vector<Setting<Config>> rows_;
  ParseOptions options_;
};

// ---- Rows. `field` is a member pointer (&Config::x) or a function of a
// Config& returning the field's reference (for nested fields).

/// A free-form string.
template <typename Config, typename Field>
Setting<Config> StringSetting(std::string flag, std::string env, std::string help, Field field,
                              std::string value_name = "V") {
  Setting<Config> s = config_table_internal::Named<Config>(std::move(flag), std::move(env),
                                                           std::move(help), std::move(value_name));
  s.set = [field](const std::string& value, Config* c) {
    config_table_internal::Get(*c, field) = value;
    return absl::OkStatus();
  };
  s.show = [field](const Config& c) { return std::string(config_table_internal::Get(c, field)); };
  return s;
}

/// A HOST:PORT address (SplitHostPort); `empty_ok`: empty means off.
template <typename Config, typename Field>
Setting<Config> HostPortSetting(std::string flag, std::string env, std::string help, Field field,
                                bool empty_ok = false) {
  Setting<Config> s =
      StringSetting<Config>(std::move(flag), std::move(env), std::move(help), field, "HOST:PORT");
  s.check = [field, empty_ok](const Config& c, const std::string& name) {
    const std::string& v = config_table_internal::Get(c, field);
    if (empty_ok && v.empty()) return absl::OkStatus();
    return SplitHostPort(v, name, nullptr, nullptr);
  };
  return s;
}

/// An integer within [range(config).first, range(config).second], bounds
/// that may depend on other fields.
template <typename Config, typename Field>
Setting<Config> IntSetting(std::string flag, std::string env, std::string help, Field field,
                           std::function<std::pair<int64_t, int64_t>(const Config&)> range,
                           std::string value_name = "N") {
  Setting<Config> s = config_table_internal::Named<Config>(std::move(flag), std::move(env),
                                                           std::move(help), std::move(value_name));
  s.set = [field](const std::string& value, Config* c) {
    return ParseInteger(value, &config_table_internal::Get(*c, field));
  };
  s.show = [field](const Config& c) { return absl::StrCat(config_table_internal::Get(c, field)); };
  s.check = [field, range = std::move(range)](const Config& c, const std::string& name) {
    const auto [lo, hi] = range(c);
    return config_table_internal::RangeCheck(
        name, static_cast<int64_t>(config_table_internal::Get(c, field)), lo, hi);
  };
  return s;
}

/// An integer within the constant [lo, hi].
template <typename Config, typename Field>
Setting<Config> IntSetting(std::string flag, std::string env, std::string help, Field field,
                           int64_t lo, int64_t hi, std::string value_name = "N") {
  return IntSetting<Config>(
      std::move(flag), std::move(env), std::move(help), field,
      [lo, hi](const Config&) { return std::pair<int64_t, int64_t>(lo, hi); },
      std::move(value_name));
}

/// A boolean flag: `--flag` alone is true, else ParseBool's words.
template <typename Config, typename Field>
Setting<Config> BoolSetting(std::string flag, std::string env, std::string help, Field field) {
  Setting<Config> s =
      config_table_internal::Named<Config>(std::move(flag), std::move(env), std::move(help), "");
  s.set = [field](const std::string& value, Config* c) {
    return ParseBool(value, &config_table_internal::Get(*c, field));
  };
  s.show = [field](const Config& c) {
    return std::string(config_table_internal::Get(c, field) ? "true" : "false");
  };
  return s;
}

/// One of a few words, each standing for a value of the field: "expected
/// auto or none" otherwise.
template <typename Config, typename Field, typename T>
Setting<Config> ChoiceSetting(std::string flag, std::string env, std::string help, Field field,
                              std::vector<std::pair<std::string, T>> choices) {
  Setting<Config> s =
      config_table_internal::Named<Config>(std::move(flag), std::move(env), std::move(help), "V");
  std::string words;
  for (size_t i = 0; i < choices.size(); ++i) {
    if (i > 0) words += i + 1 == choices.size() ? " or " : ", ";
    words += choices[i].first;
  }
  s.value_name.clear();
  for (const auto& [word, value] : choices) {
    absl::StrAppend(&s.value_name, s.value_name.empty() ? "" : "|", word);
  }
  s.set = [field, choices, words](const std::string& text, Config* c) {
    for (const auto& [word, value] : choices) {
      if (word == text) {
        config_table_internal::Get(*c, field) = value;
        return absl::OkStatus();
      }
    }
    return absl::InvalidArgumentError(absl::StrCat("expected ", words));
  };
  s.show = [field, choices](const Config& c) {
    for (const auto& [word, value] : choices) {
      if (config_table_internal::Get(c, field) == value) return word;
    }
    return std::string();
  };
  return s;
}

/// A setting that no longer exists and is refused whatever its value, with
/// `why` saying what replaced it.
template <typename Config>
Setting<Config> RetiredSetting(std::string flag, std::string env, std::string why) {
  Setting<Config> s = config_table_internal::Named<Config>(
      std::move(flag), std::move(env), absl::StrCat("retired: ", why), "V");
  s.default_text = "(retired)";
  s.set = [why](const std::string&, Config*) {
    return absl::InvalidArgumentError(absl::StrCat("retired: ", why));
  };
  s.show = [](const Config&) { return std::string(); };
  return s;
}

}  // namespace reshard
