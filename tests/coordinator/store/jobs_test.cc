// Store contract (both stores) jobs: create, read, list, delete, idempotency.
#include <google/protobuf/util/message_differencer.h>
#include <gtest/gtest.h>

#include <set>
#include <thread>

#include "planner/validate.h"
#include "tests/coordinator/store/store_fixture.h"

namespace reshard::coordinator::store_test {
namespace {

using google::protobuf::util::MessageDifferencer;

using JobsTest = StoreContractTest;

TEST_P(JobsTest, SmallSpecIsValid) {
  EXPECT_TRUE(planner::ValidateJobSpec(test_support::StoreSmallSpec("small")).ok());
}

TEST_P(JobsTest, CreateThenGetReturnsTheJobAtGenerationOne) {
  const v1::JobSpec spec = test_support::StoreSmallSpec("llama");
  absl::StatusOr<v1::Job> created = store_->CreateJob("job-1", spec, {});
  ASSERT_TRUE(created.ok()) << created.status();
  EXPECT_EQ(created->id(), "job-1");
  EXPECT_EQ(created->tenant(), "tenant-a");
  EXPECT_EQ(created->name(), "llama");
  EXPECT_EQ(created->state(), v1::JOB_STATE_ACTIVE);
  EXPECT_EQ(created->generation(), 1);
  EXPECT_TRUE(MessageDifferencer::Equals(created->layout(), spec.layout()));
  EXPECT_EQ(created->tensor_count(), 5);
  // 64*16 + 48*16 + 16*32 + 16 + 16*32 floats, plus 8 + 16 blob bytes.
  EXPECT_EQ(created->total_bytes(), (1024 + 768 + 512 + 16 + 512) * 4 + 24);
  EXPECT_GT(created->created_unix_ms(), 0);
  EXPECT_TRUE(created->active_operation_id().empty());
  EXPECT_EQ(created->lost_hosts_size(), 0);
  EXPECT_FALSE(created->has_ptc());

  absl::StatusOr<v1::Job> got = store_->GetJob("job-1", /*include_ptc=*/true);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_TRUE(MessageDifferencer::Equals(got->ptc(), spec.ptc()));
  v1::Job without_ptc = *got;
  without_ptc.clear_ptc();
  EXPECT_TRUE(MessageDifferencer::Equals(without_ptc, *created));

  absl::StatusOr<v1::Ptc> ptc = store_->GetPtc("job-1");
  ASSERT_TRUE(ptc.ok()) << ptc.status();
  EXPECT_TRUE(MessageDifferencer::Equals(*ptc, spec.ptc()));
}

// Issue 13: bucket groups, regenerable blobs and a cp layout survive the
// store (migrations/0010_ptc_buckets.sql); bucket rows go with the job.
TEST_P(JobsTest, BucketGroupsRegenerableBlobsAndContextParallelRoundTrip) {
  v1::JobSpec spec = test_support::StoreSmallSpec("fsdp");
  v1::BucketGroup* g = spec.mutable_ptc()->add_buckets();
  g->set_name("dense.master");
  g->set_reverse_order(true);
  g->set_param_align(64);
  g->set_bucket_elements(1000);
  g->set_pad_multiple(128);
  spec.mutable_ptc()->add_buckets()->set_name("fsdp.root");
  spec.mutable_ptc()->mutable_blobs(spec.ptc().blobs_size() - 1)->set_regenerable(true);
  spec.mutable_layout()->mutable_config()->set_tp(1);  // tp 1 x pp 2 x dp 1 x cp 2 = 4 ranks
  spec.mutable_layout()->mutable_config()->set_cp(2);
  ASSERT_TRUE(store_->CreateJob("job-1", spec, {}).ok());
  absl::StatusOr<v1::Ptc> ptc = store_->GetPtc("job-1");
  ASSERT_TRUE(ptc.ok()) << ptc.status();
  EXPECT_TRUE(MessageDifferencer::Equals(*ptc, spec.ptc())) << ptc->DebugString();
  absl::StatusOr<v1::Job> job = store_->GetJob("job-1", false);
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(job->layout().config().cp(), 2);
  ASSERT_TRUE(store_->DeleteJob("job-1").ok());
  if (IsPostgres()) {
    EXPECT_EQ(CountRows("SELECT count(*) FROM ptc_buckets WHERE job_id = $1", "job-1"), 0);
  }
}

TEST_P(JobsTest, MissingJobIsNotFound) {
  const absl::Status s = store_->GetJob("nope", false).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(s.message(), "job \"nope\" not found");
  EXPECT_EQ(store_->GetPtc("nope").status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(store_->SetJobState("nope", v1::JOB_STATE_DEGRADED).code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(store_->DeleteJob("nope").code(), absl::StatusCode::kNotFound);
}

TEST_P(JobsTest, SameTenantAndNameIsAlreadyExists) {
  ASSERT_TRUE(store_->CreateJob("job-1", test_support::StoreSmallSpec("llama"), {}).ok());
  const absl::Status dup =
      store_->CreateJob("job-2", test_support::StoreSmallSpec("llama"), {}).status();
  EXPECT_EQ(dup.code(), absl::StatusCode::kAlreadyExists) << dup;
  EXPECT_EQ(dup.message(), "job \"llama\" of tenant \"tenant-a\" already exists");
  // Nothing of the failed call was kept; another tenant may use the name.
  EXPECT_EQ(store_->GetJob("job-2", false).status().code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(
      store_->CreateJob("job-3", test_support::StoreSmallSpec("llama", "tenant-b"), {}).ok());
}

TEST_P(JobsTest, RetriedCreateWithTheSameKeyReturnsTheFirstJob) {
  const Idempotency key = Key("k1", "RegisterJob", "hash-1");
  absl::StatusOr<v1::Job> first =
      store_->CreateJob("job-1", test_support::StoreSmallSpec("llama"), key);
  ASSERT_TRUE(first.ok()) << first.status();
  // The retry comes with a new random job id; the first job is the answer.
  absl::StatusOr<v1::Job> again =
      store_->CreateJob("job-2", test_support::StoreSmallSpec("llama"), key);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->id(), "job-1");
  EXPECT_EQ(store_->GetJob("job-2", false).status().code(), absl::StatusCode::kNotFound);

  const absl::Status other_request = store_
                                         ->CreateJob("job-3", test_support::StoreSmallSpec("other"),
                                                     Key("k1", "RegisterJob", "hash-2"))
                                         .status();
  EXPECT_EQ(other_request.code(), absl::StatusCode::kInvalidArgument) << other_request;
  const absl::Status other_method =
      store_
          ->CreateJob("job-3", test_support::StoreSmallSpec("other"), Key("k1", "Resize", "hash-1"))
          .status();
  EXPECT_EQ(other_method.code(), absl::StatusCode::kInvalidArgument) << other_method;
}

TEST_P(JobsTest, ConcurrentCreatesWithOneKeyMakeOneJob) {
  const Idempotency key = Key("k-race", "RegisterJob", "hash");
  std::vector<absl::StatusOr<v1::Job>> results(4, absl::UnknownError("not run"));
  std::vector<std::thread> threads;
  for (size_t i = 0; i < results.size(); ++i) {
    threads.emplace_back([&, i] {
      results[i] =
          store_->CreateJob("job-" + std::to_string(i), test_support::StoreSmallSpec("llama"), key);
    });
  }
  for (std::thread& t : threads) t.join();
  std::set<std::string> ids;
  for (const auto& r : results) {
    ASSERT_TRUE(r.ok()) << r.status();
    ids.insert(r->id());
  }
  EXPECT_EQ(ids.size(), 1u);
}

TEST_P(JobsTest, ListJobsPagesInIdOrderAndFilters) {
  for (int i = 1; i <= 5; ++i) {
    ASSERT_TRUE(store_
                    ->CreateJob("a-" + std::to_string(i),
                                test_support::StoreSmallSpec("m" + std::to_string(i)), {})
                    .ok());
  }
  for (int i = 1; i <= 3; ++i) {
    ASSERT_TRUE(store_
                    ->CreateJob("b-" + std::to_string(i),
                                test_support::StoreSmallSpec("m" + std::to_string(i), "tenant-b"),
                                {})
                    .ok());
  }
  ASSERT_TRUE(store_->SetJobState("a-2", v1::JOB_STATE_DEGRADED).ok());
  ASSERT_TRUE(store_->SetJobState("b-3", v1::JOB_STATE_DEGRADED).ok());

  // Every job, two per page.
  std::vector<std::string> seen;
  ListJobsQuery q;
  q.page_size = 2;
  for (int pages = 0;; ++pages) {
    ASSERT_LT(pages, 10);
    absl::StatusOr<JobPage> page = store_->ListJobs(q);
    ASSERT_TRUE(page.ok()) << page.status();
    for (const v1::Job& j : page->jobs) seen.push_back(j.id());
    if (page->next_after_job_id.empty()) break;
    EXPECT_EQ(page->jobs.size(), 2u);
    q.after_job_id = page->next_after_job_id;
  }
  EXPECT_EQ(seen,
            (std::vector<std::string>{"a-1", "a-2", "a-3", "a-4", "a-5", "b-1", "b-2", "b-3"}));

  const auto ids = [&](const std::string& tenant, v1::JobState state) {
    ListJobsQuery f;
    f.tenant = tenant;
    f.state = state;
    std::vector<std::string> out;
    absl::StatusOr<JobPage> page = store_->ListJobs(f);
    EXPECT_TRUE(page.ok()) << page.status();
    for (const v1::Job& j : page->jobs) out.push_back(j.id());
    return out;
  };
  EXPECT_EQ(ids("tenant-b", v1::JOB_STATE_UNSPECIFIED),
            (std::vector<std::string>{"b-1", "b-2", "b-3"}));
  EXPECT_EQ(ids("", v1::JOB_STATE_DEGRADED), (std::vector<std::string>{"a-2", "b-3"}));
  EXPECT_EQ(ids("tenant-a", v1::JOB_STATE_DEGRADED), (std::vector<std::string>{"a-2"}));
  EXPECT_TRUE(ids("tenant-c", v1::JOB_STATE_UNSPECIFIED).empty());
}

TEST_P(JobsTest, CountJobsByState) {
  ASSERT_TRUE(store_->CreateJob("j1", test_support::StoreSmallSpec("m1"), {}).ok());
  ASSERT_TRUE(store_->CreateJob("j2", test_support::StoreSmallSpec("m2"), {}).ok());
  ASSERT_TRUE(store_->CreateJob("j3", test_support::StoreSmallSpec("m3"), {}).ok());
  ASSERT_TRUE(store_->SetJobState("j3", v1::JOB_STATE_DEGRADED).ok());
  absl::StatusOr<std::vector<std::pair<v1::JobState, int64_t>>> counts = store_->CountJobsByState();
  ASSERT_TRUE(counts.ok()) << counts.status();
  EXPECT_EQ(*counts, (std::vector<std::pair<v1::JobState, int64_t>>{{v1::JOB_STATE_ACTIVE, 2},
                                                                    {v1::JOB_STATE_DEGRADED, 1}}));
}

TEST_P(JobsTest, DeleteWithAnActiveOperationIsRefused) {
  const v1::JobSpec spec = test_support::StoreSmallSpec("llama");
  ASSERT_TRUE(store_->CreateJob("job-1", spec, {}).ok());
  ASSERT_TRUE(store_->CreateOperation(Resize("op-1", "job-1", 1, spec.layout())).ok());
  const absl::Status s = store_->DeleteJob("job-1");
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_EQ(s.message(), "job \"job-1\" has active operation \"op-1\" (PENDING)");
  EXPECT_TRUE(store_->GetJob("job-1", false).ok());
}

TEST_P(JobsTest, DeleteRemovesEverythingUnderTheJob) {
  const v1::JobSpec spec = test_support::StoreSmallSpec("llama");
  const v1::Layout target = test_support::MakeLayout(2, 2, 2, {"h2", "h3", "h4", "h5"}, 2);
  ASSERT_TRUE(store_->CreateJob("job-1", spec, Key("k-job", "RegisterJob", "h")).ok());
  ASSERT_TRUE(
      store_->CreateOperation(Resize("op-1", "job-1", 1, target, Key("k-op", "Resize", "h"))).ok());
  ASSERT_TRUE(store_
                  ->TransitionOperation("op-1", v1::OPERATION_STATE_PENDING,
                                        v1::OPERATION_STATE_PLANNED, {})
                  .ok());
  ASSERT_TRUE(store_->StartTransfer("op-1", {Progress("h2", v1::HOST_TASK_STATE_ASSIGNED)}).ok());
  ASSERT_TRUE(store_
                  ->TransitionOperation("op-1", v1::OPERATION_STATE_TRANSFERRING,
                                        v1::OPERATION_STATE_ABORTED, {})
                  .ok());

  ASSERT_TRUE(store_->DeleteJob("job-1").ok());
  EXPECT_EQ(store_->GetJob("job-1", false).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(store_->GetOperation("op-1", false).status().code(), absl::StatusCode::kNotFound);
  for (const char* sql : {"SELECT count(*) FROM ptc_tensors WHERE job_id = $1",
                          "SELECT count(*) FROM ptc_blobs WHERE job_id = $1",
                          "SELECT count(*) FROM generations WHERE job_id = $1",
                          "SELECT count(*) FROM generation_ranks WHERE job_id = $1",
                          "SELECT count(*) FROM operations WHERE job_id = $1",
                          "SELECT count(*) FROM operation_hosts WHERE operation_id = 'op-1' "
                          "AND $1 <> ''",
                          "SELECT count(*) FROM idempotency_keys WHERE job_id = $1"}) {
    if (IsPostgres()) {
      EXPECT_EQ(CountRows(sql, "job-1"), 0) << sql;
    }
  }
  // The name is free again, and so is the key (it went with the job).
  EXPECT_TRUE(store_->CreateJob("job-2", spec, Key("k-job", "RegisterJob", "h")).ok());
}

TEST_P(JobsTest, TextWithANulByteIsInvalidArgument) {
  const absl::Status s =
      store_->CreateJob("job-1", test_support::StoreSmallSpec(std::string("bad\0name", 8)), {})
          .status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
}

RESHARD_STORE_CONTRACT(JobsTest);

}  // namespace
}  // namespace reshard::coordinator::store_test
