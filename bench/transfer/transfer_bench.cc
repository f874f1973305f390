// Transfer benchmarks:
//  (a) agent-to-agent throughput through the whole stack (two shard stores,
//      two UCX transports and two executors over loopback TCP) against
//      ucx_perftest tag_bw on the same transport;
//  (b) LocalCopier against memcpy with the same number of threads;
//  (c) a full reconfiguration of a GPT-style state (~2 GiB; tp2 pp2 dp1 on 2
//      hosts -> tp2 pp1 dp2 on 4 hosts) by four agents at once, against the
//      lower bound: cross-host bytes / the measured pairwise bandwidth;
//  (d) what the operation's transfer secret costs (proofs, step seals: a
//      Poly1305 pass over every cross-host byte at each end): (a) and (c)
//      with and without one, alternating in the same run.
// (a)-(c) run without a transfer secret, as before the seals.
// (a) and (c) run with a spare pool per agent (--spare-mib, default 2048; 128
// with --quick) and without one (cold).
// Any failed run (plan, fill, an agent's Execute, the bare transport) is
// printed to stderr and makes the exit status 1; --cancel cancels every
// agent's Execute, to show that (the CTest transfer_bench_cancel_fails).
// Usage: transfer_bench [--quick] [--size-mib N] [--reps N] [--spare-mib N] [--only a|b|c|d]
//                       [--layers N] [--ucx-tls TLS] [--shm-dir DIR] [--cancel]
//                       [--ucx-worker-address]
// --ucx-worker-address: transports connect by UCX worker address instead of
// through a listener (docs/agent.md, "Known UCX defect").
// Profiling the timed Executes only (issue 22, item 5): with
// RESHARD_PERF_CONTROL="CTL,ACK" (two FIFOs) every timed run writes "enable"
// and "disable" to perf's control FIFO around the Executes, so (the second
// command on one line)
//   mkfifo ctl ack
//   RESHARD_PERF_CONTROL=ctl,ack perf record -g --delay=-1
//       --control fifo:ctl,ack -- transfer_bench --only c
// samples the reconfigurations and none of the setup (fills, spare pools).
#include <stdlib.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <functional>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "agent/transfer/local_copy.h"
#include "bench/transfer/bench_agents.h"
#include "planner/planner.h"
#include "tests/support/job_builders.h"

