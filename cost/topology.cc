#include "cost/topology.h"

#include <cmath>
#include <functional>
#include <map>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace reshard::cost {
namespace {

// `value` with one of `units` (suffix -> multiplier) as a positive double.
bool ParseWithUnit(absl::string_view value, const std::map<std::string, double>& units,
                   double* out) {
  for (const auto& [suffix, scale] : units) {
    absl::string_view number = value;
    if (!absl::ConsumeSuffix(&number, suffix)) continue;
    double v = 0;
    if (!absl::SimpleAtod(number, &v) || !std::isfinite(v) || v <= 0) return false;
    *out = v * scale;
    return true;
  }
  return false;
}

const std::map<std::string, double>& RateUnits() {
  static const auto* units = new std::map<std::string, double>{
      {"Gb/s", 1e9 / 8}, {"GB/s", 1e9}, {"Mb/s", 1e6 / 8}, {"MB/s", 1e6}};
  return *units;
}

bool ParsePositiveInt(absl::string_view value, int* out) {
  int v = 0;
  if (!absl::SimpleAtoi(value, &v) || v <= 0) return false;
  *out = v;
  return true;
}

}  // namespace

absl::StatusOr<Topology> ParseTopology(const std::string& text) {
  Topology t;
  using Setter = std::function<bool(absl::string_view)>;
  const auto rate = [](double* field) {
    return Setter([field](absl::string_view v) { return ParseWithUnit(v, RateUnits(), field); });
  };
  const auto count = [](int* field) {
    return Setter([field](absl::string_view v) { return ParsePositiveInt(v, field); });
  };
  // key -> (setter, what a value must look like)
  const std::map<std::string, std::pair<Setter, std::string>> keys = {
      {"hosts", {count(&t.hosts), "a positive integer"}},
      {"gpus_per_host", {count(&t.gpus_per_host), "a positive integer"}},
      {"nvlink", {rate(&t.nvlink), "a rate such as 450GB/s"}},
      {"pcie", {rate(&t.pcie), "a rate such as 50GB/s"}},
      {"hbm", {rate(&t.hbm), "a rate such as 1600GB/s"}},
      {"nics_per_host", {count(&t.nics_per_host), "a positive integer"}},
      {"nic", {rate(&t.nic), "a rate such as 400Gb/s"}},
      {"network",
       {Setter([&t](absl::string_view v) {
          if (v == "rail") t.network = Network::kRail;
          if (v == "fat-tree") t.network = Network::kFatTree;
          return v == "rail" || v == "fat-tree";
        }),
        "rail or fat-tree"}},
      {"oversubscription",
       {Setter([&t](absl::string_view v) {
          return absl::SimpleAtod(v, &t.oversubscription) && std::isfinite(t.oversubscription) &&
                 t.oversubscription >= 1;
        }),
        "a number >= 1"}},
      {"hosts_per_leaf", {count(&t.hosts_per_leaf), "a positive integer"}},
      {"agent_cores",
       {Setter([&t](absl::string_view v) {
          return absl::SimpleAtod(v, &t.agent_cores) && std::isfinite(t.agent_cores) &&
                 t.agent_cores > 0;
        }),
        "a positive number"}},
      {"cpu_per_byte",
       {Setter([&t](absl::string_view v) {
          return ParseWithUnit(v, {{"s/GB", 1e-9}, {"s/MB", 1e-6}}, &t.cpu_seconds_per_byte);
        }),
        "CPU-seconds per byte such as 1.4s/GB"}},
      {"cpu_per_local_byte",
       {Setter([&t](absl::string_view v) {
          return ParseWithUnit(v, {{"s/GB", 1e-9}, {"s/MB", 1e-6}}, &t.cpu_seconds_per_local_byte);
        }),
        "CPU-seconds per byte such as 0.25s/GB"}},
      {"host_copy", {rate(&t.host_copy), "a rate such as 20GB/s"}},
      {"hash", {rate(&t.hash), "a rate such as 4GB/s"}},
      {"overhead",
       {Setter([&t](absl::string_view v) {
          absl::string_view n = v;
          return absl::ConsumeSuffix(&n, "s") && absl::SimpleAtod(n, &t.overhead_seconds) &&
                 std::isfinite(t.overhead_seconds) && t.overhead_seconds >= 0;
        }),
        "seconds such as 0.5s"}},
  };
  std::map<std::string, int> seen;  // key -> line
  int line_no = 0;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    ++line_no;
    line = line.substr(0, line.find('#'));
    const std::vector<absl::string_view> words =
        absl::StrSplit(line, absl::ByAnyChar(" \t\r"), absl::SkipEmpty());
    if (words.empty()) continue;
    const std::string key(words[0]);
    auto it = keys.find(key);
    if (it == keys.end()) {
      return absl::InvalidArgumentError(
          absl::StrCat("topology line ", line_no, ": unknown key \"", key, "\""));
    }
    if (words.size() != 2) {
      return absl::InvalidArgumentError(absl::StrCat("topology line ", line_no, ": ", key,
                                                     " takes one value (", it->second.second,
                                                     "), got ", words.size() - 1));
    }
    if (auto [prev, fresh] = seen.emplace(key, line_no); !fresh) {
      return absl::InvalidArgumentError(absl::StrCat(
          "topology line ", line_no, ": ", key, " set again (first on line ", prev->second, ")"));
    }
    if (!it->second.first(words[1])) {
      return absl::InvalidArgumentError(absl::StrCat("topology line ", line_no, ": ", key,
                                                     " must be ", it->second.second, ", not \"",
                                                     words[1], "\""));
    }
  }
  if (seen.count("hosts") == 0) {
    return absl::InvalidArgumentError("topology: hosts is required (the number of hosts)");
  }
  if (t.gpus_per_host % t.nics_per_host != 0 && t.nics_per_host % t.gpus_per_host != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "topology: gpus_per_host ", t.gpus_per_host, " and nics_per_host ", t.nics_per_host,
        " must divide one another (each GPU uses the NIC of its PCIe switch)"));
  }
  return t;
}

std::string Describe(const Topology& t) {
  const std::string net =
      t.network == Network::kRail
          ? std::string("rail-optimised network")
          : absl::StrFormat("fat-tree network, %d hosts per leaf, %g:1 oversubscribed",
                            t.hosts_per_leaf, t.oversubscription);
  return absl::StrFormat(
      "%d hosts x %d GPUs (NVLink %g GB/s, PCIe %g GB/s per GPU each way), %d x %g Gb/s NICs "
      "per host, %s; agents: %g cores, %.2f CPU-s/GB sent or received, %.2f CPU-s/GB copied, "
      "host copies %g GB/s, checks %g GB/s per core, %gs overhead",
      t.hosts, t.gpus_per_host, t.nvlink / 1e9, t.pcie / 1e9, t.nics_per_host, t.nic * 8 / 1e9, net,
      t.agent_cores, t.cpu_seconds_per_byte * 1e9, t.cpu_seconds_per_local_byte * 1e9,
      t.host_copy / 1e9, t.hash / 1e9, t.overhead_seconds);
}

}  // namespace reshard::cost
