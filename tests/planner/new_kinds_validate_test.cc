// Validation of the fields of issue 13: each refusal is INVALID_ARGUMENT
// naming the tensor (or layout), the field and its value.
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "planner/validate.h"
#include "tests/support/job_builders.h"

namespace reshard::planner {
namespace {

using test_support::MakeLayoutOnHosts;
using test_support::SetTpSplit;
using test_support::Tensor;
using ::testing::AllOf;
using ::testing::HasSubstr;

v1::JobSpec Job() {
  v1::JobSpec job;
  job.set_name("job");
  job.mutable_ptc()->set_num_layers(4);
  v1::TensorSpec emb = Tensor("emb", {50, 8});
  SetTpSplit(&emb, 0);
  *job.mutable_ptc()->add_tensors() = emb;
  *job.mutable_layout() = MakeLayoutOnHosts(2, 2, 2, 4);
  return job;
}

v1::TensorSpec* Emb(v1::JobSpec& job) { return job.mutable_ptc()->mutable_tensors(0); }

void ExpectInvalid(const v1::JobSpec& job, const std::string& a, const std::string& b = "") {
  const absl::Status s = ValidateJobSpec(job);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_THAT(std::string(s.message()), AllOf(HasSubstr(a), HasSubstr(b)));
}

TEST(NewKindsValidateTest, BaseIsValid) { EXPECT_TRUE(ValidateJobSpec(Job()).ok()); }

TEST(NewKindsValidateTest, Padding) {
  v1::JobSpec job = Job();
  Emb(job)->mutable_partition()->mutable_padding()->set_multiple(0);
  ExpectInvalid(job, "tensor \"emb\": partition.padding.multiple 0 must be >= 1");
  Emb(job)->mutable_partition()->mutable_padding()->set_multiple(4);
  Emb(job)->mutable_partition()->mutable_padding()->set_axis(2);
  ExpectInvalid(job, "tensor \"emb\": partition.padding.axis 2 out of range");
  Emb(job)->mutable_partition()->mutable_padding()->set_axis(0);
  EXPECT_TRUE(ValidateJobSpec(job).ok());
  // Held shape [2^40, 8] at tp 2 is over the element limit.
  Emb(job)->mutable_partition()->mutable_padding()->set_multiple(int64_t{1} << 39);
  Emb(job)->mutable_partition()->mutable_padding()->set_times_tp(true);
  ExpectInvalid(job, "\"emb\"", "partition.padding.multiple 549755813888 at layout.config.tp 2");
  Emb(job)->mutable_partition()->mutable_padding()->set_multiple(4);
  Emb(job)->mutable_partition()->mutable_tp()->add_blocks(25);
  Emb(job)->mutable_partition()->mutable_tp()->add_blocks(25);
  ExpectInvalid(job, "\"emb\"", "partition.padding is set with partition.tp.blocks [25, 25]");
  Emb(job)->mutable_partition()->mutable_tp()->clear_blocks();
  Emb(job)->mutable_partition()->mutable_tp()->set_granularity(2);
  ExpectInvalid(job, "\"emb\"", "partition.tp.granularity 2");
}

TEST(NewKindsValidateTest, GranularityAndReplication) {
  v1::JobSpec job = Job();
  SetTpSplit(Emb(job), 0, {30, 20});
  Emb(job)->mutable_partition()->mutable_tp()->set_granularity(4);
  ExpectInvalid(job, "\"emb\"",
                "partition.tp.blocks[0] 30 is not a multiple of partition.tp.granularity 4");
  Emb(job)->mutable_partition()->mutable_tp()->set_granularity(-1);
  ExpectInvalid(job, "\"emb\"", "partition.tp.granularity -1 must be >= 0");
  // 3 units of 10 at tp 4: fewer than tp and not dividing it.
  Emb(job)->mutable_partition()->mutable_tp()->set_granularity(10);
  job.mutable_layout()->mutable_config()->set_tp(4);
  job.mutable_layout()->mutable_config()->set_dp(1);
  ExpectInvalid(job, "\"emb\"",
                "partition.tp.blocks[0] has 3 units of 10, fewer than layout.config.tp 4");
  // 4 units, then 1 unit replicated on all 4 ranks.
  Emb(job)->mutable_partition()->mutable_tp()->set_blocks(0, 40);
  Emb(job)->mutable_partition()->mutable_tp()->set_blocks(1, 10);
  EXPECT_TRUE(ValidateJobSpec(job).ok()) << ValidateJobSpec(job);
}

TEST(NewKindsValidateTest, Experts) {
  v1::JobSpec job = Job();
  Emb(job)->mutable_partition()->mutable_expert()->set_axis(0);
  ExpectInvalid(job, "\"emb\"", "partition.expert.axis 0 equals partition.tp.axis");
  Emb(job)->mutable_partition()->mutable_expert()->set_axis(1);
  EXPECT_TRUE(ValidateJobSpec(job).ok()) << ValidateJobSpec(job);
  Emb(job)->mutable_partition()->mutable_padding()->set_axis(1);
  Emb(job)->mutable_partition()->mutable_padding()->set_multiple(3);
  ExpectInvalid(job, "\"emb\"", "partition.padding.axis 1 equals partition.expert.axis");
  Emb(job)->mutable_partition()->clear_padding();
  // tp 2 x dp 2 = 4 ranks per stage; expert_tp 1 x ep 3 does not divide it.
  job.mutable_layout()->mutable_config()->set_ep(3);
  job.mutable_layout()->mutable_config()->set_expert_tp(1);
  ExpectInvalid(job, "layout.config: tp*cp*dp = 4 is not a multiple of expert_tp*ep = 1*3 = 3");
  // 8 experts over ep 4: 2 each.
  job.mutable_layout()->mutable_config()->set_ep(4);
  EXPECT_TRUE(ValidateJobSpec(job).ok()) << ValidateJobSpec(job);
  // 3 experts over ep 4: expert rank 3 holds none.
  Emb(job)->set_shape(1, 3);
  ExpectInvalid(job, "\"emb\"", "leaves expert rank 3");
  Emb(job)->mutable_partition()->set_allow_empty(true);
  EXPECT_TRUE(ValidateJobSpec(job).ok());
  job.mutable_layout()->mutable_config()->set_ep(-1);
  ExpectInvalid(job, "layout.config.ep is -1");
}

TEST(NewKindsValidateTest, PipelineModesAndInterleavedStages) {
  v1::JobSpec job = Job();
  v1::Pipeline* p = Emb(job)->mutable_partition()->mutable_pipeline();
  p->set_mode(v1::PIPELINE_LAYERS);
  ExpectInvalid(job, "\"emb\"", "partition.pipeline.layers is empty");
  p->add_layers(1);
  p->add_layers(4);
  ExpectInvalid(job, "\"emb\"", "partition.pipeline.layers[1] 4 is outside [0, 4)");
  p->set_layers(1, 3);
  EXPECT_TRUE(ValidateJobSpec(job).ok());
  p->set_mode(v1::PIPELINE_FIRST_AND_LAST_STAGE);
  EXPECT_TRUE(ValidateJobSpec(job).ok());
  v1::ParallelConfig* c = job.mutable_layout()->mutable_config();
  c->set_vpp(2);
  EXPECT_TRUE(ValidateJobSpec(job).ok());
  c->add_stage_starts(0);
  c->add_stage_starts(2);
  ExpectInvalid(job, "layout.config.stage_starts has 2 entries but pp*vpp is 2*2 = 4");
  c->add_stage_starts(3);
  c->add_stage_starts(3);
  ExpectInvalid(job, "layout.config.stage_starts[3] is 3");
  c->set_stage_starts(2, 1);
  ExpectInvalid(job, "layout.config.stage_starts[2] is 1");
  c->set_stage_starts(1, 1);
  c->set_stage_starts(2, 2);
  EXPECT_TRUE(ValidateJobSpec(job).ok()) << ValidateJobSpec(job);
}

TEST(NewKindsValidateTest, ContextParallelWorld) {
  v1::JobSpec job = Job();
  job.mutable_layout()->mutable_config()->set_cp(2);
  ExpectInvalid(job, "2 hosts x 4 devices = 8 slots but tp*cp*dp*pp = 16");
  job.mutable_layout()->mutable_placement()->add_hosts("h2");
  job.mutable_layout()->mutable_placement()->add_hosts("h3");
  EXPECT_TRUE(ValidateJobSpec(job).ok());
}

TEST(NewKindsValidateTest, DpChunkAndBuckets) {
  v1::JobSpec job = Job();
  test_support::SetDp(Emb(job), v1::DP_CHUNK, 2);
  ExpectInvalid(job, "\"emb\"", "partition.dp.axis 2 out of range");
  test_support::SetDp(Emb(job), v1::DP_CHUNK, 1);
  EXPECT_TRUE(ValidateJobSpec(job).ok());
  // 8 columns in chunks of ceil(8 / 8) over dp 8: fine; 3 columns over dp
  // 4: chunks of 1, the last rank empty.
  Emb(job)->set_shape(1, 3);
  job.mutable_layout()->mutable_config()->set_dp(4);
  job.mutable_layout()->mutable_placement()->add_hosts("h2");
  job.mutable_layout()->mutable_placement()->add_hosts("h3");
  ExpectInvalid(job, "\"emb\"", "layout.config.dp 4 leaves a dp rank without elements");
  Emb(job)->set_shape(1, 8);
  Emb(job)->mutable_partition()->mutable_dp()->set_mode(v1::DP_BUCKET);
  Emb(job)->mutable_partition()->mutable_dp()->set_bucket("opt");
  ExpectInvalid(job, "\"emb\"", "partition.dp.bucket \"opt\" names no group of ptc.buckets");
  v1::BucketGroup* g = job.mutable_ptc()->add_buckets();
  g->set_name("opt");
  EXPECT_TRUE(ValidateJobSpec(job).ok()) << ValidateJobSpec(job);
  g->set_param_align(-64);
  ExpectInvalid(job, "ptc.buckets[0] \"opt\": param_align -64");
  g->set_param_align(64);
  // Members all dense or all expert.
  v1::TensorSpec experts = Tensor("experts", {4, 8, 2});
  experts.mutable_partition()->mutable_expert()->set_axis(0);
  experts.mutable_partition()->mutable_dp()->set_mode(v1::DP_BUCKET);
  experts.mutable_partition()->mutable_dp()->set_bucket("opt");
  *job.mutable_ptc()->add_tensors() = experts;
  ExpectInvalid(job, "\"experts\"", "bucket group \"opt\" already has dense member \"emb\"");
  job.mutable_ptc()->add_buckets()->set_name("opt");
  ExpectInvalid(job, "ptc.buckets[1] \"opt\": duplicate bucket group name");
  // A bucket name with another mode.
  v1::JobSpec other = Job();
  Emb(other)->mutable_partition()->mutable_dp()->set_bucket("opt");
  ExpectInvalid(other, "\"emb\"",
                "partition.dp.bucket \"opt\" given but partition.dp.mode is not DP_BUCKET");
}

}  // namespace
}  // namespace reshard::planner
