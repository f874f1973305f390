// SchedulerApi against a real PostgreSQL, jobs and hosts: RegisterJob (every
// class of validation error, size limit, duplicates, idempotent retry),
// GetJob, ListJobs paging and filters, DeleteJob, ListHosts.
#include <set>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "google/protobuf/util/message_differencer.h"
#include "gtest/gtest.h"
#include "services/coordinator/logic/ids.h"
#include "tests/coordinator/logic/logic_fixture.h"
#include "tests/support/jobs.h"

namespace reshard::coordinator::testing {
namespace {

using ::google::protobuf::util::MessageDifferencer;
using test_support::MakeLayout;
using test_support::TwoLayerJob;

class SchedulerJobsTest : public LogicTest {};

TEST_P(SchedulerJobsTest, RegisterJobCreatesGenerationOne) {
  const v1::JobSpec spec = TwoLayerJob("gpt-small");
  const v1::Job job = Register(spec);
  EXPECT_TRUE(LooksLikeId(job.id())) << job.id();
  EXPECT_EQ(job.state(), v1::JOB_STATE_ACTIVE);
  EXPECT_EQ(job.generation(), 1);
  EXPECT_EQ(job.name(), "gpt-small");
  EXPECT_EQ(job.tenant(), "team-a");
  EXPECT_TRUE(MessageDifferencer::Equals(job.layout(), spec.layout()));
  EXPECT_FALSE(job.has_ptc());  // not echoed back

  v1::GetJobRequest get;
  get.set_job_id(job.id());
  get.set_include_ptc(true);
  absl::StatusOr<v1::Job> read = api_->GetJob(get);
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_TRUE(MessageDifferencer::Equals(read->ptc(), spec.ptc()));
  EXPECT_EQ(read->tensor_count(), spec.ptc().tensors_size());
  EXPECT_TRUE(read->active_operation_id().empty());
  get.set_include_ptc(false);
  EXPECT_FALSE(api_->GetJob(get)->has_ptc());
}

struct InvalidCase {
  const char* name;
  void (*mutate)(v1::JobSpec*);
  const char* expected;  // substring of the message
};

TEST_P(SchedulerJobsTest, RegisterJobRefusesEveryInvalidSpecNamingTheField) {
  const InvalidCase cases[] = {
      {"no name", [](v1::JobSpec* s) { s->clear_name(); }, "job name is empty"},
      {"no items",
       [](v1::JobSpec* s) {
         s->mutable_ptc()->clear_tensors();
         s->mutable_ptc()->clear_blobs();
       },
       "ptc has no tensors and no blobs"},
      {"dtype",
       [](v1::JobSpec* s) {
         s->mutable_ptc()->mutable_tensors(0)->set_dtype(v1::DTYPE_UNSPECIFIED);
       },
       "tensor \"embed\": dtype 0"},
      {"shape", [](v1::JobSpec* s) { s->mutable_ptc()->mutable_tensors(2)->set_shape(0, -8); },
       "tensor \"layers.0.proj\": shape[0] is -8"},
      {"tp axis",
       [](v1::JobSpec* s) {
         s->mutable_ptc()->mutable_tensors(0)->mutable_partition()->mutable_tp()->set_axis(5);
       },
       "tensor \"embed\": partition.tp.axis 5 out of range"},
      {"tp blocks",
       [](v1::JobSpec* s) {
         s->mutable_ptc()->mutable_tensors(1)->mutable_partition()->mutable_tp()->set_blocks(0, 9);
       },
       "tensor \"layers.0.qkv\": partition.tp.blocks"},
      {"pipeline layer",
       [](v1::JobSpec* s) {
         s->mutable_ptc()->mutable_tensors(1)->mutable_partition()->mutable_pipeline()->set_layer(
             9);
       },
       "tensor \"layers.0.qkv\": partition.pipeline.layer 9"},
      {"pipeline mode",
       [](v1::JobSpec* s) {
         s->mutable_ptc()->mutable_tensors(2)->mutable_partition()->mutable_pipeline()->set_mode(
             v1::PIPELINE_UNSPECIFIED);
       },
       "tensor \"layers.0.proj\": partition.pipeline.mode is unspecified"},
      {"dp axis",
       [](v1::JobSpec* s) {
         s->mutable_ptc()->mutable_tensors(3)->mutable_partition()->mutable_dp()->set_axis(3);
       },
       "tensor \"layers.0.norm\": partition.dp.axis 3"},
      {"duplicate", [](v1::JobSpec* s) { s->mutable_ptc()->mutable_tensors(2)->set_name("embed"); },
       "tensor \"embed\": duplicate name"},
      {"blob size", [](v1::JobSpec* s) { s->mutable_ptc()->mutable_blobs(0)->set_size_bytes(0); },
       "blob \"step\": size_bytes 0"},
      {"layout tp", [](v1::JobSpec* s) { s->mutable_layout()->mutable_config()->set_tp(0); },
       "layout.config.tp is 0"},
      {"layout world",
       [](v1::JobSpec* s) { s->mutable_layout()->mutable_placement()->add_hosts("h9"); },
       "layout.placement has 3 hosts x 2 devices"},
      {"stage starts",
       [](v1::JobSpec* s) { s->mutable_layout()->mutable_config()->add_stage_starts(1); },
       "layout.config.stage_starts"},
      {"shared device",
       [](v1::JobSpec* s) {
         v1::Placement p;
         for (int r = 0; r < 4; ++r) {
           v1::DeviceSlot* slot = p.add_ranks();
           slot->set_host("h0");
           slot->set_device(r == 3 ? 0 : r);
         }
         *s->mutable_layout()->mutable_placement() = p;
       },
       "ranks 0 and 3 share host \"h0\" device 0"},
      {"empty dp rank",
       [](v1::JobSpec* s) {
         *s->mutable_layout() = MakeLayout(1, 1, 16, {"h0", "h1"}, 8);  // norm has 8 elements
       },
       "tensor \"layers.0.norm\": layout.config.dp 16 exceeds"},
  };
  const DatabaseSnapshot before = Snapshot();
  for (const InvalidCase& c : cases) {
    v1::RegisterJobRequest request;
    *request.mutable_spec() = TwoLayerJob(std::string("bad-") + c.name);
    c.mutate(request.mutable_spec());
    EXPECT_THAT(api_->RegisterJob(request).status(),
                StatusIs(absl::StatusCode::kInvalidArgument, c.expected))
        << c.name;
  }
  EXPECT_TRUE(Snapshot() == before);
}

TEST_P(SchedulerJobsTest, RegisterJobRefusesAnOversizedSpec) {
  SchedulerApi::Options options;
  options.max_spec_bytes = 256;
  SchedulerApi small(store_, &clock_, nullptr, options);
  v1::RegisterJobRequest request;
  *request.mutable_spec() = TwoLayerJob("big");
  EXPECT_THAT(small.RegisterJob(request).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, "the limit is 256 (max_spec_bytes)"));
  EXPECT_TRUE(Snapshot().jobs.empty());
}

TEST_P(SchedulerJobsTest, RegisterJobDuplicateNameIsAlreadyExists) {
  Register(TwoLayerJob("dup", "team-a"));
  const DatabaseSnapshot before = Snapshot();
  v1::RegisterJobRequest request;
  *request.mutable_spec() = TwoLayerJob("dup", "team-a");
  EXPECT_EQ(api_->RegisterJob(request).status().code(), absl::StatusCode::kAlreadyExists);
  EXPECT_TRUE(Snapshot() == before);
  Register(TwoLayerJob("dup", "team-b"));  // names are per tenant
}

TEST_P(SchedulerJobsTest, RegisterJobRetryWithTheKeyReturnsTheSameJob) {
  const v1::Job first = Register(TwoLayerJob("retry"), "key-1");
  const v1::Job again = Register(TwoLayerJob("retry"), "key-1");
  EXPECT_EQ(again.id(), first.id());
  const DatabaseSnapshot before = Snapshot();
  EXPECT_EQ(before.jobs.size(), 1u);
  v1::RegisterJobRequest other;
  *other.mutable_spec() = TwoLayerJob("retry-other");
  other.set_idempotency_key("key-1");
  EXPECT_EQ(api_->RegisterJob(other).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(Snapshot() == before);
}

TEST_P(SchedulerJobsTest, GetJobChecksItsArgument) {
  v1::GetJobRequest request;
  EXPECT_THAT(api_->GetJob(request).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, "job_id is empty"));
  request.set_job_id("0123456789abcdef0123456789abcdef");
  EXPECT_THAT(
      api_->GetJob(request).status(),
      StatusIs(absl::StatusCode::kNotFound, "job \"0123456789abcdef0123456789abcdef\" not found"));
}

TEST_P(SchedulerJobsTest, ListJobsPagesAndFilters) {
  std::set<std::string> team_a;
  for (int i = 0; i < 5; ++i) team_a.insert(Register(TwoLayerJob("a" + std::to_string(i))).id());
  const v1::Job b0 = Register(TwoLayerJob("b0", "team-b"));
  Register(TwoLayerJob("b1", "team-b"));

  std::set<std::string> seen;
  v1::ListJobsRequest request;
  request.set_tenant("team-a");
  request.set_page_size(2);
  int pages = 0;
  do {
    absl::StatusOr<v1::ListJobsResponse> page = api_->ListJobs(request);
    ASSERT_TRUE(page.ok()) << page.status();
    EXPECT_LE(page->jobs_size(), 2);
    for (const v1::Job& j : page->jobs()) {
      EXPECT_TRUE(seen.insert(j.id()).second) << "job listed twice";
      EXPECT_EQ(j.tenant(), "team-a");
      EXPECT_FALSE(j.has_ptc());
    }
    request.set_page_token(page->next_page_token());
    ++pages;
  } while (!request.page_token().empty() && pages < 10);
  EXPECT_EQ(seen, team_a);
  EXPECT_EQ(pages, 3);

  v1::ListJobsRequest all;
  all.set_page_size(5000);  // over the maximum: clamped, not refused
  EXPECT_EQ(api_->ListJobs(all)->jobs_size(), 7);

  ASSERT_TRUE(ResizeTo(b0, MakeLayout(2, 2, 1, {"h0", "h2"}, 2)).ok());
  v1::ListJobsRequest reconfiguring;
  reconfiguring.set_state(v1::JOB_STATE_RECONFIGURING);
  absl::StatusOr<v1::ListJobsResponse> busy = api_->ListJobs(reconfiguring);
  ASSERT_TRUE(busy.ok()) << busy.status();
  ASSERT_EQ(busy->jobs_size(), 1);
  EXPECT_EQ(busy->jobs(0).id(), b0.id());

  v1::ListJobsRequest bad;
  bad.set_page_token("not-a-token");
  EXPECT_THAT(api_->ListJobs(bad).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, "page_token \"not-a-token\""));
  bad.clear_page_token();
  bad.set_page_size(-1);
  EXPECT_THAT(api_->ListJobs(bad).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, "page_size is -1"));
  bad.set_page_size(0);
  bad.set_state(static_cast<v1::JobState>(42));
  EXPECT_THAT(api_->ListJobs(bad).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, "state 42"));
}

