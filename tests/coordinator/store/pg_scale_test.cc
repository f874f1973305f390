// A GPT-3 175B-shaped job (~4,600 tensors, tp 8 x pp 16 x dp 8 = 1,024
// ranks on 128 hosts) through PgStore: written by CreateJob, read back by
// GetPtc / GetJob, equal to what went in. Times are printed, not asserted.
#include <google/protobuf/util/message_differencer.h>
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <mutex>

#include "bench/planner/gpt_model.h"
#include "tests/coordinator/store/store_fixture.h"

namespace reshard::coordinator::store_test {
namespace {

using google::protobuf::util::MessageDifferencer;
using Clock = std::chrono::steady_clock;

double MsSince(Clock::time_point start) {
  return std::chrono::duration<double, std::milli>(Clock::now() - start).count();
}

using ScaleTest = PgStoreTest;

TEST_F(ScaleTest, Gpt175bJobRoundTrips) {
  // Per-statement times, printed below.
  std::mutex mu;
  std::vector<std::pair<std::string, double>> statements;
  PgStoreOptions options;
  options.dsn = dsn_;
  options.observer = [&](const std::string& name, double seconds) {
    std::lock_guard<std::mutex> l(mu);
    statements.emplace_back(name, seconds);
  };
  absl::StatusOr<std::shared_ptr<PgStore>> timed = PgStore::Connect(options);
  ASSERT_TRUE(timed.ok()) << timed.status();
  store_ = *timed;

  v1::JobSpec spec;
  spec.set_name("gpt3-175b");
  spec.set_tenant("tenant-a");
  *spec.mutable_ptc() = bench::BuildGptPtc(bench::kGpt3_175b, 8);
  *spec.mutable_layout() = bench::MakeLayout(8, 16, 8, "host-", 0, 8);
  ASSERT_GT(spec.ptc().tensors_size(), 4000);

  Clock::time_point start = Clock::now();
  absl::StatusOr<v1::Job> created = store_->CreateJob("job-175b", spec, {});
  const double create_ms = MsSince(start);
  ASSERT_TRUE(created.ok()) << created.status();
  EXPECT_EQ(created->tensor_count(), spec.ptc().tensors_size());

  start = Clock::now();
  absl::StatusOr<v1::Ptc> ptc = store_->GetPtc("job-175b");
  const double get_ptc_ms = MsSince(start);
  ASSERT_TRUE(ptc.ok()) << ptc.status();
  EXPECT_TRUE(MessageDifferencer::Equals(*ptc, spec.ptc()));

  start = Clock::now();
  absl::StatusOr<v1::Job> job = store_->GetJob("job-175b", /*include_ptc=*/false);
  const double get_job_ms = MsSince(start);
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_TRUE(MessageDifferencer::Equals(job->layout(), spec.layout()));
  EXPECT_EQ(CountRows("SELECT count(*) FROM generation_ranks WHERE job_id = $1", "job-175b"), 1024);

  // Which jobs use a host is answered from the rank rows.
  start = Clock::now();
  absl::StatusOr<std::vector<std::string>> on_host = store_->JobsOnHosts({"host-77"});
  const double jobs_on_hosts_ms = MsSince(start);
  ASSERT_TRUE(on_host.ok());
  EXPECT_EQ(*on_host, std::vector<std::string>{"job-175b"});

  std::printf(
      "[ 175B PTC ] %d tensors, %d ranks, spec %.1f KiB: CreateJob %.1f ms, GetPtc %.1f ms, "
      "GetJob %.1f ms, JobsOnHosts %.1f ms\n",
      spec.ptc().tensors_size(), 1024, spec.ByteSizeLong() / 1024.0, create_ms, get_ptc_ms,
      get_job_ms, jobs_on_hosts_ms);
  std::printf("[ 175B PTC ] statements over 1 ms:");
  for (const auto& [name, seconds] : statements) {
    if (seconds >= 0.001) std::printf(" %s %.1f ms", name.c_str(), seconds * 1000);
  }
  std::printf("\n");
}

}  // namespace
}  // namespace reshard::coordinator::store_test
