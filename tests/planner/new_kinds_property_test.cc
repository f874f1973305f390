// Property test of the planner over random jobs that use the kinds of issue
// 13 (tests/verifier/random_jobs.h: cp, vpp, ep, expert_tp, axis padding,
// units with replication, expert slabs, DP_CHUNK, DP_BUCKET, first-and-last
// and layer-set pipelines, regenerable blobs; random old and new layouts,
// lost hosts). Every plan is replayed element by element (plan_check.h:
// exactly once, the right element, sources on the same device then host,
// cross-host bytes equal to the lower bound) and checked by the independent
// verifier::VerifyPlan; a failed plan must be one the verifier also finds
// unrecoverable.
//
// RESHARD_PROPERTY_SEED=<n> runs one seed.
#include <cstdlib>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "planner/layout.h"
#include "planner/planner.h"
#include "tests/planner/plan_check.h"
#include "tests/verifier/random_jobs.h"
#include "verifier/verifier.h"

namespace reshard::planner {
namespace {

std::string Describe(uint64_t seed, const verifier::testing::RandomJob& job) {
  return absl::StrCat("seed ", seed, "\nptc { ", job.ptc.ShortDebugString(), " }\nfrom { ",
                      job.from.ShortDebugString(), " }\nto { ", job.to.ShortDebugString(),
                      " }\nlost hosts ", job.lost_hosts.empty() ? "" : job.lost_hosts[0]);
}

TEST(NewKindsPropertyTest, PlansOfRandomJobsAreExactAndAtTheLowerBound) {
  std::vector<uint64_t> seeds;
  if (const char* one = std::getenv("RESHARD_PROPERTY_SEED")) {
    seeds.push_back(std::strtoull(one, nullptr, 10));
  } else {
    for (uint64_t s = 0; s < 600; ++s) seeds.push_back(1300 + s);
  }
  int planned = 0, unrecoverable = 0, regenerated = 0, lost = 0;
  for (uint64_t seed : seeds) {
    verifier::testing::RandomJob job = verifier::testing::RandomRealJob(seed);
    // A lost host must be one of the old layout's (else InvalidArgument, as
    // before issue 13): the generator may name one the old layout lacks.
    bool known = false;
    for (const v1::DeviceSlot& s : ExpandPlacement(job.from.placement())) {
      known |= !job.lost_hosts.empty() && s.host() == job.lost_hosts[0];
    }
    if (!known) job.lost_hosts.clear();
    // More host losses: every other job without one loses an old host the
    // target does not use, when there is one.
    if (job.lost_hosts.empty() && seed % 2 == 0) {
      const std::vector<v1::DeviceSlot> target = ExpandPlacement(job.to.placement());
      for (const v1::DeviceSlot& s : ExpandPlacement(job.from.placement())) {
        bool used = false;
        for (const v1::DeviceSlot& t : target) used |= t.host() == s.host();
        if (!used) {
          job.lost_hosts.push_back(s.host());
          break;
        }
      }
    }
    SCOPED_TRACE(Describe(seed, job));
    const LostSet lost_set{job.lost_hosts, {}};
    // The verifier, written independently from the same page, must agree
    // that the inputs are invalid or that some item cannot be recovered.
    absl::StatusOr<Plan> plan;
    switch (testing::AgreeOnRefusal(job.ptc, job.from, job.to, job.lost_hosts, &plan)) {
      case testing::PlanOutcome::kInvalid:
        continue;
      case testing::PlanOutcome::kUnrecoverable:
        ++unrecoverable;
        continue;
      case testing::PlanOutcome::kPlanned:
        break;
    }
    ++planned;
    lost += !job.lost_hosts.empty();
    regenerated += !plan->regenerate.empty();
    EXPECT_TRUE(testing::CheckPlan(job.ptc, job.from, job.to, lost_set, *plan));
    const v1::TransferPlan proto = ToProto(*plan, job.from, job.to);
    const absl::Status verified =
        verifier::VerifyPlan(job.ptc, job.from, job.to, job.lost_hosts, {}, proto);
    EXPECT_TRUE(verified.ok()) << verified;
    if (HasFailure()) break;  // one seed's report is enough
  }
  if (seeds.size() > 1) {
    // The population exercises what it is meant to.
    EXPECT_GE(planned, 300) << unrecoverable << " unrecoverable";
    EXPECT_GE(lost, 50);
    EXPECT_GE(regenerated, 5);
  }
  std::printf("planned %d, unrecoverable %d, with a lost host %d, regenerating %d\n", planned,
              unrecoverable, lost, regenerated);
}

}  // namespace
}  // namespace reshard::planner
