// SchedulerApi limits against a real PostgreSQL (issue 9, defect 8): names
// too long for a btree index, sizes that overflowed, a 4 EiB job, and jobs
// that cannot fit their hosts' memory. Each refusal changes nothing.
#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/limits.h"
#include "gtest/gtest.h"
#include "planner/validate.h"
#include "services/coordinator/logic/capacity.h"
#include "tests/coordinator/logic/logic_fixture.h"
#include "tests/support/job_builders.h"
#include "tests/support/jobs.h"

namespace reshard::coordinator::testing {
namespace {

using test_support::MakeLayout;
using test_support::ReplicatedTwoLayerJob;
using test_support::TwoLayerJob;

class SchedulerLimitsTest : public LogicTest {
 protected:
  absl::Status RegisterStatus(const v1::JobSpec& spec, const std::string& key = "") {
    v1::RegisterJobRequest request;
    *request.mutable_spec() = spec;
    request.set_idempotency_key(key);
    return api_->RegisterJob(request).status();
  }
  // The refusal has `code` and mentions `text`, and the database is as before.
  void ExpectRefused(const v1::JobSpec& spec, absl::StatusCode code, const std::string& text,
                     const std::string& key = "") {
    const DatabaseSnapshot before = Snapshot();
    EXPECT_THAT(RegisterStatus(spec, key), StatusIs(code, text));
    EXPECT_TRUE(Snapshot() == before);
  }
  // `devices`: the memory_bytes of each "cuda" device (as an agent with a
  // device API registers them), after a "cpu" device that carries `limit`
  // (which is host memory, counted once).
  void RegisterWithLimit(const std::string& host, int64_t limit,
                         const std::vector<int64_t>& devices = {}) {
    v1::RegisterAgentRequest request;
    request.mutable_host()->set_host_id(host);
    request.mutable_host()->set_address(host + ":7171");
    request.mutable_host()->set_memory_limit_bytes(limit);
    if (!devices.empty()) {
      v1::Device* cpu = request.mutable_host()->add_devices();
      cpu->set_kind("cpu");
      cpu->set_name("cpu");
      cpu->set_memory_bytes(limit);
    }
    for (size_t i = 0; i < devices.size(); ++i) {
      v1::Device* d = request.mutable_host()->add_devices();
      d->set_index(static_cast<int>(i));
      d->set_kind("cuda");
      d->set_name(absl::StrCat("cuda:", i));
      d->set_memory_bytes(devices[i]);
    }
    absl::StatusOr<v1::RegisterAgentResponse> r = agents_->RegisterAgent(request);
    ASSERT_TRUE(r.ok()) << r.status();
  }
  static v1::Host MakeLimitedHost(const std::string& host, int64_t limit) {
    return test_support::MakeHost(host, {.address = host + ":7171",
                                         .devices = 0,
                                         .transports = {},
                                         .ucx_address = "",
                                         .memory_limit_bytes = limit});
  }
};

TEST_P(SchedulerLimitsTest, NamesTooLongForTheIndexAreInvalidNotInternal) {
  const std::string long_name(2700, 'x');
  v1::JobSpec spec = TwoLayerJob("ok");
  spec.set_name(long_name);
  ExpectRefused(spec, absl::StatusCode::kInvalidArgument, "job name \"xxx");
  spec = TwoLayerJob("ok", long_name);
  ExpectRefused(spec, absl::StatusCode::kInvalidArgument, "tenant \"xxx");
  spec = TwoLayerJob("ok");
  spec.mutable_ptc()->mutable_tensors(0)->set_name(long_name);
  ExpectRefused(spec, absl::StatusCode::kInvalidArgument, "ptc.tensors[0].name");
  spec = TwoLayerJob("ok");
  spec.mutable_layout()->mutable_placement()->set_hosts(1, long_name);
  ExpectRefused(spec, absl::StatusCode::kInvalidArgument, "layout.placement: rank 2 host \"xxx");
  ExpectRefused(TwoLayerJob("ok"), absl::StatusCode::kInvalidArgument, "idempotency_key \"kkk",
                std::string(kMaxIdBytes + 1, 'k'));

  // At the limits everything is stored and read back.
  spec = TwoLayerJob(std::string(kMaxIdBytes, 'n'), std::string(kMaxIdBytes, 't'));
  spec.mutable_ptc()->mutable_tensors(0)->set_name(std::string(kMaxItemNameBytes, 'w'));
  spec.mutable_layout()->mutable_placement()->set_hosts(1, std::string(kMaxIdBytes, 'h'));
  const absl::Status ok = RegisterStatus(spec, std::string(kMaxIdBytes, 'k'));
  EXPECT_TRUE(ok.ok()) << ok;
}

TEST_P(SchedulerLimitsTest, ResizeTargetHostAndKeyLimits) {
  const v1::Job job = Register(TwoLayerJob("job"));
  const DatabaseSnapshot before = Snapshot();
  EXPECT_THAT(ResizeTo(job, MakeLayout(2, 2, 1, {"h0", std::string(2700, 'h')}, 2)).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, "target.placement: rank 2 host"));
  EXPECT_THAT(ResizeTo(job, MakeLayout(2, 2, 1, {"h0", "h2"}, 2), std::string(2700, 'k')).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, "idempotency_key"));
  v1::DeleteJobRequest del;
  del.set_job_id(job.id());
  del.set_idempotency_key(std::string(2700, 'k'));
  EXPECT_THAT(api_->DeleteJob(del).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, "idempotency_key"));
  v1::GetJobRequest get;
  get.set_job_id(std::string(2700, 'j'));
  EXPECT_THAT(api_->GetJob(get).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, "is 2700 bytes; the limit is 256"));
  EXPECT_TRUE(Snapshot() == before);
}

