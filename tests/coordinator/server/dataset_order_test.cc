// The order of concurrent CommitStep and Checkpoint calls against the real
// reshard-coordinator and a real PostgreSQL (issue 19, defect 3;
// docs/data.md, "One cursor per model state"): while a checkpoint (a plain
// one or a stop-free operation's cut-over) publishes the model state of
// step s into a new generation, a CommitStep of a later step on the current
// generation is refused with FAILED_PRECONDITION naming the checkpoint,
// the checkpoint's commit gives its generation exactly step s's cursor, and
// a run resumed from that generation reads every sample of the epoch
// exactly once (the model's samples: the steps the checkpoint holds and the
// steps trained after the resume). Before the fix the later step was
// accepted, the checkpoint's generation kept its cursor and the samples of
// the steps between were never read.
#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/data/data_share.h"
#include "grpcpp/grpcpp.h"
#include "tests/coordinator/harness/eventually.h"
#include "tests/coordinator/server/server_fixture.h"
#include "tests/support/jobs.h"

namespace reshard::coordinator::testing {
namespace {

using test_support::GptJobSpec;
using test_support::MakeLayout;

constexpr int64_t kSamples = 32;  // one epoch is four steps
constexpr int64_t kBatch = 8;
constexpr int kDp = 2;

const data::Order& TheOrder() {
  static const data::Order order{20261123, data::Shuffle::kFull, 0};
  return order;
}

v1::DatasetState Dataset() {
  v1::DatasetState d;
  d.mutable_dataset()->set_id("order-corpus");
  d.mutable_dataset()->set_num_samples(kSamples);
  d.mutable_dataset()->set_fingerprint("sha1:0123");
  d.mutable_order()->set_seed(TheOrder().seed);
  d.mutable_order()->set_shuffle(v1::SHUFFLE_FULL);
  d.set_global_batch(kBatch);
  return d;
}

/// The sample ids every data-parallel rank reads in the step that starts at
/// `cursor` (the C++ twin of reshard.data's shares).
std::vector<uint64_t> ReadStep(int64_t cursor) {
  std::vector<uint64_t> ids;
  for (int rank = 0; rank < kDp; ++rank) {
    absl::StatusOr<data::RankShare> share = data::Share(kSamples, cursor, kBatch, kDp, rank, 0);
    EXPECT_TRUE(share.ok()) << share.status();
    if (!share.ok()) continue;
    for (uint64_t i = share->range.begin; i < share->range.end; ++i) {
      ids.push_back(data::SampleAt(kSamples, TheOrder(), i));
    }
  }
  return ids;
}

class DatasetOrderTest : public AdminServerTest {
 protected:
  v1::Job RegisterWithData(const std::string& name) {
    v1::RegisterJobRequest r;
    *r.mutable_spec() = GptJobSpec(name, "team-a");
    *r.mutable_dataset_state() = Dataset();
    v1::RegisterJobResponse reply;
    const grpc::Status s = admin_->RegisterJob(Ctx().get(), r, &reply);
    EXPECT_TRUE(s.ok()) << s.error_message();
    return reply.job();
  }

  grpc::Status Commit(const std::string& job_id, int64_t generation, int64_t step,
                      v1::DatasetState* reply = nullptr) {
    v1::CommitStepRequest r;
    r.set_job_id(job_id);
    r.set_generation(generation);
    r.set_step(step);
    r.set_cursor(step * kBatch);
    r.set_layout_fingerprint(fingerprint_);
    v1::DatasetState ignored;
    return admin_->CommitStep(Ctx().get(), r, reply != nullptr ? reply : &ignored);
  }

  /// Checkpoint of `generation` carrying step `step` (cut over
  /// `cut_over` when not empty).
  v1::Operation CheckpointStep(const std::string& job_id, int64_t generation, int64_t step,
                               const std::string& cut_over = "") {
    v1::CheckpointRequest r;
    r.set_job_id(job_id);
    r.set_expected_generation(generation);
    r.set_with_step(true);
    r.set_step(step);
    r.set_cursor(step * kBatch);
    r.set_layout_fingerprint(fingerprint_);
    if (!cut_over.empty()) r.set_cut_over_operation_id(cut_over);
    v1::Operation op;
    const grpc::Status s = admin_->Checkpoint(Ctx().get(), r, &op);
    EXPECT_TRUE(s.ok()) << s.error_message();
    return op;
  }

