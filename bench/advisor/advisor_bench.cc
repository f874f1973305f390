// advisor_bench: how long Advise() takes to answer for 8, 64, 256 and 1,024
// A100s (8 per host), single thread; first without a current layout (the
// search alone), then with the job's PTC and current layout so that the
// planner prices the move to each Pareto point (max_reconfig_plans of them).
// Prints figures; the target (< 1 s each) is reported, never enforced. Exits
// non-zero only when Advise() fails or finds nothing for a case that fits.
//
//   advisor_bench            5 runs per case
//   advisor_bench --quick    1 run per case (the CTest smoke run)
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "advisor/advisor.h"
#include "bench/planner/gpt_model.h"

namespace reshard::advisor {
namespace {

struct Case {
  const char* name;
  int hosts;
  int layers, hidden, heads;
  int64_t batch;
  // The job's current layout: tp x pp x dp on the first hosts.
  int cur_tp, cur_pp, cur_dp;
};

constexpr Case kCases[] = {
    {"GPT 6.7B, 8 GPUs", 1, 32, 4096, 32, 256, 2, 1, 4},
    {"GPT 39B, 64 GPUs", 8, 48, 8192, 64, 1536, 8, 2, 2},
    {"GPT-3 175B, 256 GPUs", 32, 96, 12288, 96, 1536, 8, 8, 2},
    {"GPT-3 175B, 1024 GPUs", 128, 96, 12288, 96, 1536, 8, 16, 4},
};

// Median wall and CPU seconds (this process; Advise() is single-threaded, so
// CPU time is what one core spends even when the machine is shared).
struct Seconds {
  double wall = -1, cpu = -1;
};

Seconds Median(int runs, const AdviceRequest& r, Advice* out) {
  std::vector<double> s, cpu;
  for (int i = 0; i < runs; ++i) {
    const std::clock_t cpu_start = std::clock();
    const auto start = std::chrono::steady_clock::now();
    absl::StatusOr<Advice> a = Advise(r);
    const auto end = std::chrono::steady_clock::now();
    cpu.push_back(static_cast<double>(std::clock() - cpu_start) / CLOCKS_PER_SEC);
    if (!a.ok()) {
      std::fprintf(stderr, "Advise failed: %s\n", std::string(a.status().message()).c_str());
      return {};
    }
    *out = *std::move(a);
    s.push_back(std::chrono::duration<double>(end - start).count());
  }
  std::sort(s.begin(), s.end());
  std::sort(cpu.begin(), cpu.end());
  return {s[s.size() / 2], cpu[cpu.size() / 2]};
}

int Run(int runs) {
  std::printf("%-24s %5s %10s %8s %6s %19s %6s %19s %5s %6s\n", "case", "GPUs", "considered",
              "feasible", "pareto", "search wall/cpu ms", "target", "priced wall/cpu ms", "plans",
              "target");
  bool failed = false;
  for (const Case& c : kCases) {
    AdviceRequest r;
    r.model.layers = c.layers;
    r.model.hidden = c.hidden;
    r.model.heads = c.heads;
    r.model.vocab = 51200;
    r.model.seq_length = 2048;
    r.training.global_batch = c.batch;
    r.training.distributed_optimizer = true;
    for (int h = 0; h < c.hosts; ++h)
      r.cluster.hosts.push_back({absl::StrCat("h", h), 8, {"A100"}});
    r.cluster.intra_host_bytes_per_s = 240e9;
    r.cluster.inter_host_bytes_per_s = 160e9;

    Advice search;
    const Seconds t_search = Median(runs, r, &search);

    const v1::Ptc ptc = bench::BuildGptPtc({c.layers, c.hidden, 2048, 51200}, c.cur_tp);
    const v1::Layout current = bench::MakeLayout(c.cur_tp, c.cur_pp, c.cur_dp, "h", 0, 8);
    r.current = {&ptc, &current};
    Advice priced;
    const Seconds t_priced = Median(runs, r, &priced);
    int plans = 0;
    for (const Candidate& k : priced.pareto) plans += k.reconfig.computed ? 1 : 0;

    if (t_search.wall < 0 || t_priced.wall < 0 || search.pareto.empty()) failed = true;
    std::printf("%-24s %5d %10lld %8lld %6zu %10.1f/%-8.1f %6s %10.1f/%-8.1f %5d %6s\n", c.name,
                c.hosts * 8, static_cast<long long>(search.considered),
                static_cast<long long>(search.feasible), search.pareto.size(), t_search.wall * 1e3,
                t_search.cpu * 1e3, t_search.cpu < 1 ? "PASS" : "MISS", t_priced.wall * 1e3,
                t_priced.cpu * 1e3, plans, t_priced.cpu < 1 ? "PASS" : "MISS");
    if (!priced.pareto.empty()) {
      const Candidate& best = priced.pareto.front();
      std::printf(
          "  fastest: tp %d pp %d dp %d b %d %s: %.2f s/step, %.1f GiB, %.0f TFLOP/s/GPU;"
          " move %.2f GiB across hosts (%s busiest), %.2f s\n",
          best.choice.tp, best.choice.pp, best.choice.dp, best.choice.micro_batch,
          RecomputeName(best.choice.recompute), best.time.total, best.memory.total / (1 << 30),
          best.tflops_per_gpu, best.reconfig.cross_host_bytes / double(1 << 30),
          best.reconfig.busiest_host.c_str(), best.reconfig.transfer_seconds);
    }
  }
  return failed ? 1 : 0;
}

}  // namespace
}  // namespace reshard::advisor

int main(int argc, char** argv) {
  int runs = 5;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--quick") == 0) {
      runs = 1;
    } else {
      std::fprintf(stderr, "usage: %s [--quick]\n", argv[0]);
      return 2;
    }
  }
  return reshard::advisor::Run(runs);
}
