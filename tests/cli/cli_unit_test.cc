// Unit tests of the reshardctl library: flag splitting, --lost parsing and
// byte formatting. No files, no processes.
#include <string>
#include <vector>

#include "client/cli/args.h"
#include "client/cli/lost_set.h"
#include "client/cli/plan_command.h"
#include "client/cli/plan_summary.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/support/job_builders.h"

namespace reshard::cli {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

v1::Layout FourHostsOfFour() {
  return test_support::MakeLayout(2, 2, 4, {"node-0", "node-1", "node-2", "node-3"}, 4);
}

TEST(ParseArgsTest, SplitsBothFlagForms) {
  auto parsed = ParseArgs({"--spec", "a.json", "--to=b.json", "--", "--x"}, {"spec", "to"});
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->values.at("spec"), "a.json");
  EXPECT_EQ(parsed->values.at("to"), "b.json");
  EXPECT_THAT(parsed->positional, ElementsAre("--x"));
  EXPECT_FALSE(parsed->help);
}

TEST(ParseArgsTest, RejectsUnknownMissingAndRepeatedFlags) {
  EXPECT_THAT(ParseArgs({"--bogus", "1"}, {"spec"}).status().message(), HasSubstr("--bogus"));
  EXPECT_THAT(ParseArgs({"--spec"}, {"spec"}).status().message(), HasSubstr("needs a value"));
  EXPECT_THAT(ParseArgs({"--spec", "a", "--spec=b"}, {"spec"}).status().message(),
              HasSubstr("given twice"));
  EXPECT_THAT(ParseArgs({"-x"}, {"spec"}).status().message(), HasSubstr("\"-x\""));
}

