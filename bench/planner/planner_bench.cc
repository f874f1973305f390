// planner_bench: how fast and how lean reshard::planner::MakePlan is on
// GPT-3 175B-shaped jobs (1024 GPUs -> 768 and -> 1536) and on GPT-3 XL.
// Single thread. Exits non-zero only when a plan fails or its cross-host bytes
// differ from the lower bound; time and memory targets are printed, not
// enforced.
#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "bench/planner/gpt_model.h"
#include "bench/planner/heap_counter.h"
#include "client/cli/plan_summary.h"
#include "planner/planner.h"

namespace reshard::bench {
namespace {

constexpr double kTargetMs = 200;
constexpr int64_t kTargetBytes = int64_t{1} << 30;

struct Case {
  std::string name;
  const v1::Ptc* ptc;
  v1::Layout from;
  v1::Layout to;
  bool has_target;  // the 175B targets apply
  int reps;
};

struct Result {
  std::string error;  // empty when every run planned
  std::vector<double> ms;
  int64_t peak_heap = 0;  // max over runs
  int64_t plan_bytes = 0;
  int64_t steps = 0, cross_steps = 0, dsts = 0, fills = 0;
  int64_t local = 0, cross = 0, lower = 0;

  double Median() const {
    std::vector<double> v = ms;
    std::sort(v.begin(), v.end());
    return v.size() % 2 ? v[v.size() / 2] : (v[v.size() / 2 - 1] + v[v.size() / 2]) / 2;
  }
  double Min() const { return *std::min_element(ms.begin(), ms.end()); }
};

int64_t World(const v1::Layout& l) {
  return int64_t{l.config().tp()} * l.config().pp() * l.config().dp();
}

Result RunCase(const Case& c) {
  Result r;
  for (int i = 0; i < c.reps; ++i) {
    ResetHeapPeak();
    const int64_t base = HeapInUse();
    const auto start = std::chrono::steady_clock::now();
    absl::StatusOr<planner::Plan> plan = planner::MakePlan(*c.ptc, c.from, c.to, {});
    const auto end = std::chrono::steady_clock::now();
    r.peak_heap = std::max(r.peak_heap, HeapPeak() - base);
    if (!plan.ok()) {
      r.error = std::string(plan.status().ToString());
      return r;
    }
    r.ms.push_back(std::chrono::duration<double, std::milli>(end - start).count());
    if (i == 0) {
      r.steps = static_cast<int64_t>(plan->steps.size());
      r.dsts = static_cast<int64_t>(plan->dsts.size());
      r.fills = static_cast<int64_t>(plan->fills.size());
      r.plan_bytes = r.steps * static_cast<int64_t>(sizeof(planner::Plan::Step)) +
                     r.dsts * static_cast<int64_t>(sizeof(planner::Plan::Dst)) +
                     r.fills * static_cast<int64_t>(sizeof(planner::Plan::Fill));
      r.cross_steps = plan->cross_host_steps;
      r.local = plan->bytes_local;
      r.cross = plan->bytes_cross_host;
      r.lower = plan->lower_bound_cross_host;
    }
  }
  return r;
}

std::string Verdict(const Case& c, const Result& r) {
  if (!c.has_target) return "-";
  std::vector<std::string> missed;
  if (r.Median() > kTargetMs) missed.push_back("time");
  if (r.peak_heap > kTargetBytes) missed.push_back("memory");
  if (missed.empty()) return "PASS";
  return absl::StrCat("MISS (", absl::StrJoin(missed, ", "), ")");
}

int Main(int argc, char** argv) {
  bool quick = false;
  int reps_override = 0;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--quick") == 0) {
      quick = true;
    } else if (std::strncmp(argv[i], "--reps=", 7) == 0 && std::atoi(argv[i] + 7) > 0) {
      reps_override = std::atoi(argv[i] + 7);
    } else {
      std::fprintf(argv[i] == std::string("--help") ? stdout : stderr,
                   "usage: planner_bench [--quick] [--reps=N]\n"
                   "  --quick   one run per 175B case (CI smoke)\n"
                   "  --reps=N  runs per case (default 7 for 175B, 30 for GPT-3 XL)\n");
      return argv[i] == std::string("--help") ? 0 : 2;
    }
  }
  const int big_reps = reps_override ? reps_override : quick ? 1 : 7;
  const int small_reps = reps_override ? reps_override : quick ? 3 : 30;

