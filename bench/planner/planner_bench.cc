// planner_bench: how fast and how lean reshard::planner::MakePlan and
// ToProto (the TransferPlan message) are on GPT-3 175B-shaped jobs (1024 GPUs
// -> 768 and -> 1536), a 70B GPT at 1024 GPUs (dp changes, and tp 8 -> 4),
// the same 70B as an HSDP job going tp 8 -> 4 at 1280 GPUs, and GPT-3 XL; and
// how well rule 5 balances the busiest sending host, before (the previous
// online policy) and after (planner/balance.h), over the property-test
// population and a 70B dp 4 -> 5 grow. Single thread. Exits non-zero when a plan fails, its
// cross-host bytes differ from the lower bound, or the balance misses 1.05x;
// time and memory targets are printed, not enforced.
#include <sys/resource.h>
#include <time.h>

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
#include "bench/planner/balance_report.h"
#include "bench/planner/gpt_model.h"
#include "bench/planner/heap_counter.h"
#include "bench/planner/plan_fingerprint.h"
#include "bench/planner/random_jobs.h"
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
  // CPU time of this thread (one core) for MakePlan, ToProto by value (heap)
  // and ToProto on an arena; wall time of MakePlan + ToProto by value.
  std::vector<double> plan_ms, heap_ms, arena_ms, wall_ms;
  // Highest heap above the level before MakePlan, with each message.
  int64_t peak_heap = 0, peak_arena = 0;  // max over runs
  int64_t plan_bytes = 0;
  // The TransferPlan of the first run: serialized, and on its arena.
  int64_t message_bytes = 0, arena_bytes = 0;
  // steps, dsts, fills: the Plan's (replica 0's when its replicas repeat);
  // total_steps: the whole plan's.
  int64_t steps = 0, cross_steps = 0, dsts = 0, fills = 0, total_steps = 0;
  int replicas = 1;
  int64_t local = 0, cross = 0, lower = 0;
  uint64_t fingerprint = 0;  // PlanFingerprint of the first run

  static double Median(std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v.size() % 2 ? v[v.size() / 2] : (v[v.size() / 2 - 1] + v[v.size() / 2]) / 2;
  }
  static std::vector<double> Sum(const std::vector<double>& a, const std::vector<double>& b) {
    std::vector<double> v(a.size());
    for (size_t i = 0; i < a.size(); ++i) v[i] = a[i] + b[i];
    return v;
  }
  double HeapTotal() const { return Median(Sum(plan_ms, heap_ms)); }
  double ArenaTotal() const { return Median(Sum(plan_ms, arena_ms)); }
  // The run with the least MakePlan + arena: the one other processes on a
  // shared machine disturbed least.
  size_t BestArenaRun() const {
    const std::vector<double> total = Sum(plan_ms, arena_ms);
    return static_cast<size_t>(std::min_element(total.begin(), total.end()) - total.begin());
  }
};

double ThreadCpuMs() {
  timespec t;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return t.tv_sec * 1e3 + t.tv_nsec / 1e6;
}

int64_t World(const v1::Layout& l) {
  return int64_t{l.config().tp()} * l.config().pp() * l.config().dp();
}