TEST(ParsePlanArgsTest, DefaultsToSummaryAndChecksFormat) {
  auto options = ParsePlanArgs({"--spec", "j.json", "--to", "t.json"});
  ASSERT_TRUE(options.ok()) << options.status();
  EXPECT_EQ(options->format, PlanOptions::Format::kSummary);
  EXPECT_THAT(options->lost, IsEmpty());
  auto json = ParsePlanArgs({"--spec", "j", "--to", "t", "--format", "json", "--lost", "1"});
  ASSERT_TRUE(json.ok()) << json.status();
  EXPECT_EQ(json->format, PlanOptions::Format::kJson);
  EXPECT_EQ(json->lost, "1");
  EXPECT_EQ(ParsePlanArgs({"--spec", "j", "--to", "t", "--format", "xml"}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(ParsePlanArgs({"--to", "t"}).status().message(), HasSubstr("--spec"));
  EXPECT_TRUE(ParsePlanArgs({"--help"})->help);
}

TEST(ParseLostSetTest, HostsRanksAndForcedRanks) {
  auto lost = ParseLostSet(" node-3, 5 ,rank:7,node-3,5", FourHostsOfFour());
  ASSERT_TRUE(lost.ok()) << lost.status();
  EXPECT_THAT(lost->hosts, ElementsAre("node-3"));
  EXPECT_THAT(lost->ranks, ElementsAre(5, 7));
  auto none = ParseLostSet("", FourHostsOfFour());
  ASSERT_TRUE(none.ok());
  EXPECT_THAT(none->hosts, IsEmpty());
  EXPECT_THAT(none->ranks, IsEmpty());
}

TEST(ParseLostSetTest, HostNamedLikeANumberIsAHostUnlessForced) {
  v1::Layout layout = FourHostsOfFour();
  layout.mutable_placement()->set_hosts(2, "12");
  auto lost = ParseLostSet("12,rank:12", layout);
  ASSERT_TRUE(lost.ok()) << lost.status();
  EXPECT_THAT(lost->hosts, ElementsAre("12"));
  EXPECT_THAT(lost->ranks, ElementsAre(12));
}

TEST(ParseLostSetTest, ErrorsNameTheToken) {
  const v1::Layout layout = FourHostsOfFour();
  EXPECT_THAT(ParseLostSet("node-9", layout).status().message(), HasSubstr("\"node-9\""));
  EXPECT_THAT(ParseLostSet("rank:x", layout).status().message(), HasSubstr("\"rank:x\""));
  EXPECT_THAT(ParseLostSet("16", layout).status().message(), HasSubstr("rank 16"));
  EXPECT_THAT(ParseLostSet("-1", layout).status().message(), HasSubstr("rank -1"));
  EXPECT_THAT(ParseLostSet("1,,2", layout).status().message(), HasSubstr("empty entry"));
}

TEST(ParseLostSetTest, ContextParallelRanksCount) {
  v1::Layout layout = FourHostsOfFour();  // 16 slots: tp 2 x pp 2 x dp 2 x cp 2
  layout.mutable_config()->set_dp(2);
  layout.mutable_config()->set_cp(2);
  auto lost = ParseLostSet("15", layout);
  ASSERT_TRUE(lost.ok()) << lost.status();
  EXPECT_THAT(lost->ranks, ElementsAre(15));
  EXPECT_THAT(ParseLostSet("16", layout).status().message(), HasSubstr("rank 16"));
}

TEST(PlacementHostsTest, BothFormsInRankOrderOnce) {
  v1::Placement p;
  for (const char* h : {"b", "a", "b"}) {
    v1::DeviceSlot* slot = p.add_ranks();
    slot->set_host(h);
  }
  EXPECT_THAT(PlacementHosts(p), ElementsAre("b", "a"));
  EXPECT_THAT(PlacementHosts(FourHostsOfFour().placement()),
              ElementsAre("node-0", "node-1", "node-2", "node-3"));
}

TEST(FormatBytesTest, BinaryUnitsThreeDigits) {
  EXPECT_EQ(FormatBytes(0), "0 B");
  EXPECT_EQ(FormatBytes(1023), "1023 B");
  EXPECT_EQ(FormatBytes(1024), "1.00 KiB");
  EXPECT_EQ(FormatBytes(int64_t{1320702444}), "1.23 GiB");
  EXPECT_EQ(FormatBytes(int64_t{15} << 30), "15.0 GiB");
  EXPECT_EQ(FormatBytes(int64_t{150} << 30), "150 GiB");
  EXPECT_EQ(FormatBytes(int64_t{3} << 40), "3.00 TiB");
}

TEST(FormatRatioTest, HandlesZeroLowerBound) {
  EXPECT_EQ(FormatRatio(10, 10), "1.000");
  EXPECT_EQ(FormatRatio(15, 10), "1.500");
  EXPECT_EQ(FormatRatio(0, 0), "n/a");
  EXPECT_EQ(FormatRatio(5, 0), "inf");
}

TEST(FormatPlanSummaryTest, ShowsConfigsHostsAndTotals) {
  v1::TransferPlan plan;
  *plan.mutable_source_layout() = FourHostsOfFour();
  *plan.mutable_target_layout() = FourHostsOfFour();
  plan.mutable_target_layout()->mutable_config()->set_tp(4);
  plan.mutable_target_layout()->mutable_config()->set_dp(2);
  plan.add_lost_ranks(13);
  plan.add_lost_ranks(12);
  v1::PlanStats* s = plan.mutable_stats();
  s->set_bytes_local(int64_t{3} << 30);
  s->set_bytes_cross_host(int64_t{2} << 30);
  s->set_lower_bound_cross_host(int64_t{2} << 30);
  s->set_steps(42);
  s->set_cross_host_steps(7);
  v1::HostTraffic* h = s->add_hosts();
  h->set_host("node-1");
  h->set_bytes_in(int64_t{2} << 30);
  SummaryContext context;
  context.job_name = "gpt";
  context.num_layers = 24;
  const std::string text = FormatPlanSummary(context, plan);
  EXPECT_THAT(text, HasSubstr("job \"gpt\""));
  EXPECT_THAT(text, HasSubstr("12,12"));
  EXPECT_THAT(text, HasSubstr("2 old ranks (12-13)"));
  EXPECT_THAT(text, HasSubstr("node-1"));
  EXPECT_THAT(text, HasSubstr("2.00 GiB"));
  EXPECT_THAT(text, HasSubstr("1.000"));
  EXPECT_THAT(text, HasSubstr("7 cross-host"));
}

}  // namespace
}  // namespace reshard::cli