  const v1::Ptc gpt175b = BuildGptPtc(kGpt3_175b, 8);
  const v1::Ptc gpt_xl = BuildGptPtc(kGpt3Xl, 2);
  const v1::Layout from175 = MakeLayout(8, 16, 8, "host-", 0, 8);
  const std::vector<Case> cases = {
      {"gpt3-175b dp 8->6, 96 of 128 hosts", &gpt175b, from175, MakeLayout(8, 16, 6, "host-", 0, 8),
       true, big_reps},
      {"gpt3-175b dp 8->12, +64 new hosts", &gpt175b, from175, MakeLayout(8, 16, 12, "host-", 0, 8),
       true, big_reps},
      {"gpt3-xl dp 4->2, 2 hosts->1", &gpt_xl, MakeLayout(2, 2, 4, "host-", 0, 8),
       MakeLayout(2, 2, 2, "host-", 0, 8), false, small_reps},
  };

  std::printf(
      "planner_bench: reshard::planner::MakePlan, single thread; %d run(s) per 175B case,"
      " %d per GPT-3 XL case.\n",
      big_reps, small_reps);
  std::printf(
      "GPT-3 175B: %d tensors (fp16 weights; fp32 master + 2 Adam moments, DP_FLAT),"
      " vocab padded to %lld.\n",
      gpt175b.tensors_size(), static_cast<long long>(PaddedVocab(kGpt3_175b.vocab, 8)));
  std::printf(
      "peak heap = highest C++ heap in use during MakePlan above the level before it\n"
      "(counted exactly by a replaced operator new/delete, malloc_usable_size), the\n"
      "returned Plan included; plan size = steps*sizeof(Step) + dsts*sizeof(Dst) +"
      " fills*sizeof(Fill).\n"
      "targets (175B cases): median plan time <= %.0f ms, peak heap <= 1 GiB.\n\n",
      kTargetMs);

  std::vector<Result> results;
  for (const Case& c : cases) {
    std::fprintf(stderr, "planning %s ...\n", c.name.c_str());
    results.push_back(RunCase(c));
  }

  int failures = 0;
  std::printf("%-36s %-13s %9s %11s %10s %10s %11s %8s\n", "case", "ranks", "steps", "cross steps",
              "local", "cross-host", "lower bound", "cross/lb");
  for (size_t i = 0; i < cases.size(); ++i) {
    const Case& c = cases[i];
    const Result& r = results[i];
    const std::string ranks = absl::StrCat(World(c.from), " -> ", World(c.to));
    if (!r.error.empty()) {
      std::printf("%-36s %-13s FAILED: %s\n", c.name.c_str(), ranks.c_str(), r.error.c_str());
      ++failures;
      continue;
    }
    std::printf("%-36s %-13s %9lld %11lld %10s %10s %11s %8s\n", c.name.c_str(), ranks.c_str(),
                static_cast<long long>(r.steps), static_cast<long long>(r.cross_steps),
                cli::FormatBytes(r.local).c_str(), cli::FormatBytes(r.cross).c_str(),
                cli::FormatBytes(r.lower).c_str(), cli::FormatRatio(r.cross, r.lower).c_str());
  }
  std::printf("\n%-36s %11s %11s %10s %10s %s\n", "case", "median", "min", "peak heap", "plan size",
              "vs target");
  for (size_t i = 0; i < cases.size(); ++i) {
    const Case& c = cases[i];
    const Result& r = results[i];
    if (!r.error.empty()) continue;
    std::printf("%-36s %8.1f ms %8.1f ms %10s %10s %s\n", c.name.c_str(), r.Median(), r.Min(),
                cli::FormatBytes(r.peak_heap).c_str(), cli::FormatBytes(r.plan_bytes).c_str(),
                Verdict(c, r).c_str());
  }
  for (size_t i = 0; i < cases.size(); ++i) {
    const Result& r = results[i];
    if (r.error.empty() && r.cross != r.lower) {
      std::printf("FAIL: %s: bytes_cross_host %lld != lower bound %lld\n", cases[i].name.c_str(),
                  static_cast<long long>(r.cross), static_cast<long long>(r.lower));
      ++failures;
    }
  }
  rusage usage;
  getrusage(RUSAGE_SELF, &usage);
  std::printf("\nprocess max RSS (getrusage, whole run): %s\n",
              cli::FormatBytes(int64_t{usage.ru_maxrss} * 1024).c_str());
  return failures == 0 ? 0 : 1;
}

}  // namespace
}  // namespace reshard::bench

int main(int argc, char** argv) { return reshard::bench::Main(argc, argv); }