Result RunCase(const Case& c) {
  Result r;
  for (int i = 0; i < c.reps; ++i) {
    ResetHeapPeak();
    const int64_t base = HeapInUse();
    const auto start = std::chrono::steady_clock::now();
    const double cpu_start = ThreadCpuMs();
    absl::StatusOr<planner::Plan> plan = planner::MakePlan(*c.ptc, c.from, c.to, {});
    const double cpu_planned = ThreadCpuMs();
    if (!plan.ok()) {
      r.error = std::string(plan.status().ToString());
      return r;
    }
    const int want_steps = static_cast<int>(plan->steps.size());
    {
      const v1::TransferPlan proto = planner::ToProto(*plan, c.from, c.to);
      r.heap_ms.push_back(ThreadCpuMs() - cpu_planned);
      r.wall_ms.push_back(
          std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start)
              .count());
      r.peak_heap = std::max(r.peak_heap, HeapPeak() - base);
      if (proto.steps_size() != want_steps) r.error = "ToProto lost steps";
    }
    ResetHeapPeak();
    {
      google::protobuf::ArenaOptions options;
      options.start_block_size = 64 << 10;
      options.max_block_size = 4 << 20;
      google::protobuf::Arena arena(options);
      const double arena_start = ThreadCpuMs();
      const v1::TransferPlan* proto = planner::ToProto(*plan, c.from, c.to, &arena);
      r.arena_ms.push_back(ThreadCpuMs() - arena_start);
      r.peak_arena = std::max(r.peak_arena, HeapPeak() - base);
      if (proto->steps_size() != want_steps) r.error = "ToProto on an arena lost steps";
      if (i == 0) {  // after the timing
        r.message_bytes = static_cast<int64_t>(proto->ByteSizeLong());
        r.arena_bytes = static_cast<int64_t>(arena.SpaceUsed());
      }
    }
    if (!r.error.empty()) return r;
    r.plan_ms.push_back(cpu_planned - cpu_start);
    if (i == 0) {
      r.steps = static_cast<int64_t>(plan->steps.size());
      r.total_steps = plan->TotalSteps();
      r.replicas = plan->replicas.count;
      r.dsts = static_cast<int64_t>(plan->dsts.size());
      r.fills = static_cast<int64_t>(plan->fills.size());
      r.plan_bytes = r.steps * static_cast<int64_t>(sizeof(planner::Plan::Step)) +
                     r.dsts * static_cast<int64_t>(sizeof(planner::Plan::Dst)) +
                     r.fills * static_cast<int64_t>(sizeof(planner::Plan::Fill)) +
                     static_cast<int64_t>(plan->strides.size() * sizeof(planner::Plan::Strides)) +
                     static_cast<int64_t>(plan->shapes.size() * sizeof(planner::Plan::Shape));
      r.cross_steps = plan->cross_host_steps;
      r.local = plan->bytes_local;
      r.cross = plan->bytes_cross_host;
      r.lower = plan->lower_bound_cross_host;
      r.fingerprint = PlanFingerprint(*plan);
    }
  }
  return r;
}

std::string Verdict(const Case& c, double ms, int64_t peak) {
  if (!c.has_target) return "-";
  std::vector<std::string> missed;
  if (ms > kTargetMs) missed.push_back("time");
  if (peak > kTargetBytes) missed.push_back("memory");
  if (missed.empty()) return "PASS";
  return absl::StrCat("MISS (", absl::StrJoin(missed, ", "), ")");
}

