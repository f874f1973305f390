#include "planner/validate.h"

#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/planner/test_specs.h"

namespace reshard::planner {
namespace {

using ::testing::AllOf;
using testing::Dp;
using ::testing::HasSubstr;
using testing::MakeLayout;
using testing::Tensor;
using testing::TpSplit;

v1::JobSpec BaseJob() {
  v1::JobSpec job;
  job.set_name("job");
  job.mutable_ptc()->set_num_layers(4);
  v1::TensorSpec w = Tensor("layers.0.w", {8, 8}, v1::DTYPE_BFLOAT16);
  TpSplit(w, 0);
  testing::AtLayer(w, 0);
  *job.mutable_ptc()->add_tensors() = w;
  *job.mutable_layout() = MakeLayout(2, 2, 2, 4);
  return job;
}

// Asserts InvalidArgument with every fragment in the message.
void ExpectInvalid(const v1::JobSpec& job, const std::string& a, const std::string& b = "") {
  const absl::Status s = ValidateJobSpec(job);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_THAT(std::string(s.message()), AllOf(HasSubstr(a), HasSubstr(b)));
}

TEST(ValidateTest, BaseJobIsValid) { EXPECT_TRUE(ValidateJobSpec(BaseJob()).ok()); }

TEST(ValidateTest, DuplicateName) {
  v1::JobSpec job = BaseJob();
  *job.mutable_ptc()->add_tensors() = job.ptc().tensors(0);
  ExpectInvalid(job, "\"layers.0.w\"", "duplicate");
}

TEST(ValidateTest, UnknownDtype) {
  v1::JobSpec job = BaseJob();
  job.mutable_ptc()->mutable_tensors(0)->set_dtype(static_cast<v1::DType>(99));
  ExpectInvalid(job, "\"layers.0.w\"", "dtype 99");
  job.mutable_ptc()->mutable_tensors(0)->set_dtype(v1::DTYPE_UNSPECIFIED);
  ExpectInvalid(job, "\"layers.0.w\"", "dtype 0");
}

TEST(ValidateTest, ZeroAndNegativeDims) {
  v1::JobSpec job = BaseJob();
  job.mutable_ptc()->mutable_tensors(0)->set_shape(1, 0);
  ExpectInvalid(job, "shape[1] is 0");
  job.mutable_ptc()->mutable_tensors(0)->set_shape(1, -3);
  ExpectInvalid(job, "shape[1] is -3");
}

TEST(ValidateTest, SplitAxisOutOfRange) {
  v1::JobSpec job = BaseJob();
  job.mutable_ptc()->mutable_tensors(0)->mutable_partition()->mutable_tp()->set_axis(2);
  ExpectInvalid(job, "partition.tp.axis 2 out of range for a rank-2 tensor");
  job = BaseJob();
  Dp(*job.mutable_ptc()->mutable_tensors(0), v1::DP_SPLIT, -1);
  ExpectInvalid(job, "partition.dp.axis -1");
}

TEST(ValidateTest, BlocksNotSummingToAxis) {
  v1::JobSpec job = BaseJob();
  auto* tp = job.mutable_ptc()->mutable_tensors(0)->mutable_partition()->mutable_tp();
  tp->add_blocks(4);
  tp->add_blocks(2);
  ExpectInvalid(job, "blocks [4, 2] sum to 6 but shape[0] is 8");
}

TEST(ValidateTest, LayerBeyondLayerCount) {
  v1::JobSpec job = BaseJob();
  job.mutable_ptc()->mutable_tensors(0)->mutable_partition()->mutable_pipeline()->set_layer(4);
  ExpectInvalid(job, "partition.pipeline.layer 4 is beyond the layer count 4");
}

TEST(ValidateTest, UnspecifiedPipeline) {
  v1::JobSpec job = BaseJob();
  job.mutable_ptc()->mutable_tensors(0)->mutable_partition()->mutable_pipeline()->set_mode(
      v1::PIPELINE_UNSPECIFIED);
  ExpectInvalid(job, "partition.pipeline.mode is unspecified");
}

TEST(ValidateTest, StageBoundariesMustCoverLayers) {
  v1::JobSpec job = BaseJob();
  job.mutable_layout()->mutable_config()->add_stage_starts(0);
  ExpectInvalid(job, "stage_starts has 1 entries but pp is 2");
  job.mutable_layout()->mutable_config()->add_stage_starts(4);
  ExpectInvalid(job, "stage_starts[1] is 4");
  job.mutable_layout()->mutable_config()->set_stage_starts(0, 1);
  job.mutable_layout()->mutable_config()->set_stage_starts(1, 2);
  ExpectInvalid(job, "stage_starts[0] is 1");
}

TEST(ValidateTest, WorldMustMatchPlacement) {
  v1::JobSpec job = BaseJob();
  job.mutable_layout()->mutable_config()->set_dp(3);
  ExpectInvalid(job, "2 hosts x 4 devices = 8 slots but tp*pp*dp = 12");
  job = BaseJob();
  job.mutable_layout()->mutable_placement()->clear_hosts();
  job.mutable_layout()->mutable_placement()->set_devices_per_host(0);
  auto* slot = job.mutable_layout()->mutable_placement()->add_ranks();
  slot->set_host("a");
  ExpectInvalid(job, "placement has 1 ranks but tp*pp*dp = 2*2*2 = 8");
}

TEST(ValidateTest, TwoRanksOnOneDevice) {
  v1::JobSpec job = BaseJob();
  job.mutable_layout()->mutable_placement()->set_hosts(1, "h0");
  ExpectInvalid(job, "ranks 0 and 4 share host \"h0\" device 0");
}

TEST(ValidateTest, SplitThatLeavesRankEmpty) {
  v1::JobSpec job = BaseJob();
  job.mutable_ptc()->mutable_tensors(0)->set_shape(0, 1);
  ExpectInvalid(job, "\"layers.0.w\"", "leaves tp rank 1 without elements");
  job.mutable_ptc()->mutable_tensors(0)->mutable_partition()->set_allow_empty(true);
  EXPECT_TRUE(ValidateJobSpec(job).ok());
  job = BaseJob();
  v1::TensorSpec* t = job.mutable_ptc()->mutable_tensors(0);
  t->set_shape(1, 1);
  Dp(*t, v1::DP_FLAT);
  job.mutable_layout()->mutable_config()->set_dp(8);
  job.mutable_layout()->mutable_placement()->add_hosts("h2");
  job.mutable_layout()->mutable_placement()->add_hosts("h3");
  job.mutable_layout()->mutable_placement()->add_hosts("h4");
  job.mutable_layout()->mutable_placement()->add_hosts("h5");
  job.mutable_layout()->mutable_placement()->add_hosts("h6");
  job.mutable_layout()->mutable_placement()->add_hosts("h7");
  ExpectInvalid(job, "layout.config.dp 8 leaves a dp rank without elements");
}

TEST(ValidateTest, ByteSizeOverflow) {
  v1::JobSpec job = BaseJob();
  v1::TensorSpec* t = job.mutable_ptc()->mutable_tensors(0);
  t->set_shape(0, int64_t{1} << 40);
  t->set_shape(1, int64_t{1} << 30);
  ExpectInvalid(job, "overflows a 64-bit byte size");
}

TEST(ValidateTest, BadConfigValues) {
  v1::JobSpec job = BaseJob();
  job.mutable_layout()->mutable_config()->set_tp(0);
  ExpectInvalid(job, "layout.config.tp is 0");
  job = BaseJob();
  job.mutable_layout()->mutable_config()->set_pp(5);
  ExpectInvalid(job, "layout.config.pp 5 exceeds num_layers 4");
}

TEST(ValidateTest, Blobs) {
  v1::JobSpec job = BaseJob();
  auto* b = job.mutable_ptc()->add_blobs();
  b->set_name("layers.0.w");
  b->set_size_bytes(8);
  ExpectInvalid(job, "blob \"layers.0.w\": duplicate name");
  b->set_name("step");
  b->set_size_bytes(0);
  ExpectInvalid(job, "blob \"step\": size_bytes 0");
}

}  // namespace
}  // namespace reshard::planner