  /// A run resumed from the job's committed dataset state trains to the end
  /// of the epoch, committing each step on `generation`; appends what it
  /// reads to `model_read`.
  void ResumeToEpochEnd(const std::string& job_id, int64_t generation,
                        std::vector<uint64_t>* model_read) {
    const v1::Job job = GetJob(admin_.get(), job_id);
    ASSERT_EQ(job.generation(), generation);
    int64_t step = job.dataset_state().step();
    for (int64_t cursor = job.dataset_state().cursor(); cursor < kSamples; cursor += kBatch) {
      const std::vector<uint64_t> ids = ReadStep(cursor);
      model_read->insert(model_read->end(), ids.begin(), ids.end());
      const grpc::Status s = Commit(job_id, generation, ++step);
      ASSERT_TRUE(s.ok()) << s.error_message();
    }
  }

  static void ExpectEverySampleOnce(std::vector<uint64_t> read) {
    std::sort(read.begin(), read.end());
    std::vector<uint64_t> epoch(kSamples);
    for (int64_t i = 0; i < kSamples; ++i) epoch[i] = static_cast<uint64_t>(i);
    EXPECT_EQ(read, epoch) << "the model's samples over one epoch: every sample exactly once";
  }

  std::string fingerprint_;
};

TEST_F(DatasetOrderTest, ACheckpointCommitsTheCursorPublishedWithItsStep) {
  StartAgents({"h0", "h1"}, coordinator_->address());
  const v1::Job job = RegisterWithData("checkpointed");
  fingerprint_ = job.dataset_state().layout_fingerprint();
  ASSERT_FALSE(fingerprint_.empty());

  // Steps 1 and 2 train; step 1 is committed on generation 1, step 2's
  // model state goes into a checkpoint that the agents hold in TRANSFERRING.
  std::vector<uint64_t> model_read = ReadStep(0);
  grpc::Status s = Commit(job.id(), 1, 1);
  ASSERT_TRUE(s.ok()) << s.error_message();
  const std::vector<uint64_t> step2 = ReadStep(kBatch);
  model_read.insert(model_read.end(), step2.begin(), step2.end());
  HoldAgents(true);
  const v1::Operation checkpoint = CheckpointStep(job.id(), 1, 2);
  ASSERT_EQ(checkpoint.to_generation(), 2);
  ASSERT_TRUE(WaitState(admin_.get(), checkpoint.id(), v1::OPERATION_STATE_TRANSFERRING).ok());

  // A retried commit of the committed step still answers OK (UNAVAILABLE
  // is retried): it moves nothing.
  v1::DatasetState state;
  s = Commit(job.id(), 1, 1, &state);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(state.step(), 1);
  // The loop trains step 3 and commits it while the checkpoint is pending.
  ReadStep(2 * kBatch);  // read, and read again after the resume
  s = Commit(job.id(), 1, 3);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::FAILED_PRECONDITION) << s.error_message();
  EXPECT_NE(s.error_message().find(absl::StrCat(
                "checkpoint operation \"", checkpoint.id(),
                "\" (TRANSFERRING) publishes step 2 (cursor 16) into generation 2; step 3 "
                "(cursor 24) cannot be committed on generation 1")),
            std::string::npos)
      << s.error_message();
  EXPECT_EQ(GetJob(admin_.get(), job.id()).dataset_state().step(), 1);

  HoldAgents(false);
  absl::StatusOr<v1::Operation> done = WaitFinal(admin_.get(), checkpoint.id());
  ASSERT_TRUE(done.ok()) << done.status();
  ASSERT_EQ(done->state(), v1::OPERATION_STATE_COMMITTED) << done->error();