int Main(int argc, char** argv) {
  bool quick = false, balance_only = false;
  std::string only;  // run the timing cases whose name contains this
  int reps_override = 0;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--quick") == 0) {
      quick = true;
    } else if (std::strcmp(argv[i], "--balance-only") == 0) {
      balance_only = true;
    } else if (std::strncmp(argv[i], "--case=", 7) == 0) {
      only = argv[i] + 7;
    } else if (std::strncmp(argv[i], "--reps=", 7) == 0 && std::atoi(argv[i] + 7) > 0) {
      reps_override = std::atoi(argv[i] + 7);
    } else {
      std::fprintf(argv[i] == std::string("--help") ? stdout : stderr,
                   "usage: planner_bench [--quick] [--balance-only] [--reps=N]\n"
                   "  --quick   one run per 175B case, no tp 8->4 case (CI smoke)\n"
                   "  --balance-only  rule 5's balance report alone\n"
                   "  --case=TEXT     time only the cases whose name contains TEXT, no balance\n"
                   "  --reps=N  runs per case (default 7 for 175B, 30 for GPT-3 XL)\n");
      return argv[i] == std::string("--help") ? 0 : 2;
    }
  }
  const int big_reps = reps_override ? reps_override : quick ? 1 : 7;
  const int small_reps = reps_override ? reps_override : quick ? 3 : 30;

  const v1::Ptc gpt175b = BuildGptPtc(kGpt3_175b, 8);
  const v1::Ptc gpt_xl = BuildGptPtc(kGpt3Xl, 2);
  const v1::Ptc gpt70b = BuildGptPtc(kGpt70b, 8);
  const v1::Ptc fsdp70b = BuildFsdpGptPtc(kGpt70b, 8);
  const v1::Layout from175 = MakeLayout(8, 16, 8, "host-", 0, 8);
  const v1::Layout from70 = MakeLayout(8, 8, 16, "host-", 0, 8);
  std::vector<Case> cases = {
      {"gpt3-175b dp 8->6, 96 of 128 hosts", &gpt175b, from175, MakeLayout(8, 16, 6, "host-", 0, 8),
       true, big_reps},
      {"gpt3-175b dp 8->12, +64 new hosts", &gpt175b, from175, MakeLayout(8, 16, 12, "host-", 0, 8),
       true, big_reps},
      {"70b dp 16->12, 96 of 128 hosts", &gpt70b, from70, MakeLayout(8, 8, 12, "host-", 0, 8), true,
       big_reps},
      {"70b dp 16->20, +32 new hosts", &gpt70b, from70, MakeLayout(8, 8, 20, "host-", 0, 8), true,
       big_reps},
      {"70b tp 8->4, 1024 GPUs", &gpt70b, MakeLayout(8, 1, 128, "host-", 0, 8),
       MakeLayout(4, 1, 256, "host-", 0, 8), true, big_reps},
      {"70b hsdp tp 8->4 ds 5->10, 1280", &fsdp70b,
       WithDpShard(MakeLayout(8, 1, 160, "host-", 0, 8), 5),
       WithDpShard(MakeLayout(4, 1, 320, "host-", 0, 8), 10), true, big_reps},
      {"gpt3-xl dp 4->2, 2 hosts->1", &gpt_xl, MakeLayout(2, 2, 4, "host-", 0, 8),
       MakeLayout(2, 2, 2, "host-", 0, 8), false, small_reps},
  };

  // The tp 8 -> 4 cases hold 2-3 GiB at their peak: the full run reports
  // them, the CI smoke (--quick, beside other suites) leaves them out.
  if (quick && only.empty()) {
    cases.erase(
        std::remove_if(cases.begin(), cases.end(),
                       [](const Case& c) { return c.name.find("tp 8->4") != std::string::npos; }),
        cases.end());
  }
  if (!only.empty()) {
    cases.erase(
        std::remove_if(cases.begin(), cases.end(),
                       [&](const Case& c) { return c.name.find(only) == std::string::npos; }),
        cases.end());
  }
  std::printf(
      "planner_bench: reshard::planner::MakePlan + ToProto, single thread; %d run(s) per"
      " 175B/70B case, %d per GPT-3 XL case.\n",
      big_reps, small_reps);
  std::printf(
      "GPT-3 175B: %d tensors (fp16 weights; fp32 master + 2 Adam moments, DP_FLAT),"
      " vocab padded to %lld.\n",
      gpt175b.tensors_size(), static_cast<long long>(PaddedVocab(kGpt3_175b.vocab, 8)));
  std::printf(
      "70B hsdp: %d tensors (bf16 weights; fp32 master + 2 Adam moments, all DP_CHUNK on\n"
      "axis 0), 32 replicas of 40 GPUs: tp 8 dp 160 dp_shard 5 -> tp 4 dp 320 dp_shard 10.\n",
      fsdp70b.tensors_size());
  std::printf(
      "heap counted exactly by a replaced operator new/delete (malloc_usable_size), the\n"
      "returned Plan and TransferPlan included; plan size = steps*sizeof(Step) +\n"
      "dsts*sizeof(Dst) + fills*sizeof(Fill) + the distinct strides and shapes;\n"
      "steps = the whole plan's; replicas > 1: the replicas plan alone and the Plan\n"
      "and TransferPlan hold replica 0's steps (docs/partitioning.md).\n"
      "targets (175B and 70B cases): median CPU time of MakePlan + building the\n"
      "TransferPlan <= %.0f ms, peak heap <= 1 GiB.\n\n",
      kTargetMs);

  std::vector<Result> results;
  for (const Case& c : cases) {
    if (balance_only) break;
    std::fprintf(stderr, "planning %s ...\n", c.name.c_str());
    results.push_back(RunCase(c));
  }

  int failures = 0;
  std::printf("%-36s %-13s %9s %11s %10s %10s %11s %8s %8s %10s %16s\n", "case", "ranks", "steps",
              "cross steps", "local", "cross-host", "lower bound", "cross/lb", "replicas",
              "plan size", "fingerprint");
  for (size_t i = 0; i < results.size(); ++i) {
    const Case& c = cases[i];
    const Result& r = results[i];
    const std::string ranks = absl::StrCat(World(c.from), " -> ", World(c.to));
    if (!r.error.empty()) {
      std::printf("%-36s %-13s FAILED: %s\n", c.name.c_str(), ranks.c_str(), r.error.c_str());
      ++failures;
      continue;
    }
    std::printf(
        "%-36s %-13s %9lld %11lld %10s %10s %11s %8s %8d %10s %016llx\n", c.name.c_str(),
        ranks.c_str(), static_cast<long long>(r.total_steps), static_cast<long long>(r.cross_steps),
        cli::FormatBytes(r.local).c_str(), cli::FormatBytes(r.cross).c_str(),
        cli::FormatBytes(r.lower).c_str(), cli::FormatRatio(r.cross, r.lower).c_str(), r.replicas,
        cli::FormatBytes(r.plan_bytes).c_str(), static_cast<unsigned long long>(r.fingerprint));
  }
  std::printf("\n%-34s %9s %9s %9s %9s %9s %9s %9s %9s %-9s %-9s\n", "case", "MakePlan", "ToProto",
              "arena", "total", "+arena", "wall", "peak", "+arena", "vs target", "+arena");
  for (size_t i = 0; i < results.size(); ++i) {
    const Case& c = cases[i];
    const Result& r = results[i];
    if (!r.error.empty()) continue;
    std::printf("%-34s %6.1f ms %6.1f ms %6.1f ms %6.1f ms %6.1f ms %6.0f ms %9s %9s %-9s %-9s\n",
                c.name.c_str(), Result::Median(r.plan_ms), Result::Median(r.heap_ms),
                Result::Median(r.arena_ms), r.HeapTotal(), r.ArenaTotal(),
                Result::Median(r.wall_ms), cli::FormatBytes(r.peak_heap).c_str(),
                cli::FormatBytes(r.peak_arena).c_str(),
                Verdict(c, r.HeapTotal(), r.peak_heap).c_str(),
                Verdict(c, r.ArenaTotal(), r.peak_arena).c_str());
  }
  std::printf(
      "(medians over the runs. MakePlan, ToProto (by value, on the heap) and arena\n"
      " (ToProto(plan, from, to, arena)) are CPU time of the planning thread, one core;\n"
      " total = MakePlan + ToProto, +arena = MakePlan + arena; wall = elapsed MakePlan +\n"
      " ToProto, longer on a shared machine; peak = highest heap above the level before\n"
      " MakePlan with the heap message, +arena with the arena's.)\n");

  // What the TransferPlan costs per step: most of ToProto's time and of the
  // peak on the larger plans.
  std::printf("\n%-34s %9s %12s %11s %11s %9s\n", "TransferPlan", "steps", "destinations",
              "serialized", "on arena", "per step");
  for (size_t i = 0; i < results.size(); ++i) {
    const Result& r = results[i];
    if (!r.error.empty() || r.steps == 0) continue;
    std::printf("%-34s %9lld %12lld %11s %11s %7lld B\n", cases[i].name.c_str(),
                static_cast<long long>(r.steps), static_cast<long long>(r.dsts),
                cli::FormatBytes(r.message_bytes).c_str(), cli::FormatBytes(r.arena_bytes).c_str(),
                static_cast<long long>(r.arena_bytes / r.steps));
  }

  // Issue 13's target, on the least disturbed run: medians on a shared
  // machine measure the neighbours as much as the planner.
  std::printf("\n%-34s %9s %9s %9s %9s  %s\n", "target: best of the runs", "MakePlan", "arena",
              "total", "peak", "MakePlan + arena <= 200 ms, peak <= 1 GiB");
  for (size_t i = 0; i < results.size(); ++i) {
    const Case& c = cases[i];
    const Result& r = results[i];
    if (!r.error.empty() || !c.has_target) continue;
    const size_t best = r.BestArenaRun();
    const double total = r.plan_ms[best] + r.arena_ms[best];
    std::string verdict = total <= kTargetMs
                              ? absl::StrFormat("met, %.0f ms to spare", kTargetMs - total)
                              : absl::StrFormat("MISSED by %.0f ms", total - kTargetMs);
    if (r.peak_arena > kTargetBytes) absl::StrAppend(&verdict, "; memory MISSED");
    std::printf("%-34s %6.1f ms %6.1f ms %6.1f ms %9s  %s\n", c.name.c_str(), r.plan_ms[best],
                r.arena_ms[best], total, cli::FormatBytes(r.peak_arena).c_str(), verdict.c_str());
  }
  std::printf("(CPU ms of the run with the least MakePlan + arena, out of %d; peak as +arena.)\n",
              big_reps);
  for (size_t i = 0; i < results.size(); ++i) {
    const Result& r = results[i];
    if (r.error.empty() && r.cross != r.lower) {
      std::printf("FAIL: %s: bytes_cross_host %lld != lower bound %lld\n", cases[i].name.c_str(),
                  static_cast<long long>(r.cross), static_cast<long long>(r.lower));
      ++failures;
    }
  }

  // The 70B dp 4 -> 5 grow (tp 8, one stage: 4 -> 5 hosts), where the
  // previous policy measured 1.21x; then the same with 4 stages, and with
  // the optimizer replicated over dp (every send has a choice).
  const v1::Ptc gpt70b_replicated = BuildGptPtc(kGpt70b, 8, /*distributed_optimizer=*/false);
  std::vector<BalanceCase> big = {
      {"70b dp 4->5 grow, tp 8, 32 -> 40", &gpt70b, MakeLayout(8, 1, 4, "host-", 0, 8),
       MakeLayout(8, 1, 5, "host-", 0, 8)},
      {"70b dp 4->5 grow, tp 8 pp 4", &gpt70b, MakeLayout(8, 4, 4, "host-", 0, 8),
       MakeLayout(8, 4, 5, "host-", 0, 8)},
      {"70b dp 4->5, replicated optimizer", &gpt70b_replicated, MakeLayout(8, 4, 4, "host-", 0, 8),
       MakeLayout(8, 4, 5, "host-", 0, 8)},
  };
  for (const Case& c : cases) big.push_back({c.name, c.ptc, c.from, c.to});
  if (only.empty()) failures += ReportBalance(quick ? 60 : 300, big);

  rusage usage;
  getrusage(RUSAGE_SELF, &usage);
  std::printf("\nprocess max RSS (getrusage, whole run): %s\n",
              cli::FormatBytes(int64_t{usage.ru_maxrss} * 1024).c_str());
  return failures == 0 ? 0 : 1;
}

}  // namespace
}  // namespace reshard::bench

int main(int argc, char** argv) { return reshard::bench::Main(argc, argv); }
