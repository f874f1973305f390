// The planner plans exactly what it planned before: the fingerprints of the
// benchmark's plans (175B and 70B at 1,024 GPUs, GPT-3 XL, 70B dp 4 -> 5
// grows, 70B tp 8 -> 4 and its HSDP form at 1,280 GPUs) and of 900 random
// jobs (the property tests' populations: classic kinds with losses and new
// hosts, and the kinds of issue 13) match the ones recorded when the planner
// was last changed on purpose. A change meant only
// to make planning faster must leave them as they are; a change to what the
// planner plans updates them here, and says so in its commit.
#include "bench/planner/plan_fingerprint.h"

#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/str_format.h"
#include "bench/planner/gpt_model.h"
#include "bench/planner/random_jobs.h"
#include "gtest/gtest.h"
#include "planner/planner.h"
#include "tests/verifier/random_jobs.h"

namespace reshard::bench {
namespace {

std::string Hex(uint64_t v) { return absl::StrFormat("%016x", v); }

// A plan's fingerprint, or one of its error (code and message).
uint64_t Outcome(const absl::StatusOr<planner::Plan>& plan) {
  if (plan.ok()) return PlanFingerprint(*plan);
  planner::Plan error;
  error.items.push_back({std::string(plan.status().ToString()), false, 1, 1});
  return PlanFingerprint(error) ^ 0x9e3779b97f4a7c15ull;
}

// Folds a sequence of fingerprints into one.
uint64_t Fold(uint64_t acc, uint64_t v) { return (acc ^ v) * 1099511628211ull + 0x7f4a7c15; }

TEST(PlanFingerprintTest, BenchmarkPlansAreUnchanged) {
  const v1::Ptc gpt175b = BuildGptPtc(kGpt3_175b, 8);
  const v1::Ptc gpt70b = BuildGptPtc(kGpt70b, 8);
  const v1::Ptc gpt70b_replicated = BuildGptPtc(kGpt70b, 8, /*distributed_optimizer=*/false);
  const v1::Ptc gpt_xl = BuildGptPtc(kGpt3Xl, 2);
  const v1::Ptc fsdp70b = BuildFsdpGptPtc(kGpt70b, 8);
  const v1::Layout from175 = MakeLayout(8, 16, 8, "host-", 0, 8);
  const v1::Layout from70 = MakeLayout(8, 8, 16, "host-", 0, 8);
  struct Case {
    const char* name;
    const v1::Ptc* ptc;
    v1::Layout from, to;
    const char* want;
  };
  const Case cases[] = {
      {"175b dp 8->6", &gpt175b, from175, MakeLayout(8, 16, 6, "host-", 0, 8), "a313f47e76650c08"},
      {"175b dp 8->12", &gpt175b, from175, MakeLayout(8, 16, 12, "host-", 0, 8),
       "8fe0826818664f46"},
      {"70b dp 16->12", &gpt70b, from70, MakeLayout(8, 8, 12, "host-", 0, 8), "8e8660c2456c1d1a"},
      {"70b dp 16->20", &gpt70b, from70, MakeLayout(8, 8, 20, "host-", 0, 8), "75c026138bb277f2"},
      {"xl dp 4->2", &gpt_xl, MakeLayout(2, 2, 4, "host-", 0, 8),
       MakeLayout(2, 2, 2, "host-", 0, 8), "f57bed5bec729883"},
      {"70b dp 4->5 tp 8 pp 4", &gpt70b, MakeLayout(8, 4, 4, "host-", 0, 8),
       MakeLayout(8, 4, 5, "host-", 0, 8), "87613d21614d5a8c"},
      {"70b dp 4->5 replicated optimizer", &gpt70b_replicated, MakeLayout(8, 4, 4, "host-", 0, 8),
       MakeLayout(8, 4, 5, "host-", 0, 8), "66845ad38c8df705"},
      {"70b tp 8->4", &gpt70b, MakeLayout(8, 1, 128, "host-", 0, 8),
       MakeLayout(4, 1, 256, "host-", 0, 8), "a2178c7f0b4ab4b1"},
      // Its 32 replicas plan alone (planner/replicas.h): replica 0's plan,
      // repeated; before that, 788db4af573217f5 (senders in any replica).
      {"70b hsdp tp 8->4", &fsdp70b, WithDpShard(MakeLayout(8, 1, 160, "host-", 0, 8), 5),
       WithDpShard(MakeLayout(4, 1, 320, "host-", 0, 8), 10), "6a26f51d020b5870"},
  };
  for (const Case& c : cases) {
    const absl::StatusOr<planner::Plan> plan = planner::MakePlan(*c.ptc, c.from, c.to, {});
    ASSERT_TRUE(plan.ok()) << c.name << ": " << plan.status();
    EXPECT_EQ(Hex(PlanFingerprint(*plan)), c.want) << c.name;
  }
}

TEST(PlanFingerprintTest, PropertyPopulationPlansAreUnchanged) {
  uint64_t acc = 0;
  int failed = 0;
  for (const Transition& t : PropertyPopulation(100)) {
    const absl::StatusOr<planner::Plan> plan = planner::MakePlan(t.ptc, t.from, t.to, t.lost);
    failed += !plan.ok();
    acc = Fold(acc, Outcome(plan));
  }
  EXPECT_GT(failed, 0);  // the population has unrecoverable losses too
  EXPECT_EQ(Hex(acc), "e48ae7d5eb7f853c");
}

TEST(PlanFingerprintTest, NewKindsPlansAreUnchanged) {
  uint64_t acc = 0;
  for (uint64_t seed = 1300; seed < 1900; ++seed) {
    const verifier::testing::RandomJob job = verifier::testing::RandomRealJob(seed);
    planner::LostSet lost;
    lost.hosts = job.lost_hosts;
    lost.ranks = job.lost_ranks;
    acc = Fold(acc, Outcome(planner::MakePlan(job.ptc, job.from, job.to, lost)));
  }
  EXPECT_EQ(Hex(acc), "5a9312cfa38b91b3");
}

}  // namespace
}  // namespace reshard::bench
