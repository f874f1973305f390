#include "advisor/advisor.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <tuple>
#include <unordered_set>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "planner/planner.h"

namespace reshard::advisor {
namespace {

absl::Status Invalid(const std::string& field, const std::string& value, const std::string& why) {
  return absl::InvalidArgumentError(absl::StrCat(field, " ", value, ": ", why));
}

absl::Status ValidateModel(const ModelSpec& m) {
  if (m.layers <= 0) return Invalid("model.layers", absl::StrCat(m.layers), "must be > 0");
  if (m.hidden <= 0) return Invalid("model.hidden", absl::StrCat(m.hidden), "must be > 0");
  if (m.heads <= 0) return Invalid("model.heads", absl::StrCat(m.heads), "must be > 0");
  if (m.hidden % m.heads != 0) {
    return Invalid("model.hidden", absl::StrCat(m.hidden),
                   absl::StrCat("not divisible by model.heads ", m.heads));
  }
  if (m.kv_heads < 0 || (m.kv_heads > 0 && m.heads % m.kv_heads != 0)) {
    return Invalid("model.kv_heads", absl::StrCat(m.kv_heads),
                   absl::StrCat("must be 0 or divide model.heads ", m.heads));
  }
  if (m.ffn_hidden < 0) {
    return Invalid("model.ffn_hidden", absl::StrCat(m.ffn_hidden), "must be >= 0");
  }
  if (m.vocab <= 0) return Invalid("model.vocab", absl::StrCat(m.vocab), "must be > 0");
  if (m.seq_length <= 0) {
    return Invalid("model.seq_length", absl::StrCat(m.seq_length), "must be > 0");
  }
  if (m.experts < 0) return Invalid("model.experts", absl::StrCat(m.experts), "must be >= 0");
  if (m.expert_topk < 0 || (m.experts > 0 && m.expert_topk > m.experts)) {
    return Invalid("model.expert_topk", absl::StrCat(m.expert_topk),
                   absl::StrCat("must be in [0, model.experts ", m.experts, "]"));
  }
  return absl::OkStatus();
}

absl::Status ValidateTraining(const TrainingSpec& t) {
  if (t.global_batch <= 0 || t.global_batch > std::numeric_limits<int>::max()) {
    return Invalid("training.global_batch", absl::StrCat(t.global_batch),
                   "must be in [1, 2^31 - 1]");
  }
  if (!(t.dp_overlap >= 0 && t.dp_overlap <= 1)) {
    return Invalid("training.dp_overlap", absl::StrCat(t.dp_overlap), "must be in [0, 1]");
  }
  if (t.grad_reduce_bytes <= 0) {
    return Invalid("training.grad_reduce_bytes", absl::StrCat(t.grad_reduce_bytes), "must be > 0");
  }
  if (!(t.usable_memory_fraction > 0 && t.usable_memory_fraction <= 1)) {
    return Invalid("training.usable_memory_fraction", absl::StrCat(t.usable_memory_fraction),
                   "must be in (0, 1]");
  }
  return absl::OkStatus();
}

// Fills the table's values into zero fields and checks the result.
absl::StatusOr<GpuType> ResolveGpu(const HostOffer& host) {
  GpuType g = host.gpu;
  const GpuType known = KnownGpu(g.name);
  if (g.memory_bytes == 0) g.memory_bytes = known.memory_bytes;
  if (g.peak_flops == 0) g.peak_flops = known.peak_flops;
  if (g.hbm_bytes_per_s == 0) g.hbm_bytes_per_s = known.hbm_bytes_per_s;
  if (g.gemm_efficiency == 0) g.gemm_efficiency = known.gemm_efficiency;
  if (g.traffic_factor == 0) g.traffic_factor = known.traffic_factor;
  const std::string where =
      absl::StrCat("cluster.hosts[\"", host.name, "\"].gpu (\"", g.name, "\").");
  for (auto [field, value] : {std::pair<const char*, double>{"memory_bytes", g.memory_bytes},
                              {"peak_flops", g.peak_flops},
                              {"hbm_bytes_per_s", g.hbm_bytes_per_s},
                              {"gemm_efficiency", g.gemm_efficiency},
                              {"traffic_factor", g.traffic_factor}}) {
    if (!(value > 0) || !std::isfinite(value)) {
      return Invalid(where + field, absl::StrCat(value),
                     "must be > 0 (give it, or use a GPU name of the table)");
    }
  }
  if (g.gemm_efficiency > 1) {
    return Invalid(where + "gemm_efficiency", absl::StrCat(g.gemm_efficiency), "must be <= 1");
  }
  return g;
}

// The weakest GPU of the offer paces a synchronous job.
absl::StatusOr<GpuType> ValidateCluster(const ClusterOffer& c) {
  if (c.hosts.empty()) return Invalid("cluster.hosts", "[]", "no hosts offered");
  if (!(c.intra_host_bytes_per_s > 0)) {
    return Invalid("cluster.intra_host_bytes_per_s", absl::StrCat(c.intra_host_bytes_per_s),
                   "must be > 0");
  }
  if (!(c.inter_host_bytes_per_s > 0)) {
    return Invalid("cluster.inter_host_bytes_per_s", absl::StrCat(c.inter_host_bytes_per_s),
                   "must be > 0");
  }
  std::unordered_set<std::string> names;
  GpuType weakest;
  for (const HostOffer& h : c.hosts) {
    if (h.name.empty()) return Invalid("cluster.hosts[].name", "\"\"", "must not be empty");
    if (!names.insert(h.name).second) {
      return Invalid("cluster.hosts[].name", absl::StrCat("\"", h.name, "\""), "offered twice");
    }
    if (h.devices <= 0) {
      return Invalid(absl::StrCat("cluster.hosts[\"", h.name, "\"].devices"),
                     absl::StrCat(h.devices), "must be > 0");
    }
    absl::StatusOr<GpuType> g = ResolveGpu(h);
    if (!g.ok()) return g.status();
    if (names.size() == 1) {
      weakest = *g;
      continue;
    }
    weakest.memory_bytes = std::min(weakest.memory_bytes, g->memory_bytes);
    if (g->peak_flops * g->gemm_efficiency < weakest.peak_flops * weakest.gemm_efficiency) {
      weakest.peak_flops = g->peak_flops;
      weakest.gemm_efficiency = g->gemm_efficiency;
    }
    weakest.hbm_bytes_per_s = std::min(weakest.hbm_bytes_per_s, g->hbm_bytes_per_s);
    weakest.traffic_factor = std::max(weakest.traffic_factor, g->traffic_factor);
  }
  return weakest;
}

// Divisors of n up to limit, ascending; O(sqrt n), so a batch of millions of
// sequences costs nothing.
std::vector<int> Divisors(int64_t n, int64_t limit) {
  std::vector<int> out;
  for (int64_t d = 1; d * d <= n; ++d) {
    if (n % d != 0) continue;
    if (d <= limit) out.push_back(static_cast<int>(d));
    if (n / d != d && n / d <= limit) out.push_back(static_cast<int>(n / d));
  }
  std::sort(out.begin(), out.end());
  return out;
}

struct Point {
  ParallelChoice choice;
  double time = 0;
  double memory = 0;
};

}  // namespace

ReconfigCost PriceReconfig(const v1::Ptc& ptc, const v1::Layout& from, const v1::Layout& to,
                           double inter_host_bytes_per_s, const planner::LostSet* lost) {
  ReconfigCost cost;
  absl::StatusOr<planner::Plan> plan =
      planner::MakePlan(ptc, from, to, lost != nullptr ? *lost : planner::LostSet{});
  if (!plan.ok()) {
    cost.error = std::string(plan.status().message());
    return cost;
  }
  cost.computed = true;
  cost.cross_host_bytes = plan->bytes_cross_host;
  cost.lower_bound_cross_host_bytes = plan->lower_bound_cross_host;
  cost.local_bytes = plan->bytes_local;
  for (const planner::Plan::HostStats& h : plan->hosts) {
    const int64_t busy = std::max(h.bytes_in, h.bytes_out);
    if (busy > cost.busiest_host_bytes || cost.busiest_host.empty()) {
      cost.busiest_host = h.host;
      cost.busiest_host_bytes = busy;
    }
  }
  cost.transfer_seconds = static_cast<double>(cost.busiest_host_bytes) / inter_host_bytes_per_s;
  return cost;
}

absl::StatusOr<Advice> Advise(const AdviceRequest& r) {
  if (absl::Status s = ValidateModel(r.model); !s.ok()) return s;
  if (absl::Status s = ValidateTraining(r.training); !s.ok()) return s;
  absl::StatusOr<GpuType> gpu = ValidateCluster(r.cluster);
  if (!gpu.ok()) return gpu.status();
  if ((r.current.ptc == nullptr) != (r.current.layout == nullptr)) {
    return Invalid("current",
                   r.current.ptc == nullptr ? "layout without ptc" : "ptc without layout",
                   "give both or neither");
  }
  if (r.max_micro_batch < 0) {
    return Invalid("max_micro_batch", absl::StrCat(r.max_micro_batch), "must be >= 0");
  }
  const ModelSpec& m = r.model;
  const TrainingSpec& t = r.training;
  int max_host = 0;
  for (const HostOffer& h : r.cluster.hosts) max_host = std::max(max_host, h.devices);
  Links links;
  links.devices_per_host = max_host;
  links.intra_host_bytes_per_s = r.cluster.intra_host_bytes_per_s;
  links.inter_host_bytes_per_s = r.cluster.inter_host_bytes_per_s;
  const double memory_limit = gpu->memory_bytes * t.usable_memory_fraction;
  const int kv = m.kv_heads > 0 ? m.kv_heads : m.heads;

  Advice advice;
  std::vector<Point> feasible;
  for (int tp = 1; tp <= max_host; ++tp) {
    if (m.heads % tp != 0 || kv % tp != 0) continue;
    int64_t capacity = 0;  // devices usable with tp groups inside hosts
    for (const HostOffer& h : r.cluster.hosts) capacity += h.devices / tp * tp;
    for (int pp : Divisors(m.layers, capacity / tp)) {
      for (int dp : Divisors(t.global_batch, capacity / (int64_t{tp} * pp))) {
        const int64_t per_dp = t.global_batch / dp;
        double state = -1;
        if (r.current.ptc != nullptr) {
          state = PtcStateBytesPerDevice(*r.current.ptc, tp, pp, dp,
                                         KeptDpShard(r.current.layout, dp));
        }
        const int64_t max_b = r.max_micro_batch > 0 ? r.max_micro_batch : per_dp;
        for (int b : Divisors(per_dp, max_b)) {
          for (Recompute rc : {Recompute::kNone, Recompute::kSelective, Recompute::kFull}) {
            ++advice.considered;
            const ParallelChoice c{tp, pp, dp, b, rc};
            const Memory mem = EstimateMemory(m, t, c, state);
            if (mem.total > memory_limit) continue;
            ++advice.feasible;
            feasible.push_back({c, EstimateStepTime(m, t, c, *gpu, links).total, mem.total});
          }
        }
      }
    }
  }
  // Pareto sweep: fastest first; keep a point only if it needs less memory
  // than every faster one. Ties: fewer devices, then the enumeration order.
  std::sort(feasible.begin(), feasible.end(), [](const Point& a, const Point& b) {
    const int wa = a.choice.tp * a.choice.pp * a.choice.dp;
    const int wb = b.choice.tp * b.choice.pp * b.choice.dp;
    return std::tie(a.time, a.memory, wa) < std::tie(b.time, b.memory, wb);
  });
  double best_memory = INFINITY;
  for (const Point& p : feasible) {
    if (!(p.memory < best_memory)) continue;
    best_memory = p.memory;
    Candidate c;
    c.choice = p.choice;
    c.time = EstimateStepTime(m, t, p.choice, *gpu, links);
    const double state =
        r.current.ptc == nullptr
            ? -1
            : PtcStateBytesPerDevice(*r.current.ptc, p.choice.tp, p.choice.pp, p.choice.dp,
                                     KeptDpShard(r.current.layout, p.choice.dp));
    c.memory = EstimateMemory(m, t, p.choice, state);
    const int world = p.choice.tp * p.choice.pp * p.choice.dp;
    c.tflops_per_gpu = c.time.hardware_flops / (world * c.time.total) / 1e12;
    absl::StatusOr<v1::Layout> layout = PlaceLayout(p.choice, r.cluster, r.current.layout);
    if (!layout.ok()) return layout.status();  // capacity was checked: a bug
    c.layout = *std::move(layout);
    advice.pareto.push_back(std::move(c));
  }
  if (r.current.ptc != nullptr) {
    const int n = std::min<int>(r.max_reconfig_plans, advice.pareto.size());
    for (int i = 0; i < n; ++i) {
      advice.pareto[i].reconfig =
          PriceReconfig(*r.current.ptc, *r.current.layout, advice.pareto[i].layout,
                        r.cluster.inter_host_bytes_per_s, r.current.lost);
    }
    for (int i = n; i < static_cast<int>(advice.pareto.size()); ++i) {
      advice.pareto[i].reconfig.error = "not planned (max_reconfig_plans)";
    }
  }
  return advice;
}

int BestForHorizon(const Advice& advice, double horizon_seconds, bool priced) {
  int best = -1;
  double best_steps = 0;
  for (int i = 0; i < static_cast<int>(advice.pareto.size()); ++i) {
    const Candidate& c = advice.pareto[i];
    if (priced && !c.reconfig.computed) continue;
    const double move = priced ? c.reconfig.transfer_seconds : 0;
    const double steps = (horizon_seconds - move) / c.time.total;
    if (steps >= 1 && steps > best_steps) {
      best = i;
      best_steps = steps;
    }
  }
  return best;
}

}  // namespace reshard::advisor