TEST_P(SchedulerLimitsTest, OverflowingAndExabyteJobsAreRefused) {
  // The job: a tensor of 2^62 int8 plus a blob of 2^63-1 bytes.
  v1::JobSpec spec = TwoLayerJob("overflow");
  v1::TensorSpec* t = spec.mutable_ptc()->mutable_tensors(0);
  t->set_dtype(v1::DTYPE_INT8);
  t->mutable_partition()->Clear();
  t->mutable_partition()->mutable_pipeline()->set_mode(v1::PIPELINE_EVERY_STAGE);
  t->clear_shape();
  t->add_shape(int64_t{1} << 31);
  t->add_shape(int64_t{1} << 31);
  ExpectRefused(spec, absl::StatusCode::kInvalidArgument, "elements; the limit is");
  spec = TwoLayerJob("overflow");
  spec.mutable_ptc()->mutable_blobs(0)->set_size_bytes(INT64_MAX);
  ExpectRefused(spec, absl::StatusCode::kInvalidArgument, "size_bytes 9223372036854775807");

  // 4 EiB in 4096 tensors of 1 TiB: every tensor within its limit, the job not.
  spec = TwoLayerJob("exabyte");
  spec.mutable_ptc()->clear_blobs();
  v1::TensorSpec big = spec.ptc().tensors(0);
  big.set_dtype(v1::DTYPE_INT8);
  big.mutable_partition()->Clear();
  big.mutable_partition()->mutable_pipeline()->set_mode(v1::PIPELINE_EVERY_STAGE);
  big.clear_shape();
  big.add_shape(int64_t{1} << 20);
  big.add_shape(int64_t{1} << 20);
  spec.mutable_ptc()->clear_tensors();
  for (int i = 0; i < 4096; ++i) {
    big.set_name(absl::StrCat("t", i));
    *spec.mutable_ptc()->add_tensors() = big;
  }
  ExpectRefused(spec, absl::StatusCode::kInvalidArgument, "the limit is 1125899906842624 per job");
}

