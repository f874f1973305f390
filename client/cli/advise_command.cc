#include "client/cli/advise_command.h"

#include <cmath>
#include <cstdint>
#include <functional>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/time.h"
#include "client/cli/plan_summary.h"
#include "client/cli/server_commands.h"
#include "client/cli/server_format.h"

namespace reshard::cli {
namespace {

absl::Status BadFlag(const std::string& flag, const std::string& value, const char* expected) {
  return absl::InvalidArgumentError(
      absl::StrCat("--", flag, " \"", value, "\": expected ", expected));
}

// Step and move times span microseconds to hours: three significant digits.
std::string FormatStep(double seconds) {
  if (seconds < 1e-3) return absl::StrFormat("%.3g us", seconds * 1e6);
  if (seconds < 1) return absl::StrFormat("%.3g ms", seconds * 1e3);
  return absl::StrFormat("%.3g s", seconds);
}

}  // namespace

const std::vector<std::string>& AdviseValueFlags() {
  static const auto* flags = new std::vector<std::string>{
      "gpus",       "hosts", "horizon",  "layers",   "hidden",          "heads", "kv-heads",
      "ffn-hidden", "vocab", "seq",      "batch",    "max-micro-batch", "gpu",   "gpu-memory",
      "peak-flops", "hbm",   "intra-bw", "inter-bw", "devices-per-host"};
  return *flags;
}

const std::vector<std::string>& AdviseBoolFlags() {
  static const auto* flags = new std::vector<std::string>{"gated-mlp", "distributed-optimizer"};
  return *flags;
}

const char* AdviseFlagsHelp() {
  return "  --gpus N                devices offered in all (required)\n"
         "  --hosts H1,H2,...       take them from these hosts, in order (default: the live\n"
         "                          hosts, the job's own first)\n"
         "  --horizon DURATION      choose the most steps in this time after the move\n"
         "                          (default 1h)\n"
         "model (what the PTC does not say; layers, hidden and vocab default from it):\n"
         "  --heads N --seq N --batch N (global, sequences)   required\n"
         "  --layers N --hidden N --vocab N --kv-heads N --ffn-hidden N --max-micro-batch N\n"
         "  --gated-mlp --distributed-optimizer\n"
         "devices (default: A100 80 GB, 240e9 B/s per GPU in a host, 160e9 B/s per host):\n"
         "  --gpu A100|A100-40GB|H100|NAME  --gpu-memory BYTES --peak-flops FLOPS --hbm B/S\n"
         "  --intra-bw B/S --inter-bw B/S --devices-per-host N\n";
}

absl::StatusOr<v1::AdviseRequest> AdviseRequestFromFlags(
    const absl::flat_hash_map<std::string, std::string>& flags, const std::string& job_id) {
  v1::AdviseRequest r;
  r.set_job_id(job_id);
  v1::AdviseModel& m = *r.mutable_model();
  v1::AdviseDevices& d = *r.mutable_devices();
  const std::vector<std::pair<std::string, std::function<void(int64_t)>>> integers = {
      {"gpus", [&](int64_t v) { r.set_gpus(static_cast<int32_t>(v)); }},
      {"layers", [&](int64_t v) { m.set_layers(static_cast<int32_t>(v)); }},
      {"hidden", [&](int64_t v) { m.set_hidden(v); }},
      {"heads", [&](int64_t v) { m.set_heads(static_cast<int32_t>(v)); }},
      {"kv-heads", [&](int64_t v) { m.set_kv_heads(static_cast<int32_t>(v)); }},
      {"ffn-hidden", [&](int64_t v) { m.set_ffn_hidden(v); }},
      {"vocab", [&](int64_t v) { m.set_vocab(v); }},
      {"seq", [&](int64_t v) { m.set_seq_length(v); }},
      {"batch", [&](int64_t v) { m.set_global_batch(v); }},
      {"max-micro-batch", [&](int64_t v) { m.set_max_micro_batch(static_cast<int32_t>(v)); }},
      {"devices-per-host", [&](int64_t v) { d.set_devices_per_host(static_cast<int32_t>(v)); }},
  };
  for (const auto& [flag, set] : integers) {
    auto it = flags.find(flag);
    if (it == flags.end()) continue;
    int64_t v = 0;
    const int64_t limit = flag == "hidden" || flag == "ffn-hidden" || flag == "vocab" ||
                                  flag == "seq" || flag == "batch"
                              ? INT64_MAX
                              : INT32_MAX;
    if (!absl::SimpleAtoi(it->second, &v) || v <= 0 || v > limit) {
      return BadFlag(flag, it->second, "a positive integer");
    }
    set(v);
  }
  const std::vector<std::pair<std::string, std::function<void(double)>>> reals = {
      {"gpu-memory", [&](double v) { d.set_memory_bytes(v); }},
      {"peak-flops", [&](double v) { d.set_peak_flops(v); }},
      {"hbm", [&](double v) { d.set_hbm_bytes_per_s(v); }},
      {"intra-bw", [&](double v) { d.set_intra_host_bytes_per_s(v); }},
      {"inter-bw", [&](double v) { d.set_inter_host_bytes_per_s(v); }},
  };
  for (const auto& [flag, set] : reals) {
    auto it = flags.find(flag);
    if (it == flags.end()) continue;
    double v = 0;
    if (!absl::SimpleAtod(it->second, &v) || !std::isfinite(v) || v <= 0) {
      return BadFlag(flag, it->second, "a positive number (e.g. 80e9)");
    }
    set(v);
  }
  if (auto it = flags.find("horizon"); it != flags.end()) {
    absl::StatusOr<absl::Duration> h = ParseTimeout(it->second);
    if (!h.ok()) return BadFlag("horizon", it->second, "a duration (1h, 30m, 600s)");
    r.set_horizon_s(absl::ToDoubleSeconds(*h));
  }
  if (auto it = flags.find("hosts"); it != flags.end()) {
    for (absl::string_view h : absl::StrSplit(it->second, ',')) {
      if (h.empty()) return BadFlag("hosts", it->second, "host ids separated by commas");
      r.add_hosts(std::string(h));
    }
  }
  if (auto it = flags.find("gpu"); it != flags.end()) d.set_gpu_type(it->second);
  m.set_gated_mlp(flags.contains("gated-mlp"));
  m.set_distributed_optimizer(flags.contains("distributed-optimizer"));
  return r;
}

std::string FormatAdviceTable(const v1::AdviseResponse& advice) {
  std::vector<std::string> offer;
  for (int i = 0; i < advice.hosts_size(); ++i) {
    offer.push_back(absl::StrCat(advice.hosts(i), " x ",
                                 i < advice.host_devices_size() ? advice.host_devices(i) : 0));
  }
  std::string out = absl::StrCat("offer: ", absl::StrJoin(offer, ", "), " (", advice.gpu_type(),
                                 ")\n", advice.considered(), " layouts considered, ",
                                 advice.feasible(), " fit; Pareto set (fastest first), horizon ",
                                 FormatSeconds(advice.horizon_s()), ":\n\n");
  absl::StrAppend(&out, absl::StrFormat("  %4s %4s %4s %4s %-10s %10s %11s %11s %10s %14s\n", "TP",
                                        "PP", "DP", "MB", "RECOMPUTE", "STEP", "MEMORY/DEV",
                                        "CROSS-HOST", "MOVE", "STEPS/HORIZON"));
  for (int i = 0; i < advice.candidates_size(); ++i) {
    const v1::AdviseCandidate& c = advice.candidates(i);
    const bool priced = c.reconfig_priced();
    absl::StrAppend(&out,
                    absl::StrFormat("%s %4d %4d %4d %4d %-10s %10s %11s %11s %10s %14s\n",
                                    i == advice.best() ? "*" : " ", c.tp(), c.pp(), c.dp(),
                                    c.micro_batch(), c.recompute(), FormatStep(c.step_seconds()),
                                    FormatBytes(static_cast<int64_t>(c.memory_bytes())),
                                    priced ? FormatBytes(c.cross_host_bytes()) : "-",
                                    priced ? FormatStep(c.transfer_seconds()) : "-",
                                    priced ? absl::StrFormat("%.4g", c.steps_in_horizon()) : "-"));
  }
  if (advice.best() >= 0) {
    absl::StrAppend(&out, "\n* best for the horizon: the most steps after its move\n");
  } else {
    absl::StrAppend(&out, "\nno candidate completes a step within the horizon after its move\n");
  }
  for (int i = 0; i < advice.candidates_size(); ++i) {
    const v1::AdviseCandidate& c = advice.candidates(i);
    if (!c.reconfig_priced()) {
      absl::StrAppend(&out, "row ", i + 1, " (tp ", c.tp(), ", pp ", c.pp(), ", dp ", c.dp(),
                      "): not reachable: ", c.reconfig_error(), "\n");
    }
  }
  return out;
}

}  // namespace reshard::cli