  // Generation 2 holds step 2's model state, and exactly step 2's cursor.
  const v1::Job after = GetJob(admin_.get(), job.id());
  ASSERT_EQ(after.generation(), 2);
  EXPECT_EQ(after.dataset_state().step(), 2);
  EXPECT_EQ(after.dataset_state().cursor(), 2 * kBatch);
  EXPECT_EQ(after.dataset_state().committed_generation(), 2);
  // The old generation refuses; the run reloads and resumes from step 2.
  s = Commit(job.id(), 1, 3);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::FAILED_PRECONDITION) << s.error_message();
  EXPECT_NE(s.error_message().find("not the current generation 2"), std::string::npos)
      << s.error_message();
  ResumeToEpochEnd(job.id(), 2, &model_read);
  ExpectEverySampleOnce(model_read);
}

TEST_F(DatasetOrderTest, AStopFreeCutOverCommitsTheCursorOfItsStep) {
  StartAgents({"h0", "h1", "h2"}, coordinator_->address());
  const v1::Job job = RegisterWithData("stop-free");
  fingerprint_ = job.dataset_state().layout_fingerprint();

  // The old layout trains and commits step 1 while the new one prepares.
  std::vector<uint64_t> model_read = ReadStep(0);
  grpc::Status s = Commit(job.id(), 1, 1);
  ASSERT_TRUE(s.ok()) << s.error_message();
  const v1::Layout target = MakeLayout(2, 2, 2, {"h1", "h2"}, 4);
  const v1::Operation op = Resize(admin_.get(), job.id(), 1, target, /*stop_free=*/true);
  ASSERT_FALSE(op.id().empty());
  ASSERT_TRUE(Eventually(
      [&] { return GetOperation(admin_.get(), op.id()).agents_prepared_unix_ms() > 0; },
      absl::Seconds(30)));
  ASSERT_GT(MarkPrepared(admin_.get(), op.id()).prepared_unix_ms(), 0);
  // Before the cut-over the old generation still commits its steps.
  const std::vector<uint64_t> step2 = ReadStep(kBatch);
  model_read.insert(model_read.end(), step2.begin(), step2.end());
  s = Commit(job.id(), 1, 2);
  ASSERT_TRUE(s.ok()) << s.error_message();

  // Step 3 ends at the cut-over: its model state goes into the cut-over
  // checkpoint, which the agents hold.
  const std::vector<uint64_t> step3 = ReadStep(2 * kBatch);
  model_read.insert(model_read.end(), step3.begin(), step3.end());
  HoldAgents(true);
  const v1::Operation cut = CheckpointStep(job.id(), 1, 3, op.id());
  ASSERT_EQ(cut.to_generation(), 2);
  ASSERT_TRUE(WaitState(admin_.get(), cut.id(), v1::OPERATION_STATE_TRANSFERRING).ok());
  // A rank that has not seen the cut-over yet trains step 4 and commits it.
  ReadStep(3 * kBatch);
  s = Commit(job.id(), 1, 4);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::FAILED_PRECONDITION) << s.error_message();
  EXPECT_NE(s.error_message().find(absl::StrCat("checkpoint operation \"", cut.id(),
                                                "\" (TRANSFERRING) publishes step 3 (cursor 24) "
                                                "into generation 2; step 4 (cursor 32)")),
            std::string::npos)
      << s.error_message();

  HoldAgents(false);
  absl::StatusOr<v1::Operation> cut_done = WaitFinal(admin_.get(), cut.id());
  ASSERT_TRUE(cut_done.ok()) << cut_done.status();
  ASSERT_EQ(cut_done->state(), v1::OPERATION_STATE_COMMITTED) << cut_done->error();
  absl::StatusOr<v1::Operation> done = WaitFinal(admin_.get(), op.id());
  ASSERT_TRUE(done.ok()) << done.status();
  ASSERT_EQ(done->state(), v1::OPERATION_STATE_COMMITTED) << done->error();

  // The new layout's generation 3 moved the cut-over's state: step 3's
  // model and step 3's cursor.
  const v1::Job after = GetJob(admin_.get(), job.id());
  ASSERT_EQ(after.generation(), 3);
  EXPECT_EQ(after.dataset_state().step(), 3);
  EXPECT_EQ(after.dataset_state().cursor(), 3 * kBatch);
  EXPECT_EQ(after.dataset_state().committed_generation(), 2);
  ResumeToEpochEnd(job.id(), 3, &model_read);
  ExpectEverySampleOnce(model_read);
}

}  // namespace
}  // namespace reshard::coordinator::testing
