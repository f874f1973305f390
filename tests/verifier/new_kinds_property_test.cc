// Property tests over random jobs that use the kinds of issue 13
// (random_jobs.h): the verifier's model keeps the invariants the spec implies
// (no element twice in a buffer; each pipeline stage holds all of a tensor or
// none of it), the naive reference planner's plans verify, and randomly
// mutated ones are rejected.
//
// RESHARD_PROPERTY_SEED=<n> runs one seed.
#include <cstdio>
#include <cstdlib>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "tests/verifier/random_jobs.h"
#include "tests/verifier/reference_plan.h"
#include "verifier/model.h"
#include "verifier/verifier.h"

namespace reshard::verifier {
namespace {

std::vector<uint64_t> Seeds(uint64_t base, int cases) {
  if (const char* one = std::getenv("RESHARD_PROPERTY_SEED")) {
    return {std::strtoull(one, nullptr, 10)};
  }
  std::vector<uint64_t> seeds;
  for (int i = 0; i < cases; ++i) seeds.push_back(base + i);
  return seeds;
}

std::string Describe(uint64_t seed, const testing::RandomJob& job) {
  return absl::StrCat("seed ", seed, "\nptc { ", job.ptc.ShortDebugString(), " }\nfrom { ",
                      job.from.ShortDebugString(), " }\nto { ", job.to.ShortDebugString(),
                      " }\nlost hosts ", job.lost_hosts.empty() ? "" : job.lost_hosts[0]);
}

// Pipeline stage of rank r, straight from "Ranks" in docs/partitioning.md.
int StageOf(const v1::Layout& l, int r) {
  const auto& c = l.config();
  const int rest = r / (c.tp() * std::max(c.cp(), 1));
  return c.order() == v1::RANK_ORDER_TP_PP_DP ? rest % c.pp() : rest / c.dp();
}

void CheckInvariants(const std::vector<std::vector<int64_t>>& buffers, const v1::Layout& l,
                     const ModelItem& item, const std::string& side) {
  std::vector<std::set<int64_t>> per_stage(l.config().pp());
  for (size_t r = 0; r < buffers.size(); ++r) {
    std::set<int64_t> seen;
    for (int64_t id : buffers[r]) {
      if (id == kPadding) continue;
      ASSERT_TRUE(id >= 0 && id < item.num_ids) << item.name << " " << side << " rank " << r;
      EXPECT_TRUE(seen.insert(id).second)
          << item.name << ": " << side << " rank " << r << " holds element " << id << " twice";
      per_stage[StageOf(l, static_cast<int>(r))].insert(id);
    }
  }
  for (size_t s = 0; s < per_stage.size(); ++s) {
    EXPECT_TRUE(per_stage[s].empty() || static_cast<int64_t>(per_stage[s].size()) == item.num_ids)
        << item.name << ": " << side << " stage " << s << " holds " << per_stage[s].size() << " of "
        << item.num_ids << " elements";
  }
}

// Breaks `plan` one way (chosen by rng); false when this plan offers nothing
// to break that way.
bool Mutate(std::mt19937_64& rng, const Model& m, v1::TransferPlan* plan) {
  const int kind = std::uniform_int_distribution<int>(0, 5)(rng);
  const int n = plan->steps_size();
  const int i = n == 0 ? -1 : std::uniform_int_distribution<int>(0, n - 1)(rng);
  switch (kind) {
    case 0:
      if (i < 0) return false;
      plan->mutable_steps()->DeleteSubrange(i, 1);
      return true;
    case 1:
      if (i < 0) return false;
      *plan->mutable_steps(i)->add_dsts() = plan->steps(i).dsts(0);
      return true;
    case 2:
      if (i < 0) return false;
      plan->mutable_steps(i)->mutable_src()->set_offset(plan->steps(i).src().offset() + 1);
      return true;
    case 3:
      if (plan->zero_fills_size() == 0) return false;
      plan->mutable_zero_fills()->RemoveLast();
      return true;
    case 4:
      if (plan->regenerate_size() == 0) return false;
      plan->mutable_regenerate()->RemoveLast();
      return true;
    default: {  // a copy moved: two steps into one buffer trade places
      for (int j = 0; i >= 0 && j < n; ++j) {
        v1::CopyStep &a = *plan->mutable_steps(i), &b = *plan->mutable_steps(j);
        if (j == i || a.item() != b.item() || a.dsts(0).rank() != b.dsts(0).rank()) continue;
        const int64_t pa = a.dsts(0).region().offset(), pb = b.dsts(0).region().offset();
        const auto& buf = m.items[a.item()].new_buffers[a.dsts(0).rank()];
        if (buf[pa] == buf[pb]) continue;
        a.mutable_dsts(0)->mutable_region()->set_offset(pb);
        b.mutable_dsts(0)->mutable_region()->set_offset(pa);
        return true;
      }
      return false;
    }
  }
}

TEST(NewKindsPropertyTest, ModelInvariantsReferencePlansAndMutations) {
  int verified = 0, invalid = 0, lost = 0, mutated = 0;
  for (uint64_t seed : Seeds(7000, 400)) {
    const testing::RandomJob job = testing::RandomRealJob(seed);
    SCOPED_TRACE(Describe(seed, job));
    absl::StatusOr<Model> m = BuildModel(job.ptc, job.from, job.to, job.lost_hosts, {});
    if (!m.ok()) {
      EXPECT_EQ(m.status().code(), absl::StatusCode::kInvalidArgument) << m.status();
      ++invalid;
      continue;
    }
    for (const ModelItem& item : m->items) {
      if (item.is_blob) continue;
      CheckInvariants(item.old_buffers, job.from, item, "old");
      CheckInvariants(item.new_buffers, job.to, item, "new");
    }
    absl::StatusOr<v1::TransferPlan> plan =
        testing::ReferencePlan(job.ptc, job.from, job.to, job.lost_hosts, {});
    if (!plan.ok()) {
      EXPECT_EQ(plan.status().code(), absl::StatusCode::kFailedPrecondition) << plan.status();
      absl::StatusOr<std::vector<std::string>> names =
          UnrecoverableItems(job.ptc, job.from, job.to, job.lost_hosts, {});
      EXPECT_TRUE(names.ok() && !names->empty());
      ++lost;
      continue;
    }
    const absl::Status ok = VerifyPlan(job.ptc, job.from, job.to, job.lost_hosts, {}, *plan);
    EXPECT_TRUE(ok.ok()) << ok;
    ++verified;
    std::mt19937_64 rng(seed);
    v1::TransferPlan bad = *plan;
    if (!Mutate(rng, *m, &bad)) continue;
    EXPECT_EQ(VerifyPlan(job.ptc, job.from, job.to, job.lost_hosts, {}, bad).code(),
              absl::StatusCode::kFailedPrecondition);
    ++mutated;
  }
  std::printf("verified %d, lost %d, invalid %d, mutated %d\n", verified, lost, invalid, mutated);
  if (std::getenv("RESHARD_PROPERTY_SEED") == nullptr) {
    EXPECT_GE(verified, 200);
    EXPECT_GE(mutated, 120);
  }
}

}  // namespace
}  // namespace reshard::verifier