TEST_P(SchedulerLimitsTest, JobThatCannotFitItsHostIsRefusedBeforeAnythingIsStored) {
  // Every host of ReplicatedTwoLayerJob holds every item once: total_bytes each.
  const v1::JobSpec spec = ReplicatedTwoLayerJob("fits");
  const int64_t per_host = Register(spec).total_bytes();
  ASSERT_TRUE(api_->DeleteJob([&] {
                    v1::DeleteJobRequest r;
                    r.set_job_id(api_->ListJobs(v1::ListJobsRequest())->jobs(0).id());
                    return r;
                  }())
                  .ok());

  RegisterWithLimit("h0", per_host);
  RegisterWithLimit("h1", per_host - 1);
  ExpectRefused(
      spec, absl::StatusCode::kResourceExhausted,
      absl::StrCat("layout: host \"h1\" would hold ", per_host,
                   " bytes of this job's shards; its memory_limit_bytes is ", per_host - 1));
  RegisterWithLimit("h1", per_host);  // exactly enough
  const v1::Job job = Register(spec);

  // Resize / Migrate targets: both ranks on h2, which has room for one.
  RegisterWithLimit("h2", 2 * per_host - 1);
  const DatabaseSnapshot before = Snapshot();
  EXPECT_THAT(ResizeTo(job, MakeLayout(1, 1, 2, {"h2"}, 2)).status(),
              StatusIs(absl::StatusCode::kResourceExhausted, "target: host \"h2\" would hold"));
  v1::MigrateRequest migrate;
  migrate.set_job_id(job.id());
  migrate.set_expected_generation(1);
  *migrate.mutable_placement() = MakeLayout(1, 1, 2, {"h2"}, 2).placement();
  EXPECT_THAT(api_->Migrate(migrate).status(),
              StatusIs(absl::StatusCode::kResourceExhausted, "target: host \"h2\" would hold"));
  v1::RecoverFromFailureRequest recover;
  recover.set_job_id(job.id());
  recover.set_expected_generation(1);
  recover.add_lost_hosts("h1");
  *recover.mutable_target() = MakeLayout(1, 1, 2, {"h2"}, 2);
  EXPECT_THAT(api_->RecoverFromFailure(recover).status(),
              StatusIs(absl::StatusCode::kResourceExhausted, "target: host \"h2\" would hold"));
  EXPECT_TRUE(Snapshot() == before);
  RegisterWithLimit("h2", 2 * per_host);
  EXPECT_TRUE(ResizeTo(job, MakeLayout(1, 1, 2, {"h2"}, 2)).ok());
}

TEST_P(SchedulerLimitsTest, JobLargerThanTheWholeClusterIsRefused) {
  const v1::JobSpec spec = ReplicatedTwoLayerJob("big");  // on h0, h1: not registered
  const int64_t per_host = Register(ReplicatedTwoLayerJob("probe", "other")).total_bytes();
  RegisterWithLimit("h7", per_host);
  RegisterWithLimit("h8", per_host - 1);  // the two hold 2 * per_host - 1
  ExpectRefused(spec, absl::StatusCode::kResourceExhausted,
                absl::StrCat("the job needs ", 2 * per_host,
                             " bytes over its hosts; the 2 "
                             "registered hosts have ",
                             2 * per_host - 1));
  RegisterWithLimit("h8", per_host);
  EXPECT_TRUE(RegisterStatus(spec).ok());
}

// The capacities are read whole once, and again only after a registration
// (here through a second store on the same database where there is one: a
// host that registered with another replica).
TEST_P(SchedulerLimitsTest, HostsAreReadAgainOnlyAfterARegistration) {
  const int64_t per_host = Register(ReplicatedTwoLayerJob("probe", "other")).total_bytes();
  const v1::JobSpec spec = ReplicatedTwoLayerJob("cached");  // per_host on each of h0, h1
  RegisterWithLimit("h0", per_host);
  RegisterWithLimit("h1", per_host - 1);
  HostCapacities capacities(store_);
  const auto check = [&] { return capacities.CheckFits(spec.ptc(), spec.layout(), "layout"); };
  for (int i = 0; i < 3; ++i) {
    EXPECT_THAT(check(),
                StatusIs(absl::StatusCode::kResourceExhausted, "layout: host \"h1\" would hold"));
  }
  EXPECT_EQ(capacities.loads(), 1);
  StorePtr other = ConnectStore();
  ASSERT_TRUE(other->RegisterHost(MakeLimitedHost("h1", per_host), 1000, 11000).ok());
  EXPECT_TRUE(check().ok());
  EXPECT_TRUE(check().ok());
  EXPECT_EQ(capacities.loads(), 2);
}

