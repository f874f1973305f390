#include "planner/validate.h"

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/support/job_builders.h"

namespace reshard::planner {
namespace {

using test_support::MakeLayoutOnHosts;
using test_support::SetDp;
using test_support::SetTpSplit;
using test_support::Tensor;
using ::testing::AllOf;
using ::testing::HasSubstr;

v1::JobSpec BaseJob() {
  v1::JobSpec job;
  job.set_name("job");
  job.mutable_ptc()->set_num_layers(4);
  v1::TensorSpec w = Tensor("layers.0.w", {8, 8}, v1::DTYPE_BFLOAT16);
  SetTpSplit(&w, 0);
  test_support::SetPipeline(&w, v1::PIPELINE_LAYER, 0);
  *job.mutable_ptc()->add_tensors() = w;
  *job.mutable_layout() = MakeLayoutOnHosts(2, 2, 2, 4);
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
  SetDp(job.mutable_ptc()->mutable_tensors(0), v1::DP_SPLIT, -1);
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
  SetDp(t, v1::DP_FLAT);
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

// ---- Limits (issue 9, defect 8): one over each limit is refused naming the
// field, the value and the limit; exactly at the limit is accepted.

v1::BlobSpec Blob(const std::string& name, int64_t bytes) {
  v1::BlobSpec b;
  b.set_name(name);
  b.set_size_bytes(bytes);
  b.set_scope(v1::BLOB_REPLICATED);
  return b;
}

TEST(ValidateLimitsTest, JobNameAndTenant) {
  v1::JobSpec job = BaseJob();
  job.set_name(std::string(kMaxIdBytes, 'n'));
  job.set_tenant(std::string(kMaxIdBytes, 't'));
  EXPECT_TRUE(ValidateJobSpec(job).ok()) << ValidateJobSpec(job);
  job.set_name(std::string(kMaxIdBytes + 1, 'n'));
  ExpectInvalid(job, "job name \"nnn", "is 257 bytes; the limit is 256 bytes");
  job.set_name("job");
  job.set_tenant(std::string(2700, 't'));
  ExpectInvalid(job, "tenant \"ttt", "is 2700 bytes; the limit is 256 bytes");
}

TEST(ValidateLimitsTest, TensorAndBlobNames) {
  v1::JobSpec job = BaseJob();
  job.mutable_ptc()->mutable_tensors(0)->set_name(std::string(kMaxItemNameBytes, 'w'));
  *job.mutable_ptc()->add_blobs() = Blob(std::string(kMaxItemNameBytes, 'b'), 8);
  EXPECT_TRUE(ValidateJobSpec(job).ok()) << ValidateJobSpec(job);
  job.mutable_ptc()->mutable_tensors(0)->set_name(std::string(kMaxItemNameBytes + 1, 'w'));
  ExpectInvalid(job, "ptc.tensors[0].name \"www", "is 1025 bytes; the limit is 1024 bytes");
  job.mutable_ptc()->mutable_tensors(0)->set_name("w");
  job.mutable_ptc()->mutable_blobs(0)->set_name(std::string(kMaxItemNameBytes + 1, 'b'));
  ExpectInvalid(job, "ptc.blobs[0].name \"bbb", "is 1025 bytes; the limit is 1024 bytes");
}

TEST(ValidateLimitsTest, PlacementHostName) {
  v1::JobSpec job = BaseJob();
  job.mutable_layout()->mutable_placement()->set_hosts(0, std::string(kMaxIdBytes, 'h'));
  EXPECT_TRUE(ValidateJobSpec(job).ok()) << ValidateJobSpec(job);
  job.mutable_layout()->mutable_placement()->set_hosts(0, std::string(kMaxIdBytes + 1, 'h'));
  ExpectInvalid(job, "layout.placement: rank 0 host \"hhh", "257 bytes; the limit is 256");
}

TEST(ValidateLimitsTest, TensorBytesAndElements) {
  v1::JobSpec job = BaseJob();
  v1::TensorSpec* t = job.mutable_ptc()->mutable_tensors(0);
  t->set_dtype(v1::DTYPE_INT8);
  t->clear_shape();
  t->add_shape(int64_t{1} << 20);
  t->add_shape(int64_t{1} << 20);  // 2^40 int8: at the limit
  EXPECT_TRUE(ValidateJobSpec(job).ok()) << ValidateJobSpec(job);
  t->set_shape(1, (int64_t{1} << 20) + 1);
  ExpectInvalid(job, "\"layers.0.w\"", "elements; the limit is 1099511627776");
  t->set_dtype(v1::DTYPE_FLOAT32);
  t->set_shape(1, int64_t{1} << 18);  // 2^38 elements, 2^40 bytes: at the limit
  EXPECT_TRUE(ValidateJobSpec(job).ok()) << ValidateJobSpec(job);
  t->set_shape(1, (int64_t{1} << 18) + 1);
  ExpectInvalid(job, "\"layers.0.w\"", "bytes; the limit is 1099511627776 per tensor");
}

TEST(ValidateLimitsTest, TheOverflowingJobOfTheIssueIsRefused) {
  // A tensor of 2^62 int8 plus a blob of 2^63-1 bytes used to register with
  // a negative total.
  v1::JobSpec job = BaseJob();
  v1::TensorSpec* t = job.mutable_ptc()->mutable_tensors(0);
  t->set_dtype(v1::DTYPE_INT8);
  t->clear_shape();
  t->add_shape(int64_t{1} << 31);
  t->add_shape(int64_t{1} << 31);
  ExpectInvalid(job, "\"layers.0.w\"", "elements; the limit is");
  job = BaseJob();
  *job.mutable_ptc()->add_blobs() = Blob("rng", INT64_MAX);
  ExpectInvalid(job, "blob \"rng\": size_bytes 9223372036854775807",
                "exceeds the limit of 17179869184 bytes per blob");
  job.mutable_ptc()->mutable_blobs(0)->set_size_bytes(kMaxBlobBytes);
  EXPECT_TRUE(ValidateJobSpec(job).ok()) << ValidateJobSpec(job);
}

TEST(ValidateLimitsTest, JobBytes) {
  // 4 EiB as 2^22 tensors of 1 TiB would also trip the tensor count; 1025
  // tensors of 1 TiB pass every per-tensor limit and exceed 1 PiB.
  v1::JobSpec job = BaseJob();
  job.mutable_ptc()->clear_tensors();
  for (int i = 0; i < 1025; ++i) {
    v1::TensorSpec t =
        Tensor(absl::StrCat("t", i), {int64_t{1} << 20, int64_t{1} << 20}, v1::DTYPE_INT8);
    test_support::SetPipeline(&t, v1::PIPELINE_LAYER, 0);
    *job.mutable_ptc()->add_tensors() = t;
  }
  ExpectInvalid(job, "\"t1024\"", "the limit is 1125899906842624 per job");
  job.mutable_ptc()->mutable_tensors()->RemoveLast();  // exactly 1 PiB
  EXPECT_TRUE(ValidateJobSpec(job).ok()) << ValidateJobSpec(job);
  *job.mutable_ptc()->add_blobs() = Blob("step", 8);
  ExpectInvalid(job, "blob \"step\"", "the limit is 1125899906842624 per job");
}

TEST(ValidateLimitsTest, CountsOfTensorsBlobsLayersBlocks) {
  v1::JobSpec job = BaseJob();
  job.mutable_ptc()->set_num_layers(kMaxLayers + 1);
  ExpectInvalid(job, "ptc.num_layers is 1048577", "the limit is 1048576");
  job = BaseJob();
  for (int i = 0; i <= kMaxBlobs; ++i) *job.mutable_ptc()->add_blobs() = Blob("b", 1);
  ExpectInvalid(job, "ptc has 65537 blobs", "the limit is 65536");
  job = BaseJob();
  v1::TensorSpec* t = job.mutable_ptc()->mutable_tensors(0);
  t->set_shape(0, kMaxTpBlocks + 1);
  t->mutable_partition()->mutable_tp()->clear_blocks();
  for (int i = 0; i <= kMaxTpBlocks; ++i) t->mutable_partition()->mutable_tp()->add_blocks(1);
  ExpectInvalid(job, "partition.tp.blocks has 1025 entries", "the limit is 1024");
}

TEST(ValidateLimitsTest, TensorCount) {
  v1::JobSpec job = BaseJob();
  const v1::TensorSpec t = job.ptc().tensors(0);
  job.mutable_ptc()->clear_tensors();
  job.mutable_ptc()->mutable_tensors()->Reserve(kMaxTensors + 1);
  for (int i = 0; i <= kMaxTensors; ++i) *job.mutable_ptc()->add_tensors() = t;
  ExpectInvalid(job, "ptc has 1048577 tensors", "the limit is 1048576");
}

TEST(BytesPerHostTest, SumsEachHostsRanksAndBlobs) {
  v1::JobSpec job = BaseJob();  // 8x8 bf16 split on tp 2, at layer 0; pp 2, dp 2
  *job.mutable_ptc()->add_blobs() = Blob("step", 8);
  absl::StatusOr<std::vector<HostBytes>> bytes = BytesPerHost(job.ptc(), job.layout());
  ASSERT_TRUE(bytes.ok()) << bytes.status();
  int64_t total = 0;
  for (const HostBytes& h : *bytes) total += h.bytes;
  // Stage 0 holds the tensor: 2 tp x 2 dp ranks of 4x8 bf16 (64 bytes each);
  // every one of the 8 ranks holds the blob.
  EXPECT_EQ(total, 4 * 64 + 8 * 8);
}

}  // namespace
}  // namespace reshard::planner