TEST_P(SchedulerJobsTest, DeleteJob) {
  const v1::Job job = Register(TwoLayerJob("doomed"));
  const v1::Job busy = Register(TwoLayerJob("busy"));
  absl::StatusOr<v1::Operation> op = ResizeTo(busy, MakeLayout(2, 2, 1, {"h0", "h2"}, 2));
  ASSERT_TRUE(op.ok()) << op.status();

  const DatabaseSnapshot before = Snapshot();
  v1::DeleteJobRequest request;
  request.set_job_id(busy.id());
  EXPECT_EQ(api_->DeleteJob(request).status().code(), absl::StatusCode::kFailedPrecondition);
  request.set_job_id("");
  EXPECT_EQ(api_->DeleteJob(request).status().code(), absl::StatusCode::kInvalidArgument);
  request.set_job_id(NewId());
  EXPECT_THAT(api_->DeleteJob(request).status(), StatusIs(absl::StatusCode::kNotFound, "job \""));
  EXPECT_TRUE(Snapshot() == before);

  request.set_job_id(job.id());
  EXPECT_TRUE(api_->DeleteJob(request).ok());
  v1::GetJobRequest get;
  get.set_job_id(job.id());
  EXPECT_EQ(api_->GetJob(get).status().code(), absl::StatusCode::kNotFound);
}

TEST_P(SchedulerJobsTest, ListHosts) {
  RegisterAgents({"h0", "h1"});
  absl::StatusOr<v1::ListHostsResponse> hosts = api_->ListHosts(v1::ListHostsRequest());
  ASSERT_TRUE(hosts.ok()) << hosts.status();
  ASSERT_EQ(hosts->hosts_size(), 2);
  for (const v1::Host& h : hosts->hosts()) {
    EXPECT_EQ(h.state(), v1::HOST_STATE_ALIVE);
    EXPECT_EQ(h.lease_expires_unix_ms(), clock_.NowUnixMs() + kLeaseMs);
  }
}

RESHARD_LOGIC_ON_BOTH_STORES(SchedulerJobsTest);

}  // namespace
}  // namespace reshard::coordinator::testing
