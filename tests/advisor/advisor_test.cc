// Unit tests of the advisor: the search's constraints, the Pareto property
// (checked against an independent brute force), request validation, memory
// and time monotonicity, PTC bytes and the planner-priced reconfiguration.
#include "advisor/advisor.h"

#include <algorithm>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "tests/support/job_builders.h"

namespace reshard::advisor {
namespace {

using ::reshard::test_support::MakeLayout;

ModelSpec Gpt(int layers, int hidden, int heads) {
  ModelSpec m;
  m.layers = layers;
  m.hidden = hidden;
  m.heads = heads;
  m.vocab = 51200;
  m.seq_length = 2048;
  return m;
}

ClusterOffer A100Hosts(int hosts, int devices, const std::string& prefix = "host") {
  ClusterOffer c;
  for (int i = 0; i < hosts; ++i) c.hosts.push_back({absl::StrCat(prefix, i), devices, {"A100"}});
  c.intra_host_bytes_per_s = 240e9;
  c.inter_host_bytes_per_s = 160e9;
  return c;
}

AdviceRequest Request(const ModelSpec& m, int64_t batch, const ClusterOffer& c) {
  AdviceRequest r;
  r.model = m;
  r.training.global_batch = batch;
  r.cluster = c;
  return r;
}

TEST(Advise, ParetoSetRespectsTheConstraintsAndIsSorted) {
  const AdviceRequest r = Request(Gpt(36, 4096, 32), 512, A100Hosts(8, 8));
  absl::StatusOr<Advice> a = Advise(r);
  ASSERT_TRUE(a.ok()) << a.status();
  ASSERT_FALSE(a->pareto.empty());
  EXPECT_GT(a->considered, a->feasible);
  for (size_t i = 0; i < a->pareto.size(); ++i) {
    const Candidate& c = a->pareto[i];
    const ParallelChoice& p = c.choice;
    SCOPED_TRACE(absl::StrCat("tp ", p.tp, " pp ", p.pp, " dp ", p.dp, " b ", p.micro_batch));
    EXPECT_EQ(32 % p.tp, 0);
    EXPECT_LE(p.tp, 8);
    EXPECT_EQ(36 % p.pp, 0);
    EXPECT_LE(p.tp * p.pp * p.dp, 64);
    EXPECT_EQ(512 % p.dp, 0);
    EXPECT_EQ((512 / p.dp) % p.micro_batch, 0);
    EXPECT_LE(c.memory.total, 80e9 * r.training.usable_memory_fraction);
    EXPECT_GT(c.tflops_per_gpu, 0);
    EXPECT_LT(c.tflops_per_gpu, 312);
    if (i > 0) {
      EXPECT_GT(c.time.total, a->pareto[i - 1].time.total);
      EXPECT_LT(c.memory.total, a->pareto[i - 1].memory.total);
    }
    // Layout: one slot per rank, every tp group inside one host.
    ASSERT_EQ(c.layout.placement().ranks_size(), p.tp * p.pp * p.dp);
    for (int rank = 0; rank < c.layout.placement().ranks_size(); ++rank) {
      EXPECT_EQ(c.layout.placement().ranks(rank).host(),
                c.layout.placement().ranks(rank - rank % p.tp).host());
    }
    EXPECT_FALSE(c.reconfig.computed);  // no current layout given
  }
}

// Brute force, written independently of Advise(): every feasible tuple, and
// no Pareto point is dominated by any of them.
TEST(Advise, ParetoSetMatchesBruteForce) {
  const ModelSpec m = Gpt(24, 2304, 24);
  const AdviceRequest r = Request(m, 64, A100Hosts(2, 4));
  absl::StatusOr<Advice> a = Advise(r);
  ASSERT_TRUE(a.ok()) << a.status();
  const GpuType gpu = KnownGpu("A100");
  Links links;
  links.devices_per_host = 4;
  links.intra_host_bytes_per_s = 240e9;
  links.inter_host_bytes_per_s = 160e9;
  struct P {
    double time, memory;
  };
  std::vector<P> all;
  int64_t considered = 0;
  for (int tp : {1, 2, 3, 4}) {
    if (24 % tp) continue;
    for (int pp = 1; pp <= 24; ++pp) {
      for (int dp = 1; tp * pp * dp <= 8; ++dp) {
        if (24 % pp || 64 % dp) continue;
        for (int b = 1; b <= 64 / dp; ++b) {
          if ((64 / dp) % b) continue;
          for (Recompute rc : {Recompute::kNone, Recompute::kSelective, Recompute::kFull}) {
            ++considered;
            ParallelChoice c{tp, pp, dp, b, rc, 1};
            const Memory mem = EstimateMemory(m, r.training, c);
            if (mem.total > 80e9 * 0.9) continue;
            all.push_back({EstimateStepTime(m, r.training, c, gpu, links).total, mem.total});
          }
        }
      }
    }
  }
  EXPECT_EQ(a->considered, considered);
  EXPECT_EQ(a->feasible, static_cast<int64_t>(all.size()));
  ASSERT_FALSE(a->pareto.empty());
  for (const Candidate& c : a->pareto) {
    for (const P& p : all) {
      const bool dominates = p.time <= c.time.total && p.memory <= c.memory.total &&
                             (p.time < c.time.total || p.memory < c.memory.total);
      EXPECT_FALSE(dominates) << "(" << p.time << " s, " << p.memory << " B) dominates ("
                              << c.time.total << " s, " << c.memory.total << " B)";
    }
  }
  // And every non-dominated point is in the set (up to exact ties).
  for (const P& p : all) {
    const bool dominated = std::any_of(all.begin(), all.end(), [&](const P& q) {
      return q.time <= p.time && q.memory <= p.memory && (q.time < p.time || q.memory < p.memory);
    });
    if (dominated) continue;
    EXPECT_TRUE(std::any_of(
        a->pareto.begin(), a->pareto.end(),
        [&](const Candidate& c) { return c.time.total == p.time && c.memory.total == p.memory; }))
        << p.time << " s, " << p.memory << " B missing";
  }
}

TEST(Advise, NothingFitsIsAnEmptySetNotAnError) {
  absl::StatusOr<Advice> a = Advise(Request(Gpt(128, 25600, 160), 512, A100Hosts(1, 8)));
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_TRUE(a->pareto.empty());
  EXPECT_EQ(a->feasible, 0);
  EXPECT_GT(a->considered, 0);
}

TEST(Advise, MalformedRequestsNameTheField) {
  struct Case {
    std::string expect;
    AdviceRequest request;
  };
  std::vector<Case> cases;
  AdviceRequest ok = Request(Gpt(24, 2304, 24), 64, A100Hosts(2, 4));
  auto with = [&](std::string expect, auto change) {
    AdviceRequest r = ok;
    change(r);
    cases.push_back({std::move(expect), std::move(r)});
  };
  with("model.hidden 2304: not divisible by model.heads 25", [](auto& r) { r.model.heads = 25; });
  with("model.layers 0", [](auto& r) { r.model.layers = 0; });
  with("model.kv_heads 5", [](auto& r) { r.model.kv_heads = 5; });
  with("training.global_batch -1", [](auto& r) { r.training.global_batch = -1; });
  with("training.global_batch 4294967296",
       [](auto& r) { r.training.global_batch = int64_t{1} << 32; });
  with("training.dp_overlap 2", [](auto& r) { r.training.dp_overlap = 2; });
  with("cluster.hosts []", [](auto& r) { r.cluster.hosts.clear(); });
  with("cluster.hosts[].name \"host0\": offered twice",
       [](auto& r) { r.cluster.hosts[1].name = "host0"; });
  with("cluster.hosts[\"host1\"].devices 0", [](auto& r) { r.cluster.hosts[1].devices = 0; });
  with("cluster.hosts[\"host0\"].gpu (\"X9\").memory_bytes 0",
       [](auto& r) { r.cluster.hosts[0].gpu = GpuType{"X9"}; });
  with("cluster.inter_host_bytes_per_s 0", [](auto& r) { r.cluster.inter_host_bytes_per_s = 0; });
  v1::Ptc ptc;
  with("current ptc without layout", [&](auto& r) { r.current.ptc = &ptc; });
  for (const Case& c : cases) {
    absl::StatusOr<Advice> a = Advise(c.request);
    ASSERT_FALSE(a.ok()) << c.expect;
    EXPECT_EQ(a.status().code(), absl::StatusCode::kInvalidArgument) << c.expect;
    EXPECT_NE(a.status().message().find(c.expect), std::string::npos)
        << a.status().message() << " lacks " << c.expect;
  }
  // An unknown GPU with everything given is fine.
  AdviceRequest custom = ok;
  for (HostOffer& h : custom.cluster.hosts) h.gpu = GpuType{"X9", 40e9, 100e12, 1e12};
  EXPECT_TRUE(Advise(custom).ok());
}

TEST(Estimate, RecomputationTradesMemoryForTime) {
  const ModelSpec m = Gpt(96, 12288, 96);
  TrainingSpec t;
  t.global_batch = 64;
  const GpuType gpu = KnownGpu("A100");
  const Links links{8, 240e9, 160e9};
  ParallelChoice none{8, 8, 1, 1, Recompute::kNone, 1};
  ParallelChoice selective = none, full = none;
  selective.recompute = Recompute::kSelective;
  full.recompute = Recompute::kFull;
  EXPECT_GT(EstimateMemory(m, t, none).activations, EstimateMemory(m, t, selective).activations);
  EXPECT_GT(EstimateMemory(m, t, selective).activations, EstimateMemory(m, t, full).activations);
  EXPECT_LT(EstimateStepTime(m, t, none, gpu, links).total,
            EstimateStepTime(m, t, selective, gpu, links).total);
  EXPECT_LT(EstimateStepTime(m, t, selective, gpu, links).total,
            EstimateStepTime(m, t, full, gpu, links).total);
  // The distributed optimizer shards 12 of the 18 bytes per parameter.
  ParallelChoice dp8{8, 8, 8, 1, Recompute::kSelective, 1};
  t.global_batch = 512;
  const double plain = EstimateMemory(m, t, dp8).state;
  t.distributed_optimizer = true;
  EXPECT_NEAR(EstimateMemory(m, t, dp8).state / plain, (6 + 12.0 / 8) / 18, 1e-9);
  // More micro-batches shrink the bubble.
  ParallelChoice b1{8, 8, 1, 1, Recompute::kSelective, 1}, b8 = b1;
  b8.micro_batch = 8;
  t.global_batch = 64;
  t.distributed_optimizer = false;
  EXPECT_LT(EstimateStepTime(m, t, b1, gpu, links).bubble,
            EstimateStepTime(m, t, b8, gpu, links).bubble);
}

// A small GPT-shaped PTC: per layer a column-split qkv, a row-split output
// projection and a replicated norm; fp32 Adam moments DP_FLAT.
v1::Ptc SmallPtc(int layers, int64_t h) {
  v1::Ptc ptc;
  ptc.set_num_layers(layers);
  auto add = [&](std::string name, std::vector<int64_t> shape, int tp_axis, v1::PipelineMode pipe,
                 int layer, v1::DType dtype, v1::DpMode dp) {
    v1::TensorSpec* t = test_support::AddTensor(&ptc, name, shape, dtype, pipe, layer);
    if (tp_axis >= 0) test_support::SetTpSplit(t, tp_axis);
    test_support::SetDp(t, dp);
  };
  add("embedding", {256, h}, 0, v1::PIPELINE_FIRST_STAGE, 0, v1::DTYPE_BFLOAT16, v1::DP_REPLICATED);
  for (int l = 0; l < layers; ++l) {
    const std::string p = absl::StrCat("layers.", l, ".");
    add(p + "qkv", {3 * h, h}, 0, v1::PIPELINE_LAYER, l, v1::DTYPE_BFLOAT16, v1::DP_REPLICATED);
    add(p + "proj", {h, h}, 1, v1::PIPELINE_LAYER, l, v1::DTYPE_BFLOAT16, v1::DP_REPLICATED);
    add(p + "norm", {h}, -1, v1::PIPELINE_LAYER, l, v1::DTYPE_FLOAT32, v1::DP_REPLICATED);
    add("optimizer.exp_avg." + p + "qkv", {3 * h, h}, 0, v1::PIPELINE_LAYER, l, v1::DTYPE_FLOAT32,
        v1::DP_FLAT);
  }
  v1::BlobSpec* step = ptc.add_blobs();
  step->set_name("step");
  step->set_size_bytes(8);
  return ptc;
}

TEST(PtcState, BytesOfTheMostLoadedRank) {
  const int64_t h = 64;
  const v1::Ptc ptc = SmallPtc(4, h);
  // tp 2, pp 2, dp 2: stage 0 has the embedding and layers 0-1.
  const double embedding = 256.0 * h * 2 / 2;
  const double layer = 3.0 * h * h * 2 / 2 + h * h * 2 / 2.0 + h * 4 + 3.0 * h * h * 4 / 2 / 2;
  EXPECT_DOUBLE_EQ(PtcStateBytesPerDevice(ptc, 2, 2, 2), embedding + 2 * layer + 8);
  // One rank holds everything.
  const double all = 256.0 * h * 2 + 4 * (3.0 * h * h * 2 + h * h * 2 + h * 4 + 3.0 * h * h * 4);
  EXPECT_DOUBLE_EQ(PtcStateBytesPerDevice(ptc, 1, 1, 1), all + 8);
}

TEST(PtcState, HsdpSplitsOverTheShardGroupOnly) {
  const int64_t h = 64;
  const v1::Ptc ptc = SmallPtc(4, h);
  // dp 4 with dp_shard 2: the flat optimizer state is split in 2, not 4
  // (docs/partitioning.md, "Data-parallel groups"); dp_shard 0 is dp.
  EXPECT_DOUBLE_EQ(PtcStateBytesPerDevice(ptc, 2, 2, 4, 2), PtcStateBytesPerDevice(ptc, 2, 2, 2));
  EXPECT_DOUBLE_EQ(PtcStateBytesPerDevice(ptc, 2, 2, 4, 0), PtcStateBytesPerDevice(ptc, 2, 2, 4));
  EXPECT_GT(PtcStateBytesPerDevice(ptc, 2, 2, 4, 2), PtcStateBytesPerDevice(ptc, 2, 2, 4));
  // The advisor keeps a current layout's dp_shard where it divides dp.
  v1::Layout current = MakeLayout(1, 1, 4, {"h0", "h1"}, 2);
  current.mutable_config()->set_dp_shard(2);
  EXPECT_EQ(KeptDpShard(&current, 8), 2);
  EXPECT_EQ(KeptDpShard(&current, 3), 0);
  EXPECT_EQ(KeptDpShard(&current, 2), 0);  // one replica: plain FSDP
  EXPECT_EQ(KeptDpShard(nullptr, 4), 0);
  ClusterOffer offer;
  for (const char* name : {"h0", "h1", "h2", "h3"}) offer.hosts.push_back({name, 2, {"A100"}});
  absl::StatusOr<v1::Layout> placed = PlaceLayout(ParallelChoice{1, 1, 8}, offer, &current);
  ASSERT_TRUE(placed.ok()) << placed.status();
  EXPECT_EQ(placed->config().dp_shard(), 2);
}

TEST(Reconfig, PlannerPricesEveryParetoPointFromTheCurrentLayout) {
  const int64_t h = 64;
  const v1::Ptc ptc = SmallPtc(4, h);
  const v1::Layout current = MakeLayout(2, 1, 2, {"h0", "h1"}, 2);
  // Offered in another order, with two more hosts: the current hosts go first.
  ClusterOffer offer;
  for (const char* name : {"h3", "h2", "h1", "h0"}) offer.hosts.push_back({name, 2, {"A100"}});
  offer.intra_host_bytes_per_s = 240e9;
  offer.inter_host_bytes_per_s = 100e9;
  ModelSpec m;
  m.layers = 4;
  m.hidden = h;
  m.heads = 4;
  m.vocab = 256;
  m.seq_length = 128;
  AdviceRequest r = Request(m, 16, offer);
  r.current = {&ptc, &current};
  absl::StatusOr<Advice> a = Advise(r);
  ASSERT_TRUE(a.ok()) << a.status();
  ASSERT_FALSE(a->pareto.empty());
  for (const Candidate& c : a->pareto) {
    SCOPED_TRACE(absl::StrCat("tp ", c.choice.tp, " pp ", c.choice.pp, " dp ", c.choice.dp));
    ASSERT_TRUE(c.reconfig.computed) << c.reconfig.error;
    EXPECT_EQ(c.reconfig.cross_host_bytes, c.reconfig.lower_bound_cross_host_bytes);
    EXPECT_DOUBLE_EQ(c.reconfig.transfer_seconds, c.reconfig.busiest_host_bytes / 100e9);
    EXPECT_EQ(c.layout.placement().ranks(0).host(), "h0");
  }
  // Staying put costs nothing across hosts; moving to other hosts costs the
  // whole state once.
  const ReconfigCost same = PriceReconfig(ptc, current, current, 100e9);
  ASSERT_TRUE(same.computed) << same.error;
  EXPECT_EQ(same.cross_host_bytes, 0);
  EXPECT_EQ(same.transfer_seconds, 0);
  const ReconfigCost away =
      PriceReconfig(ptc, current, MakeLayout(2, 1, 2, {"h2", "h3"}, 2), 100e9);
  ASSERT_TRUE(away.computed) << away.error;
  EXPECT_GT(away.cross_host_bytes, 0);
  EXPECT_GT(away.transfer_seconds, 0);
  // The planner's own errors come back as text, not as a crash: 4 ranks on
  // a placement of 2 slots.
  const ReconfigCost bad = PriceReconfig(ptc, current, MakeLayout(2, 1, 2, {"h0"}, 2), 100e9);
  EXPECT_FALSE(bad.computed);
  EXPECT_FALSE(bad.error.empty());
}

TEST(Advise, BestForHorizonWeighsTheMoveAgainstTheSteps) {
  Advice a;
  Candidate fast, slow;
  fast.time.total = 1.0;
  fast.reconfig.computed = true;
  fast.reconfig.transfer_seconds = 50;
  slow.time.total = 1.5;
  slow.reconfig.computed = true;
  slow.reconfig.transfer_seconds = 0;
  a.pareto = {fast, slow};
  EXPECT_EQ(BestForHorizon(a, 100, true), 1);   // 50 steps < 66.7 steps
  EXPECT_EQ(BestForHorizon(a, 1000, true), 0);  // 950 steps > 666.7 steps
  EXPECT_EQ(BestForHorizon(a, 100, false), 0);  // moves count as free
  EXPECT_EQ(BestForHorizon(a, 1, true), -1);    // no step fits in 1 s after moving
  a.pareto[1].reconfig.computed = false;        // unpriced: skipped
  EXPECT_EQ(BestForHorizon(a, 100, true), 0);
  EXPECT_EQ(BestForHorizon(Advice{}, 100, true), -1);
}

}  // namespace
}  // namespace reshard::advisor
