// Unit tests of `reshardctl advise` / `resize --choose`: the flags become the
// AdviseRequest the coordinator reads, bad ones are usage errors naming the
// flag, and the table marks the best row. No network.
#include <string>
#include <vector>

#include "client/cli/advise_command.h"
#include "client/cli/server_commands.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace reshard::cli {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

TEST(AdviseArgsTest, FlagsFillTheRequest) {
  auto inv = ParseServerArgs(
      "advise", {"job-1",   "--gpus", "16",    "--hosts",    "h1,h2",   "--horizon",  "30m",
                 "--heads", "32",     "--seq", "2048",       "--batch", "512",        "--kv-heads",
                 "8",       "--gpu",  "H100",  "--inter-bw", "1e11",    "--gated-mlp"},
      "");
  ASSERT_TRUE(inv.ok()) << inv.status();
  auto r = AdviseRequestFromFlags(inv->flags, inv->positional[0]);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->job_id(), "job-1");
  EXPECT_EQ(r->gpus(), 16);
  EXPECT_THAT(r->hosts(), ElementsAre("h1", "h2"));
  EXPECT_EQ(r->horizon_s(), 1800);
  EXPECT_EQ(r->model().heads(), 32);
  EXPECT_EQ(r->model().kv_heads(), 8);
  EXPECT_EQ(r->model().seq_length(), 2048);
  EXPECT_EQ(r->model().global_batch(), 512);
  EXPECT_TRUE(r->model().gated_mlp());
  EXPECT_FALSE(r->model().distributed_optimizer());
  EXPECT_EQ(r->model().hidden(), 0);  // the coordinator takes it from the PTC
  EXPECT_EQ(r->devices().gpu_type(), "H100");
  EXPECT_EQ(r->devices().inter_host_bytes_per_s(), 1e11);
}

TEST(AdviseArgsTest, UsageErrorsNameTheFlag) {
  const std::vector<std::pair<std::vector<std::string>, std::string>> cases = {
      {{"job-1"}, "missing --gpus"},
      {{"job-1", "--gpus", "0"}, "--gpus \"0\": expected a positive integer"},
      {{"job-1", "--gpus", "8", "--heads", "x"}, "--heads \"x\""},
      {{"job-1", "--gpus", "8", "--horizon", "0s"}, "--horizon \"0s\""},
      {{"job-1", "--gpus", "8", "--inter-bw", "fast"}, "--inter-bw \"fast\""},
      {{"job-1", "--gpus", "8", "--hosts", "h1,,h2"}, "--hosts \"h1,,h2\""},
  };
  for (const auto& [args, message] : cases) {
    auto inv = ParseServerArgs("advise", args, "");
    EXPECT_FALSE(inv.ok()) << args.size();
    EXPECT_THAT(inv.status().message(), HasSubstr(message));
  }
  // resize: exactly one of --to and --choose; --choose needs --gpus.
  EXPECT_THAT(ParseServerArgs("resize", {"j"}, "").status().message(), HasSubstr("--to"));
  EXPECT_THAT(ParseServerArgs("resize", {"j", "--to", "t.json", "--choose"}, "").status().message(),
              HasSubstr("either --to"));
  EXPECT_THAT(ParseServerArgs("resize", {"j", "--choose"}, "").status().message(),
              HasSubstr("missing --gpus"));
  EXPECT_THAT(
      ParseServerArgs("resize", {"j", "--to", "t.json", "--heads", "4"}, "").status().message(),
      HasSubstr("--heads: only with --choose"));
  EXPECT_TRUE(ParseServerArgs("resize", {"j", "--choose", "--gpus", "8"}, "").ok());
}

TEST(AdviseFormatTest, TableMarksTheBestAndSaysWhyARowIsUnreachable) {
  v1::AdviseResponse a;
  a.add_hosts("h0");
  a.add_host_devices(8);
  a.set_gpu_type("A100");
  a.set_horizon_s(3600);
  a.set_considered(10);
  a.set_feasible(4);
  a.set_best(1);
  v1::AdviseCandidate* fast = a.add_candidates();
  fast->set_tp(1);
  fast->set_pp(1);
  fast->set_dp(8);
  fast->set_micro_batch(2);
  fast->set_recompute("none");
  fast->set_step_seconds(0.5);
  fast->set_memory_bytes(70.0 * (1 << 30));
  fast->set_reconfig_error("target.config.dp 8 leaves a dp rank without elements");
  v1::AdviseCandidate* best = a.add_candidates();
  best->set_tp(2);
  best->set_pp(1);
  best->set_dp(4);
  best->set_micro_batch(1);
  best->set_recompute("selective");
  best->set_step_seconds(0.6);
  best->set_memory_bytes(40.0 * (1 << 30));
  best->set_reconfig_priced(true);
  best->set_cross_host_bytes(int64_t{3} << 30);
  best->set_transfer_seconds(2.5);
  best->set_steps_in_horizon(5995.8);
  const std::string table = FormatAdviceTable(a);
  EXPECT_THAT(table, HasSubstr("offer: h0 x 8 (A100)"));
  EXPECT_THAT(table, HasSubstr("10 layouts considered, 4 fit"));
  EXPECT_THAT(table, HasSubstr("\n     1    1    8    2 none"));
  EXPECT_THAT(table, HasSubstr("\n*    2    1    4    1 selective"));
  EXPECT_THAT(table, HasSubstr("3.00 GiB"));
  EXPECT_THAT(table, HasSubstr("2.5 s"));
  EXPECT_THAT(table, HasSubstr("row 1 (tp 1, pp 1, dp 8): not reachable: target.config.dp 8"));
}

}  // namespace
}  // namespace reshard::cli