namespace reshard::agent::bench {
namespace {

using Clock = std::chrono::steady_clock;
using ::reshard::test_support::AddTensor;
using ::reshard::test_support::MakeLayout;
using ::reshard::test_support::SetTpSplit;
using ::reshard::test_support::Tensor;
constexpr double kMiB = 1024.0 * 1024.0;

double Seconds(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

// ---- (a) one tensor migrated from h0 to h1 ----

// One tensor of `bytes` split over `ranks` tp ranks, all on h0 before and all
// on h1 after: every byte crosses once, in `ranks` steps.
void MakeMigration(int64_t bytes, int ranks, v1::Ptc* ptc, v1::Layout* from, v1::Layout* to) {
  ptc->set_num_layers(1);
  SetTpSplit(AddTensor(ptc, "w", {bytes / 4 / 1024, 1024}), 0);
  *from = MakeLayout(ranks, 1, 1, {"h0"}, ranks);
  *to = MakeLayout(ranks, 1, 1, {"h1"}, ranks);
}

// Seconds for both executors to finish the migration (negative on failure,
// printed) and the receiver's times; the agents get a spare pool of `spare`
// bytes (0: none), filled before the timed run starts. `cancel`: every
// Execute is cancelled. `secret`: the task's transfer secret; `cpu`, if set,
// receives the CPU seconds of the run.
double RunMigration(int64_t bytes, int64_t spare, bool cancel, AgentTimes* receiver,
                    const std::string& secret = "", double* cpu = nullptr) {
  v1::Ptc ptc;
  v1::Layout from, to;
  MakeMigration(bytes, 8, &ptc, &from, &to);
  std::vector<Agent> agents = MakeAgents(2, bytes * 2 + spare, spare);
  double secs = -1;
  auto plan = planner::PlanTransfer(ptc, from, to, {});
  if (!plan.ok()) std::fprintf(stderr, "planner: %s\n", plan.status().ToString().c_str());
  if (plan.ok() && FillRanks(&agents, "bench", ptc, from, 1)) {
    if (!WaitForSpares(&agents)) std::fprintf(stderr, "spare pools not filled in a minute\n");
    std::vector<AgentTimes> times;
    secs = RunTask(&agents, MakeTask(agents, "bench", ptc, *plan, secret), &times, cancel, cpu);
    *receiver = times[1];
  }
  DropAgents(&agents);
  return secs;
}

// Returns the number of failed runs.
int BenchStack(bool quick, int64_t only_size, int reps, int64_t spare, bool cancel) {
  std::printf(
      "(a) agent to agent over UCX tcp/lo (8 steps per size). Timed: the whole Execute on both\n"
      "    agents, incl. creating the new buffers and checksums; not timed: making the agents,\n"
      "    the old generation, and filling the spare pools. \"pool\": each agent has a spare\n"
      "    pool of %lld MiB (--spare-bytes), full before the timed run; \"cold\": no pool, every\n"
      "    new page fresh. Both start %.0f s after their setup (freed memory goes back to the\n"
      "    VM's host by then). Best of %d each; phases (seconds) are the receiver's in the pool\n"
      "    run.\n",
      static_cast<long long>(spare >> 20), kSettleSeconds, reps);
  std::printf("%10s %11s %11s %13s %11s %11s %7s %6s %6s %11s\n", "size", "pool MiB/s",
              "cold MiB/s", "perftest MiB/s", "pool ratio", "cold ratio", "create", "move", "seal",
              "move MiB/s");
  std::vector<int64_t> sizes;
  if (only_size > 0) {
    sizes = {only_size};
  } else if (quick) {
    sizes = {int64_t{64} << 20};
  } else {
    sizes = {int64_t{1} << 30, int64_t{2} << 30, int64_t{4} << 30};
  }
  int failures = 0;
  for (int64_t size : sizes) {
    // Best of `reps` runs each, alternating, so that load from elsewhere
    // on the machine does not decide the ratio.
    AgentTimes warm, t;
    if (RunMigration(int64_t{16} << 20, 0, cancel, &warm) < 0) ++failures;  // warm-up
    double pool = -1, cold = -1, theirs = -1;
    std::string why;
    const int64_t message = size / 8;
    for (int rep = 0; rep < reps; ++rep) {
      AgentTimes run;
      const double s = RunMigration(size, spare, cancel, &run);
      if (s < 0) ++failures;
      if (s > 0 && (pool < 0 || s < pool)) {
        pool = s;
        t = run;
      }
      const double c = RunMigration(size, 0, cancel, &run);
      if (c < 0) ++failures;
      if (c > 0 && (cold < 0 || c < cold)) cold = c;
      theirs = std::max(theirs, PerftestMiBps(message, std::max<int64_t>(8, size / message), &why));
    }
    const double ours = pool > 0 ? size / kMiB / pool : -1;
    const double ours_cold = cold > 0 ? size / kMiB / cold : -1;
    char label[32];
    std::snprintf(label, sizeof label, "%lld MiB", static_cast<long long>(size >> 20));
    if (pool < 0 || cold < 0) {
      std::printf("%10s failed (see stderr)\n", label);
    } else if (theirs > 0) {
      std::printf("%10s %11.0f %11.0f %13.0f %10.2fx %10.2fx %7.2f %6.2f %6.2f %11.0f\n", label,
                  ours, ours_cold, theirs, ours / theirs, ours_cold / theirs, t.created,
                  t.moved - t.created, t.sealed - t.moved, size / kMiB / (t.moved - t.created));
    } else {
      std::printf("%10s %11.0f %11.0f %13s   (%s)\n", label, ours, ours_cold, "failed",
                  why.c_str());
    }
    std::fflush(stdout);
  }
  return failures;
}

// ---- (b) local copies ----

double Best(int reps, const std::function<void()>& fn) {
  double best = 1e30;
  for (int i = 0; i < reps; ++i) {
    const auto a = Clock::now();
    fn();
    best = std::min(best, Seconds(a, Clock::now()));
  }
  return best;
}

void BenchLocal(bool quick) {
  const int64_t bytes = quick ? int64_t{64} << 20 : int64_t{512} << 20;
  const int reps = quick ? 3 : 5;
  std::vector<uint8_t> src(bytes * 2, 1), dst(bytes * 2, 0);
  const int64_t cols = 4096;  // 16 KiB rows of float32
  const int64_t rows = bytes / 4 / cols;
  std::printf("\n(b) local copies, %lld MiB per copy (GiB/s; ratio vs memcpy on as many threads)\n",
              static_cast<long long>(bytes >> 20));
  std::printf("%8s %10s %12s %7s %14s %7s %12s\n", "threads", "memcpy", "contiguous", "ratio",
              "strided(8KiB)", "ratio", "fan-out x2");
  for (int threads : {1, 2, 4}) {
    const double mc = Best(reps, [&] {
      std::vector<std::thread> ts;
      for (int t = 0; t < threads; ++t) {
        ts.emplace_back([&, t] {
          const int64_t a = bytes * t / threads, b = bytes * (t + 1) / threads;
          std::memcpy(dst.data() + a, src.data() + a, b - a);
        });
      }
      for (auto& t : ts) t.join();
    });
    LocalCopier copier(threads);
    const std::vector<int64_t> shape = {rows, cols};
    const double contiguous = Best(reps, [&] {
      copier.Copy(StridedView{src.data(), 0, {cols, 1}}, {{dst.data(), 0, {cols, 1}}}, shape, 4);
    });
    // Half of each 2x-wide row: 8 KiB runs.
    const std::vector<int64_t> half = {rows, cols / 2};
    const double strided = Best(
        reps, [&] { copier.Pack(StridedView{src.data(), 0, {cols, 1}}, half, 4, dst.data()); });
    const double fan = Best(reps, [&] {
      copier.Unpack(src.data(), {{dst.data(), 0, {cols, 1}}, {dst.data() + bytes, 0, {cols, 1}}},
                    half, 4);
    });
    const double gib = bytes / (1024.0 * kMiB);
    std::printf("%8d %10.2f %12.2f %6.2fx %14.2f %6.2fx %12.2f\n", threads, gib / mc,
                gib / contiguous, mc / contiguous, gib / 2 / strided, (mc / 2) / strided,
                gib / fan);
    std::fflush(stdout);
  }
}

// ---- (c) a GPT-style reconfiguration across four agents ----

// Megatron-style GPT: bf16 weights (data-parallel replicas) and, per weight,
// fp32 master copy and Adam moments sharded as flat ranges over dp (the
// distributed optimizer). QKV fused (three blocks split separately), MLP
// fc1 split by rows and fc2 by columns, layernorms replicated, embeddings on
// the first stage, the final norm on the last.
v1::Ptc MakeGpt(int layers, int64_t h, int64_t vocab, int64_t seq) {
  v1::Ptc ptc;
  ptc.set_num_layers(layers);
  std::vector<v1::TensorSpec> weights;
  auto weight = [&](const std::string& name, std::vector<int64_t> shape) -> v1::TensorSpec& {
    weights.push_back(Tensor(name, shape, v1::DTYPE_BFLOAT16));
    return weights.back();
  };
  auto stage = [](v1::TensorSpec& t, v1::PipelineMode mode, int layer = 0) {
    t.mutable_partition()->mutable_pipeline()->set_mode(mode);
    if (mode == v1::PIPELINE_LAYER) t.mutable_partition()->mutable_pipeline()->set_layer(layer);
  };
  SetTpSplit(&weight("embed.word", {vocab, h}), 0);
  stage(weights.back(), v1::PIPELINE_FIRST_STAGE);
  stage(weight("embed.pos", {seq, h}), v1::PIPELINE_FIRST_STAGE);
  for (int l = 0; l < layers; ++l) {
    const std::string p = "layers." + std::to_string(l) + ".";
    auto at = [&](v1::TensorSpec& t) { stage(t, v1::PIPELINE_LAYER, l); };
    at(weight(p + "ln1.weight", {h}));
    at(weight(p + "ln1.bias", {h}));
    SetTpSplit(&weight(p + "attn.qkv.weight", {3 * h, h}), 0, {h, h, h});
    at(weights.back());
    SetTpSplit(&weight(p + "attn.qkv.bias", {3 * h}), 0, {h, h, h});
    at(weights.back());
    SetTpSplit(&weight(p + "attn.proj.weight", {h, h}), 1);
    at(weights.back());
    at(weight(p + "attn.proj.bias", {h}));
    at(weight(p + "ln2.weight", {h}));
    at(weight(p + "ln2.bias", {h}));
    SetTpSplit(&weight(p + "mlp.fc1.weight", {4 * h, h}), 0);
    at(weights.back());
    SetTpSplit(&weight(p + "mlp.fc1.bias", {4 * h}), 0);
    at(weights.back());
    SetTpSplit(&weight(p + "mlp.fc2.weight", {h, 4 * h}), 1);
    at(weights.back());
    at(weight(p + "mlp.fc2.bias", {h}));
  }
  stage(weight("final_ln.weight", {h}), v1::PIPELINE_LAST_STAGE);
  stage(weight("final_ln.bias", {h}), v1::PIPELINE_LAST_STAGE);
  for (const v1::TensorSpec& w : weights) *ptc.add_tensors() = w;
  for (const char* kind : {"master", "exp_avg", "exp_avg_sq"}) {
    for (const v1::TensorSpec& w : weights) {
      v1::TensorSpec* t = ptc.add_tensors();
      *t = w;
      t->set_name(std::string("optimizer.") + kind + "." + w.name());
      t->set_dtype(v1::DTYPE_FLOAT32);
      t->mutable_partition()->mutable_dp()->set_mode(v1::DP_FLAT);
    }
  }
  auto* step = ptc.add_blobs();
  step->set_name("step");
  step->set_size_bytes(8);
  auto* rng = ptc.add_blobs();
  rng->set_name("rng");
  rng->set_size_bytes(5056);  // a torch CUDA + CPU generator state
  rng->set_scope(v1::BLOB_PER_RANK);
  return ptc;
}

// One reconfiguration by four fresh agents with spare pools of `spare`
// bytes (filled before the timed run); seconds (negative on failure,
// printed). `cancel`: every Execute is cancelled.
double RunReconfigure(const v1::Ptc& ptc, const v1::Layout& from, const v1::TransferPlan& plan,
                      int64_t spare, bool cancel, std::vector<AgentTimes>* times, double* cpu,
                      const std::string& secret = "") {
  std::vector<Agent> agents = MakeAgents(4, (int64_t{16} << 30) + spare, spare);
  double s = -1;
  if (FillRanks(&agents, "gpt", ptc, from, 1)) {
    if (!WaitForSpares(&agents)) std::fprintf(stderr, "spare pools not filled in a minute\n");
    s = RunTask(&agents, MakeTask(agents, "gpt", ptc, plan, secret), times, cancel, cpu);
  }
  DropAgents(&agents);
  return s;
}

// Returns the number of failed runs.
int BenchReconfigure(bool quick, int reps, int64_t spare, bool cancel, int layers) {
  const v1::Ptc ptc =
      quick ? MakeGpt(2, 128, 1024, 128) : MakeGpt(layers > 0 ? layers : 12, 1024, 8192, 1024);
  const v1::Layout from = MakeLayout(2, 2, 1, {"h0", "h1"}, 2);
  const v1::Layout to = MakeLayout(2, 1, 2, {"h0", "h1", "h2", "h3"}, 1);
  std::printf(
      "\n(c) GPT-style reconfiguration, %d layers, tp2 pp2 dp1 on 2 hosts -> tp2 pp1 dp2 on 4 "
      "hosts, four agents at once, best of %d.\n    Timed: every agent's whole Execute (buffers "
      "made, bytes moved, checksums). \"pool\": each agent\n    has a spare pool of %lld MiB, "
      "full before the timed run; \"cold\": no pool. Both start %.0f s after\n    their setup.\n",
      ptc.num_layers(), reps, static_cast<long long>(spare >> 20), kSettleSeconds);
  auto plan = planner::PlanTransfer(ptc, from, to, {});
  if (!plan.ok()) {
    std::fprintf(stderr, "planner: %s\n", plan.status().ToString().c_str());
    return 1;
  }
  int64_t state = 0;
  for (const auto& bytes : AllRankItemBytes(ptc, from)) {
    for (int64_t b : bytes) state += b;
  }
  const int64_t cross = plan->stats().bytes_cross_host();
  // Best of `reps` reconfigurations (fresh agents each) against the best
  // pairwise bandwidth measured between them in the same run: the bare
  // transport and ucx_perftest, 8 MiB messages.
  const int64_t probe = quick ? int64_t{64} << 20 : int64_t{512} << 20;
  double pool = -1, cold = -1, bare = -1, perftest = -1;
  double pool_cpu = 0, cold_cpu = 0;  // of the best runs
  std::vector<AgentTimes> times, cold_times;
  std::string why;
  int failures = 0;
  for (int rep = 0; rep < reps; ++rep) {
    std::vector<AgentTimes> run;
    double cpu = 0;
    const double s = RunReconfigure(ptc, from, *plan, spare, cancel, &run, &cpu);
    if (s < 0) ++failures;
    if (s > 0 && (pool < 0 || s < pool)) {
      pool = s;
      pool_cpu = cpu;
      times = run;
    }
    const double c = RunReconfigure(ptc, from, *plan, 0, cancel, &run, &cpu);
    if (c < 0) ++failures;
    if (c > 0 && (cold < 0 || c < cold)) {
      cold = c;
      cold_cpu = cpu;
      cold_times = run;
    }
    const double b = BareTransportMiBps(probe, int64_t{8} << 20);
    if (b < 0) {
      std::fprintf(stderr, "bare transport: a transfer failed\n");
      ++failures;
    }
    bare = std::max(bare, b);
    perftest = std::max(perftest, PerftestMiBps(int64_t{8} << 20, probe >> 23, &why));
  }
  const double bw = std::max(bare, perftest);
  std::printf("  state %.0f MiB in %d steps; cross-host %.0f MiB, local %.0f MiB\n", state / kMiB,
              plan->steps_size(), cross / kMiB, plan->stats().bytes_local() / kMiB);
  std::printf("  pairwise bandwidth: bare transport %.0f MiB/s, ucx_perftest %.0f MiB/s%s\n", bare,
              perftest, perftest < 0 ? (" (" + why + ")").c_str() : "");
  if (pool < 0 || cold < 0 || bw <= 0) {
    std::printf("  failed (see stderr)\n");
    return failures > 0 ? failures : 1;
  }
  const double bound = cross / kMiB / bw;
  std::printf("  lower bound %.2f s\n", bound);
  for (auto [name, secs, ts, cpu] : {std::make_tuple("pool", pool, &times, pool_cpu),
                                     std::make_tuple("cold", cold, &cold_times, cold_cpu)}) {
    double created = 0, moved = 0;
    int64_t written = 0;
    for (const AgentTimes& t : *ts) {
      created = std::max(created, t.created);
      moved = std::max(moved, t.moved);
      written += t.written;
    }
    std::printf(
        "  %s: time %.2f s (buffers made by %.2f s, bytes in by %.2f s); ratio %.2fx the lower "
        "bound; CPU %.2f s for %.2f GB written = %.2f CPU-s per GB\n",
        name, secs, created, moved, secs / bound, cpu, written / 1e9,
        written > 0 ? cpu / (written / 1e9) : 0.0);
    for (size_t i = 0; i < ts->size(); ++i) {
      std::printf("    h%zu: buffers made %.2f s, bytes in %.2f s, sealed %.2f s\n", i,
                  (*ts)[i].created, (*ts)[i].moved, (*ts)[i].sealed);
    }
  }
  std::fflush(stdout);
  return failures;
}

// ---- (d) the cost of the transfer secret ----

// Returns the number of failed runs.
int BenchSecret(bool quick, int64_t only_size, int reps, int64_t spare, int layers) {
  const std::string secret(32, 's');
  std::printf(
      "\n(d) the transfer secret's cost: proofs first, then every cross-host chunk MACed "
      "(Poly1305) at both\n    ends and every step sealed (docs/security.md). The same "
      "runs as (a) (pool) and (c) (pool),\n    without and with a secret, alternating (which "
      "first, too); best of %d each; CPU: all agents' CPU seconds of that run.\n",
      reps);
  int failures = 0;
  auto pair = [&](const char* what, double bytes, const std::function<double(bool, double*)>& run) {
    double best[2] = {-1, -1}, cpu[2] = {0, 0};
    for (int rep = 0; rep < reps; ++rep) {
      // Which goes first alternates: a run right after another's teardown
      // is not like one after an idle machine (kSettleSeconds).
      for (int k = 0; k < 2; ++k) {
        const int with = (rep + k) % 2;
        double c = 0;
        const double s = run(with == 1, &c);
        if (s < 0) ++failures;
        if (s > 0 && (best[with] < 0 || s < best[with])) best[with] = s, cpu[with] = c;
      }
    }
    if (best[0] < 0 || best[1] < 0) {
      std::printf("  %-28s failed (see stderr)\n", what);
      return;
    }
    std::printf(
        "  %-28s none %.3f s (%.0f MiB/s, CPU %.2f s)  secret %.3f s (%.0f MiB/s, CPU %.2f s)  "
        "time %+.1f%%, CPU %+.1f%%\n",
        what, best[0], bytes / kMiB / best[0], cpu[0], best[1], bytes / kMiB / best[1], cpu[1],
        100 * (best[1] / best[0] - 1), 100 * (cpu[1] / cpu[0] - 1));
    std::fflush(stdout);
  };
  const int64_t size = only_size > 0 ? only_size : quick ? int64_t{64} << 20 : int64_t{1} << 30;
  char label[64];
  std::snprintf(label, sizeof label, "(a) %lld MiB h0 -> h1", static_cast<long long>(size >> 20));
  AgentTimes warm;
  if (RunMigration(int64_t{16} << 20, 0, false, &warm, secret) < 0) ++failures;  // warm-up
  pair(label, static_cast<double>(size), [&](bool with, double* cpu) {
    AgentTimes t;
    return RunMigration(size, spare, false, &t, with ? secret : "", cpu);
  });
  const v1::Ptc ptc =
      quick ? MakeGpt(2, 128, 1024, 128) : MakeGpt(layers > 0 ? layers : 12, 1024, 8192, 1024);
  const v1::Layout from = MakeLayout(2, 2, 1, {"h0", "h1"}, 2);
  const v1::Layout to = MakeLayout(2, 1, 2, {"h0", "h1", "h2", "h3"}, 1);
  auto plan = planner::PlanTransfer(ptc, from, to, {});
  if (!plan.ok()) {
    std::fprintf(stderr, "planner: %s\n", plan.status().ToString().c_str());
    return failures + 1;
  }
  std::snprintf(label, sizeof label, "(c) GPT %d layers, 4 agents", ptc.num_layers());
  pair(label, static_cast<double>(plan->stats().bytes_cross_host()), [&](bool with, double* cpu) {
    std::vector<AgentTimes> times;
    return RunReconfigure(ptc, from, *plan, spare, false, &times, cpu, with ? secret : "");
  });
  std::printf("  (c)'s MiB/s are cross-host bytes over the whole time.\n");
  return failures;
}

}  // namespace
}  // namespace reshard::agent::bench

int main(int argc, char** argv) {
  bool quick = false;
  int64_t only_size = 0;        // --size-mib N: part (a) at one size only
  std::string only;             // --only a|b|c
  int reps = 0;                 // --reps N: runs in (a) per size and in (c), best taken
  int64_t spare = -1;           // --spare-mib N: each agent's spare pool
  bool cancel = false;          // --cancel: every Execute cancelled (a forced failure)
  bool worker_address = false;  // --ucx-worker-address
  int layers = 0;               // --layers N: layers of the GPT state in (c) (default 12)
  std::string tls = "tcp";      // --ucx-tls TLS: UCX_TLS of agents, bare transport and ucx_perftest
  std::string shm_dir = "/dev/shm";  // --shm-dir DIR: where the agents' shm dirs go
  for (int i = 1; i < argc; ++i) {
    quick |= std::strcmp(argv[i], "--quick") == 0;
    cancel |= std::strcmp(argv[i], "--cancel") == 0;
    worker_address |= std::strcmp(argv[i], "--ucx-worker-address") == 0;
    if (std::strcmp(argv[i], "--size-mib") == 0 && i + 1 < argc) {
      only_size = std::atoll(argv[++i]) << 20;
      only = "a";
    } else if (std::strcmp(argv[i], "--reps") == 0 && i + 1 < argc) {
      reps = std::atoi(argv[++i]);
    } else if (std::strcmp(argv[i], "--spare-mib") == 0 && i + 1 < argc) {
      spare = std::atoll(argv[++i]) << 20;
    } else if (std::strcmp(argv[i], "--shm-dir") == 0 && i + 1 < argc) {
      shm_dir = argv[++i];
    } else if (std::strcmp(argv[i], "--ucx-tls") == 0 && i + 1 < argc) {
      tls = argv[++i];
    } else if (std::strcmp(argv[i], "--layers") == 0 && i + 1 < argc) {
      layers = std::atoi(argv[++i]);
    } else if (std::strcmp(argv[i], "--only") == 0 && i + 1 < argc) {
      only = argv[++i];
    }
  }
  setenv("UCX_NET_DEVICES", "lo", 1);
  setenv("UCX_TLS", tls.c_str(), 1);
  using namespace reshard::agent::bench;
  SetUcxTransports(tls);
  SetUcxListen(!worker_address);
  SetShmRoot(shm_dir);
  if (reps <= 0) reps = quick ? 1 : 3;
  if (spare < 0) spare = quick ? int64_t{128} << 20 : int64_t{2} << 30;
  int failures = 0;
  if (only.empty() || only == "a") failures += BenchStack(quick, only_size, reps, spare, cancel);
  if (only.empty() || only == "b") BenchLocal(quick);
  if (only.empty() || only == "c") failures += BenchReconfigure(quick, reps, spare, cancel, layers);
  if ((only.empty() && !cancel) || only == "d") {
    failures += BenchSecret(quick, only_size, reps, spare, layers);
  }
  if (failures > 0) {
    std::fprintf(stderr, "transfer_bench: %d run(s) failed\n", failures);
    return 1;
  }
  return 0;
}
