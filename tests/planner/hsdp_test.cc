// HSDP (ParallelConfig.dp_shard) and dp-only splits (DataParallel.over):
// docs/partitioning.md, "Data-parallel groups". The golden example of that
// page, request validation, transitions planned and checked exactly (the
// planner's replay and the independent verifier), and a property test over
// random jobs that use both.
//
// RESHARD_PROPERTY_SEED=<n> runs one seed of the property test.
#include <cstdlib>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "planner/layout.h"
#include "planner/planner.h"
#include "planner/shard.h"
#include "planner/validate.h"
#include "tests/planner/plan_check.h"
#include "tests/support/job_builders.h"
#include "tests/verifier/random_hsdp_jobs.h"
#include "verifier/verifier.h"

namespace reshard::planner {
namespace {

using test_support::Place;
using test_support::SetDp;
using test_support::Tensor;
using ::testing::HasSubstr;
using testing::PlanAndCheck;

v1::Layout Hsdp(int tp, int cp, int dp, int dp_shard, int per_host, int first_host = 0) {
  v1::Layout l;
  l.mutable_config()->set_tp(tp);
  l.mutable_config()->set_pp(1);
  l.mutable_config()->set_dp(dp);
  l.mutable_config()->set_cp(cp);
  l.mutable_config()->set_dp_shard(dp_shard);
  Place(&l, per_host, first_host);
  return l;
}

v1::TensorSpec Over(v1::TensorSpec t, v1::DpOver over) {
  t.mutable_partition()->mutable_dp()->set_over(over);
  return t;
}

// The rows [begin, end) each rank holds of a DP_CHUNK-on-axis-0 tensor.
std::vector<std::pair<int64_t, int64_t>> Rows(const v1::Ptc& ptc, const v1::Layout& l,
                                              const std::string& name) {
  std::vector<std::pair<int64_t, int64_t>> out;
  for (const v1::Shard& s : DeriveShards(ptc, l)) {
    if (s.tensor() != name) continue;
    EXPECT_EQ(s.pieces_size(), 1) << name << " rank " << s.rank();
    const v1::Box& b = s.pieces(0).global();
    out.emplace_back(b.offset(0), b.offset(0) + b.size(0));
  }
  return out;
}

using Rowset = std::vector<std::pair<int64_t, int64_t>>;

TEST(HsdpTest, HsdpGoldenExample) {
  // docs/partitioning.md, "Data-parallel groups": tp 1, cp 2, dp 4,
  // dp_shard 2, shape [8, 3], DP_CHUNK on axis 0.
  v1::Ptc ptc;
  v1::TensorSpec t = Tensor("w", {8, 3});
  SetDp(&t, v1::DP_CHUNK, 0);
  *ptc.add_tensors() = Over(t, v1::DP_OVER_DP_CP);
  v1::TensorSpec u = Tensor("m", {8, 3});
  SetDp(&u, v1::DP_CHUNK, 0);
  *ptc.add_tensors() = Over(u, v1::DP_OVER_DP);
  const v1::Layout hsdp = Hsdp(1, 2, 4, 2, 2);
  ASSERT_TRUE(ValidateLayout(ptc, hsdp, "layout").ok());
  EXPECT_EQ(Rows(ptc, hsdp, "w"),
            (Rowset{{0, 2}, {2, 4}, {4, 6}, {6, 8}, {0, 2}, {2, 4}, {4, 6}, {6, 8}}));
  EXPECT_EQ(Rows(ptc, hsdp, "m"),
            (Rowset{{0, 4}, {0, 4}, {4, 8}, {4, 8}, {0, 4}, {0, 4}, {4, 8}, {4, 8}}));
  // FSDP (dp_shard 0): S = 8, rank k holds row k.
  const v1::Layout fsdp = Hsdp(1, 2, 4, 0, 2);
  Rowset rows;
  for (int k = 0; k < 8; ++k) rows.emplace_back(k, k + 1);
  EXPECT_EQ(Rows(ptc, fsdp, "w"), rows);
  // Without the fields every existing meaning holds: dp_shard = dp is the
  // same as 0.
  EXPECT_EQ(Rows(ptc, Hsdp(1, 2, 4, 4, 2), "w"), rows);
}

TEST(HsdpTest, ShardGroupsOfDpSplitAndDpFlat) {
  // DP_SPLIT (array_split) of 5 rows and DP_FLAT of 5 elements over S = 2
  // (dp 4, dp_shard 2, cp 1): replicas 0 and 1 hold the same shards.
  v1::Ptc ptc;
  v1::TensorSpec a = Tensor("a", {5});
  SetDp(&a, v1::DP_SPLIT, 0);
  *ptc.add_tensors() = a;
  v1::TensorSpec f = Tensor("f", {5});
  SetDp(&f, v1::DP_FLAT);
  *ptc.add_tensors() = f;
  const std::vector<v1::Shard> shards = DeriveShards(ptc, Hsdp(1, 1, 4, 2, 1));
  ASSERT_EQ(shards.size(), 8u);
  for (int r = 0; r < 4; ++r) {
    const v1::Shard& s = shards[r];
    EXPECT_EQ(s.pieces(0).global().offset(0), r % 2 == 0 ? 0 : 3) << r;
    EXPECT_EQ(s.pieces(0).global().size(0), r % 2 == 0 ? 3 : 2) << r;
    const v1::Shard& flat = shards[4 + r];
    EXPECT_EQ(flat.local_elements(), 3) << r;  // ceil(5 / 2)
    EXPECT_EQ(flat.padding_offset(), r % 2 == 0 ? 3 : 2) << r;
  }
}

void ExpectInvalid(const v1::Ptc& ptc, const v1::Layout& l, const std::string& want) {
  absl::Status s = ValidatePtc(ptc);
  if (s.ok()) s = ValidateLayout(ptc, l, "layout");
  EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr(want));
  // The verifier, from the same page, refuses the same inputs.
  const absl::StatusOr<std::vector<std::string>> v =
      verifier::UnrecoverableItems(ptc, l, l, {}, {});
  EXPECT_TRUE(absl::IsInvalidArgument(v.status())) << v.status();
}

TEST(HsdpTest, BadSizesAreInvalidArgumentNamingFieldAndValue) {
  v1::Ptc ptc;
  v1::TensorSpec t = Tensor("w", {8});
  SetDp(&t, v1::DP_CHUNK, 0);
  *ptc.add_tensors() = t;
  ExpectInvalid(ptc, Hsdp(1, 1, 4, 3, 1), "layout.config.dp_shard is 3; it must divide dp 4");
  ExpectInvalid(ptc, Hsdp(1, 1, 4, 8, 1), "layout.config.dp_shard is 8");
  ExpectInvalid(ptc, Hsdp(1, 1, 4, -1, 1), "layout.config.dp_shard is -1");

  v1::Ptc bad = ptc;
  bad.mutable_tensors(0)->mutable_partition()->mutable_dp()->set_over(static_cast<v1::DpOver>(7));
  ExpectInvalid(bad, Hsdp(1, 1, 4, 2, 1),
                "tensor \"w\": partition.dp.over 7 is not a known DpOver");

  v1::Ptc expert = ptc;
  v1::TensorSpec* e = expert.mutable_tensors(0);
  e->clear_shape();
  e->add_shape(4);
  e->add_shape(2);
  e->mutable_partition()->mutable_expert()->set_axis(0);
  e->mutable_partition()->mutable_dp()->set_over(v1::DP_OVER_DP);
  ExpectInvalid(expert, Hsdp(1, 1, 4, 2, 1),
                "tensor \"w\": partition.dp.over DP_OVER_DP is not allowed for an expert tensor");

  v1::Ptc bucket = ptc;
  bucket.add_buckets()->set_name("params");
  v1::DataParallel* dp = bucket.mutable_tensors(0)->mutable_partition()->mutable_dp();
  dp->set_mode(v1::DP_BUCKET);
  dp->set_bucket("params");
  dp->set_over(v1::DP_OVER_DP);
  ExpectInvalid(bucket, Hsdp(1, 1, 4, 2, 1),
                "tensor \"w\": partition.dp.over DP_OVER_DP is not allowed for a DP_BUCKET member");

  // A shard group too large for the tensor names the group, not dp alone.
  v1::Ptc small;
  v1::TensorSpec s = Tensor("s", {2});
  SetDp(&s, v1::DP_SPLIT, 0);
  *small.add_tensors() = s;
  ExpectInvalid(small, Hsdp(1, 2, 4, 2, 1),
                "tensor \"s\": layout: the shard group (dp_shard 2 x cp 2) of 4 exceeds the 2 "
                "elements");
  EXPECT_TRUE(ValidateLayout(small, Hsdp(1, 2, 4, 1, 1), "layout").ok());  // S = 2
}

v1::Ptc ChunkPtc(int64_t rows) {
  v1::Ptc ptc;
  v1::TensorSpec t = Tensor("w", {rows});
  SetDp(&t, v1::DP_CHUNK, 0);
  *ptc.add_tensors() = t;
  return ptc;
}

TEST(HsdpTest, HsdpToFsdpAndBackMoveExactlyTheMissingRows) {
  // dp 4 on 4 hosts of one device. HSDP (dp_shard 2): rows [0,4) [4,8)
  // [0,4) [4,8). FSDP: [0,2) [2,4) [4,6) [6,8). Ranks 1 and 2 each fetch 2
  // rows (8 bytes) from a replica: 16 bytes cross hosts.
  const v1::Ptc ptc = ChunkPtc(8);
  const v1::Layout hsdp = Hsdp(1, 1, 4, 2, 1), fsdp = Hsdp(1, 1, 4, 0, 1);
  const Plan down = PlanAndCheck(ptc, hsdp, fsdp);
  EXPECT_EQ(down.bytes_cross_host, 16);
  EXPECT_EQ(down.lower_bound_cross_host, 16);
  // Back: every rank but its own quarter: 8 + 16 + 16 + 8 bytes.
  const Plan up = PlanAndCheck(ptc, fsdp, hsdp);
  EXPECT_EQ(up.bytes_cross_host, 48);
  EXPECT_EQ(up.lower_bound_cross_host, 48);
  // A new shard size (S 2 -> 4 -> 1, dp 4 -> 8 adding replicas).
  PlanAndCheck(ptc, hsdp, Hsdp(1, 1, 8, 4, 2));
  PlanAndCheck(ptc, Hsdp(1, 1, 8, 4, 2), Hsdp(1, 1, 4, 1, 1));
  // Adding a replica at the same shard size moves one replica's bytes.
  const Plan grow = PlanAndCheck(ptc, hsdp, Hsdp(1, 1, 6, 2, 1));
  EXPECT_EQ(grow.bytes_cross_host, 32);  // new hosts h4 and h5: 16 bytes each
}

TEST(HsdpTest, AnHsdpReplicaIsASourceAfterALostHost) {
  // HSDP dp 4, dp_shard 2 on h0..h3: losing h0 (rank 0, rows [0,4)) loses
  // nothing, replica 1 (rank 2 on h2) still holds them; under FSDP the same
  // loss loses rows [0,2).
  const v1::Ptc ptc = ChunkPtc(8);
  const v1::Layout target = Hsdp(1, 1, 2, 0, 1, /*first_host=*/1);  // h1, h2
  const LostSet lost{{"h0"}, {}};
  const Plan plan = PlanAndCheck(ptc, Hsdp(1, 1, 4, 2, 1), target, lost);
  bool from_replica = false;
  for (const Plan::Step& s : plan.steps) from_replica |= s.src_rank == 2;
  EXPECT_TRUE(from_replica);
  const absl::StatusOr<Plan> fsdp = MakePlan(ptc, Hsdp(1, 1, 4, 0, 1), target, lost);
  EXPECT_TRUE(absl::IsFailedPrecondition(fsdp.status())) << fsdp.status();
  EXPECT_THAT(std::string(fsdp.status().message()), HasSubstr("\"w\""));
}

TEST(HsdpTest, DpOnlyAgainstDpTimesCpThroughContextParallelChanges) {
  // The same [8, 2] tensor split over dp x cp and over dp only, through cp
  // 2 -> 1 (dp 2 -> 4) and back, with and without HSDP; on 2 devices per host.
  v1::Ptc ptc;
  for (auto [name, over] :
       {std::pair<const char*, v1::DpOver>{"dpcp", v1::DP_OVER_DP_CP}, {"dp", v1::DP_OVER_DP}}) {
    v1::TensorSpec t = Tensor(name, {8, 2});
    SetDp(&t, v1::DP_CHUNK, 0);
    *ptc.add_tensors() = Over(t, over);
  }
  v1::TensorSpec f = Tensor("flat", {7, 3});
  SetDp(&f, v1::DP_FLAT);
  *ptc.add_tensors() = Over(f, v1::DP_OVER_DP);
  const v1::Layout cp2 = Hsdp(1, 2, 2, 0, 2), cp1 = Hsdp(1, 1, 4, 0, 2);
  // cp 2: "dpcp" over 4 ranks (2 rows each), "dp" over 2 (4 rows, both cp
  // ranks alike). Rank 1 (cp_i 1, dp_i 0) holds rows [2,4) and [0,4).
  const std::vector<v1::Shard> shards = DeriveShards(ptc, cp2);
  EXPECT_EQ(shards[1].pieces(0).global().offset(0), 2);
  EXPECT_EQ(shards[1].pieces(0).global().size(0), 2);
  EXPECT_EQ(shards[4 + 1].pieces(0).global().offset(0), 0);
  EXPECT_EQ(shards[4 + 1].pieces(0).global().size(0), 4);
  PlanAndCheck(ptc, cp2, cp1);
  PlanAndCheck(ptc, cp1, cp2);
  PlanAndCheck(ptc, Hsdp(1, 2, 4, 2, 2), Hsdp(1, 1, 4, 0, 2));
  PlanAndCheck(ptc, Hsdp(2, 2, 2, 1, 4), Hsdp(1, 2, 4, 2, 4));
  // cp 1 -> 2 at dp 2: "dp" needs no bytes beyond the same device or host
  // (each dp rank's cp partner holds the same shard), "dpcp" is re-split.
  const Plan p = PlanAndCheck(ptc, Hsdp(1, 1, 2, 0, 1), Hsdp(1, 2, 2, 0, 2));
  EXPECT_EQ(p.bytes_cross_host, p.lower_bound_cross_host);
}

std::string Describe(uint64_t seed, const verifier::testing::RandomJob& job) {
  return absl::StrCat("seed ", seed, "\nptc { ", job.ptc.ShortDebugString(), " }\nfrom { ",
                      job.from.ShortDebugString(), " }\nto { ", job.to.ShortDebugString(),
                      " }\nlost hosts ", job.lost_hosts.empty() ? "" : job.lost_hosts[0]);
}

bool HasReplicas(const v1::Layout& l) {
  return l.config().dp_shard() > 0 && l.config().dp_shard() < l.config().dp();
}

TEST(HsdpPropertyTest, PlansOfRandomHsdpJobsAreExactAndAtTheLowerBound) {
  std::vector<uint64_t> seeds;
  if (const char* one = std::getenv("RESHARD_PROPERTY_SEED")) {
    seeds.push_back(std::strtoull(one, nullptr, 10));
  } else {
    for (uint64_t s = 0; s < 400; ++s) seeds.push_back(2000 + s);
  }
  int planned = 0, unrecoverable = 0, invalid = 0, hsdp_change = 0, dp_only = 0, lost = 0;
  for (uint64_t seed : seeds) {
    const verifier::testing::RandomJob job = verifier::testing::RandomHsdpJob(seed);
    SCOPED_TRACE(Describe(seed, job));
    const LostSet lost_set{job.lost_hosts, {}};
    absl::StatusOr<Plan> plan;
    switch (testing::AgreeOnRefusal(job.ptc, job.from, job.to, job.lost_hosts, &plan)) {
      case testing::PlanOutcome::kInvalid:
        ++invalid;
        continue;
      case testing::PlanOutcome::kUnrecoverable:
        ++unrecoverable;
        continue;
      case testing::PlanOutcome::kPlanned:
        break;
    }
    ++planned;
    lost += !job.lost_hosts.empty();
    hsdp_change += (HasReplicas(job.from) || HasReplicas(job.to)) &&
                   job.from.config().dp_shard() != job.to.config().dp_shard();
    for (const v1::TensorSpec& t : job.ptc.tensors()) {
      if (t.partition().dp().over() == v1::DP_OVER_DP &&
          t.partition().dp().mode() != v1::DP_REPLICATED &&
          (job.from.config().cp() > 1 || job.to.config().cp() > 1)) {
        ++dp_only;
        break;
      }
    }
    EXPECT_TRUE(testing::CheckPlan(job.ptc, job.from, job.to, lost_set, *plan));
    const absl::Status verified = verifier::VerifyPlan(job.ptc, job.from, job.to, job.lost_hosts,
                                                       {}, ToProto(*plan, job.from, job.to));
    EXPECT_TRUE(verified.ok()) << verified;
    if (HasFailure()) break;  // one seed's report is enough
  }
  if (seeds.size() > 1) {
    // The population exercises what it is meant to.
    EXPECT_GE(planned, 200) << unrecoverable << " unrecoverable, " << invalid << " invalid";
    EXPECT_GE(hsdp_change, 60);
    EXPECT_GE(dp_only, 60);
    EXPECT_GE(lost, 20);
  }
  std::printf(
      "planned %d (HSDP changes %d, dp-only under cp %d, lost host %d), unrecoverable %d, "
      "invalid %d\n",
      planned, hsdp_change, dp_only, lost, unrecoverable, invalid);
}

}  // namespace
}  // namespace reshard::planner