// A host holds a job's shards in host memory or in its devices' memory:
// its capacity is memory_limit_bytes plus its non-cpu devices' memory_bytes.
TEST_P(SchedulerLimitsTest, DeviceMemoryCountsTowardsAHostsCapacity) {
  const int64_t per_host = Register(ReplicatedTwoLayerJob("probe", "other")).total_bytes();
  ASSERT_GT(per_host, 20);
  const v1::JobSpec spec = ReplicatedTwoLayerJob("gpus");  // per_host bytes on each of h0, h1

  // h1 fits only with its device; h0's host memory and two devices hold
  // one byte too few.
  RegisterWithLimit("h1", 1, {per_host - 1});
  RegisterWithLimit("h0", per_host - 10, {4, 5});
  ExpectRefused(spec, absl::StatusCode::kResourceExhausted,
                absl::StrCat("layout: host \"h0\" would hold ", per_host,
                             " bytes of this job's shards; its memory_limit_bytes is ",
                             per_host - 10, " and its 2 devices hold 9"));
  RegisterWithLimit("h0", per_host - 10, {5, 5});  // exactly enough
  const v1::Job job = Register(spec);

  // A target with both ranks on h2: host memory alone would do for one.
  RegisterWithLimit("h2", per_host, {per_host / 2, per_host - per_host / 2 - 1});
  EXPECT_THAT(ResizeTo(job, MakeLayout(1, 1, 2, {"h2"}, 2)).status(),
              StatusIs(absl::StatusCode::kResourceExhausted,
                       absl::StrCat("target: host \"h2\" would hold ", 2 * per_host,
                                    " bytes of this job's shards; its memory_limit_bytes is ",
                                    per_host, " and its 2 devices hold ", per_host - 1)));
  // A device of memory_bytes 0 holds no rank buffer (an agent without a
  // device API lists its GPUs so): h2 is judged by what the others hold.
  RegisterWithLimit("h2", 2 * per_host - 2, {0, 1});
  EXPECT_THAT(ResizeTo(job, MakeLayout(1, 1, 2, {"h2"}, 2)).status(),
              StatusIs(absl::StatusCode::kResourceExhausted,
                       absl::StrCat("target: host \"h2\" would hold ", 2 * per_host,
                                    " bytes of this job's shards; its memory_limit_bytes is ",
                                    2 * per_host - 2, " and its 1 device holds 1")));
  RegisterWithLimit("h2", 2 * per_host - 1, {0, 1});  // exactly enough
  EXPECT_TRUE(ResizeTo(job, MakeLayout(1, 1, 2, {"h2"}, 2)).ok());
}

TEST_P(SchedulerLimitsTest, DeviceMemoryCountsTowardsTheClusterTotal) {
  const v1::JobSpec spec = ReplicatedTwoLayerJob("big");  // on h0, h1: not registered
  const int64_t per_host = Register(ReplicatedTwoLayerJob("probe", "other")).total_bytes();
  RegisterWithLimit("h7", per_host);
  RegisterWithLimit("h8", 1, {per_host - 3, 1});  // the two hold 2 * per_host - 1
  ExpectRefused(spec, absl::StatusCode::kResourceExhausted,
                absl::StrCat("the job needs ", 2 * per_host,
                             " bytes over its hosts; the 2 registered hosts have ", per_host + 1,
                             " bytes of memory_limit_bytes and ", per_host - 2,
                             " bytes on their 2 devices in all"));
  // A device of memory_bytes 0 adds nothing to the total.
  RegisterWithLimit("h8", per_host - 1, {0});
  ExpectRefused(spec, absl::StatusCode::kResourceExhausted,
                absl::StrCat("the job needs ", 2 * per_host,
                             " bytes over its hosts; the 2 registered hosts have ",
                             2 * per_host - 1, " bytes of memory_limit_bytes in all"));
  RegisterWithLimit("h8", per_host, {0});
  EXPECT_TRUE(RegisterStatus(spec).ok());
}

RESHARD_LOGIC_ON_BOTH_STORES(SchedulerLimitsTest);

}  // namespace
}  // namespace reshard::coordinator::testing
