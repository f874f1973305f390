// Store hosts (both stores: the contract suite): registration epochs,
// heartbeats, leases, lost hosts.
#include <google/protobuf/util/message_differencer.h>
#include <gtest/gtest.h>

#include "tests/coordinator/store/store_fixture.h"

namespace reshard::coordinator::store_test {
namespace {

using google::protobuf::util::MessageDifferencer;
using HostsTest = StoreContractTest;

TEST_P(HostsTest, RegisterReturnsAnIncreasingEpoch) {
  EXPECT_EQ(*store_->RegisterHost(test_support::MakeHost("h0"), 1000, 11000), 1);
  EXPECT_EQ(*store_->RegisterHost(test_support::MakeHost("h0"), 2000, 12000), 2);
  EXPECT_EQ(*store_->RegisterHost(test_support::MakeHost("h1"), 2000, 12000), 1);

  absl::StatusOr<v1::Host> h0 = store_->GetHost("h0");
  ASSERT_TRUE(h0.ok()) << h0.status();
  v1::Host expected = test_support::MakeHost("h0");
  expected.set_state(v1::HOST_STATE_ALIVE);
  expected.set_last_heartbeat_unix_ms(2000);
  expected.set_lease_expires_unix_ms(12000);
  EXPECT_TRUE(MessageDifferencer::Equals(*h0, expected)) << h0->DebugString();

  absl::StatusOr<std::vector<v1::Host>> all = store_->ListHosts();
  ASSERT_TRUE(all.ok());
  ASSERT_EQ(all->size(), 2u);
  EXPECT_EQ((*all)[0].host_id(), "h0");
  EXPECT_EQ((*all)[1].host_id(), "h1");
  EXPECT_EQ(store_->GetHost("h9").status().code(), absl::StatusCode::kNotFound);
}

TEST_P(HostsTest, HeartbeatExtendsTheLeaseOfTheLatestEpochOnly) {
  ASSERT_TRUE(store_->RegisterHost(test_support::MakeHost("h0"), 1000, 11000).ok());
  ASSERT_TRUE(store_->RegisterHost(test_support::MakeHost("h0"), 1500, 11500).ok());  // epoch 2
  ASSERT_TRUE(store_->Heartbeat("h0", 2, 5000, 15000).ok());
  EXPECT_EQ(store_->GetHost("h0")->lease_expires_unix_ms(), 15000);
  EXPECT_EQ(store_->GetHost("h0")->last_heartbeat_unix_ms(), 5000);

  const absl::Status stale = store_->Heartbeat("h0", 1, 6000, 16000);
  EXPECT_EQ(stale.code(), absl::StatusCode::kFailedPrecondition) << stale;
  EXPECT_EQ(stale.message(),
            "host \"h0\": heartbeat for epoch 1 but the latest registration is epoch 2; register "
            "again");
  EXPECT_EQ(store_->GetHost("h0")->lease_expires_unix_ms(), 15000);
  EXPECT_EQ(store_->Heartbeat("h9", 1, 6000, 16000).code(), absl::StatusCode::kNotFound);
}

TEST_P(HostsTest, ExpiredLeasesMakeHostsLostUntilTheyRegisterAgain) {
  ASSERT_TRUE(store_->RegisterHost(test_support::MakeHost("h0"), 0, 1000).ok());
  ASSERT_TRUE(store_->RegisterHost(test_support::MakeHost("h1"), 0, 5000).ok());
  absl::StatusOr<std::vector<std::string>> expired = store_->ExpireLeases(2000);
  ASSERT_TRUE(expired.ok()) << expired.status();
  EXPECT_EQ(*expired, std::vector<std::string>{"h0"});
  EXPECT_TRUE(store_->ExpireLeases(2000)->empty());  // already LOST
  EXPECT_EQ(store_->GetHost("h0")->state(), v1::HOST_STATE_LOST);
  EXPECT_EQ(store_->GetHost("h1")->state(), v1::HOST_STATE_ALIVE);

  const absl::Status beat = store_->Heartbeat("h0", 1, 2500, 3500);
  EXPECT_EQ(beat.code(), absl::StatusCode::kFailedPrecondition) << beat;
  EXPECT_NE(beat.message().find("LOST"), absl::string_view::npos);

  EXPECT_EQ(*store_->RegisterHost(test_support::MakeHost("h0"), 3000, 13000), 2);
  EXPECT_EQ(store_->GetHost("h0")->state(), v1::HOST_STATE_ALIVE);
  EXPECT_TRUE(store_->Heartbeat("h0", 2, 4000, 14000).ok());
}

// What a cache of registered facts compares: it moves on every registration
// and on nothing else.
TEST_P(HostsTest, RegistrationsMarkMovesOnRegistrationsOnly) {
  using Mark = Store::RegistrationsMark;
  EXPECT_TRUE(*store_->HostRegistrations() == (Mark{0, 0}));
  ASSERT_TRUE(store_->RegisterHost(test_support::MakeHost("h0"), 0, 1000).ok());
  ASSERT_TRUE(store_->RegisterHost(test_support::MakeHost("h1"), 0, 5000).ok());
  EXPECT_TRUE(*store_->HostRegistrations() == (Mark{2, 2}));
  ASSERT_TRUE(store_->Heartbeat("h1", 1, 900, 6000).ok());
  ASSERT_EQ(*store_->ExpireLeases(2000), std::vector<std::string>{"h0"});
  EXPECT_TRUE(*store_->HostRegistrations() == (Mark{2, 2}));
  ASSERT_TRUE(store_->RegisterHost(test_support::MakeHost("h0"), 3000, 13000).ok());  // epoch 2
  const absl::StatusOr<Mark> mark = store_->HostRegistrations();
  ASSERT_TRUE(mark.ok()) << mark.status();
  EXPECT_EQ(mark->hosts, 2);
  EXPECT_EQ(mark->epochs, 3);
}

TEST_P(HostsTest, LostHostsShowOnTheirJobsAndOperations) {
  // job-1 on h0, h1; job-2 on h2, h3.
  ASSERT_TRUE(store_->CreateJob("job-1", test_support::StoreSmallSpec("m1"), {}).ok());
  v1::JobSpec other = test_support::StoreSmallSpec("m2");
  *other.mutable_layout() = test_support::MakeLayout(2, 2, 1, {"h2", "h3"}, 2);
  ASSERT_TRUE(store_->CreateJob("job-2", other, {}).ok());
  for (const char* h : {"h0", "h1", "h2", "h3", "h4"}) {
    ASSERT_TRUE(store_->RegisterHost(test_support::MakeHost(h), 0, 10000).ok());
  }
  // job-1 moves to h1, h4; the transfer involves h0, h1 and h4.
  const v1::Layout target = test_support::MakeLayout(2, 2, 1, {"h1", "h4"}, 2);
  ASSERT_TRUE(store_->CreateOperation(Resize("op-1", "job-1", 1, target)).ok());
  ASSERT_TRUE(store_
                  ->TransitionOperation("op-1", v1::OPERATION_STATE_PENDING,
                                        v1::OPERATION_STATE_PLANNED, {})
                  .ok());
  ASSERT_TRUE(store_
                  ->StartTransfer("op-1", {Progress("h0", v1::HOST_TASK_STATE_ASSIGNED),
                                           Progress("h1", v1::HOST_TASK_STATE_ASSIGNED),
                                           Progress("h4", v1::HOST_TASK_STATE_ASSIGNED)})
                  .ok());
  // Every host but h0 heartbeats.
  for (const char* h : {"h1", "h2", "h3", "h4"}) {
    ASSERT_TRUE(store_->Heartbeat(h, 1, 9000, 30000).ok());
  }
  ASSERT_EQ(*store_->ExpireLeases(20000), std::vector<std::string>{"h0"});

  EXPECT_EQ(*store_->OperationsOnHosts({"h0"}), std::vector<std::string>{"op-1"});
  EXPECT_EQ(*store_->OperationsOnHosts({"h2", "h3"}), std::vector<std::string>{});
  EXPECT_EQ(*store_->JobsOnHosts({"h0"}), std::vector<std::string>{"job-1"});
  EXPECT_EQ(*store_->JobsOnHosts({"h1", "h3"}), (std::vector<std::string>{"job-1", "job-2"}));
  // Pending generations do not count: h4 holds nothing committed yet.
  EXPECT_TRUE(store_->JobsOnHosts({"h4"})->empty());
  EXPECT_TRUE(store_->JobsOnHosts({})->empty());
  absl::StatusOr<v1::Job> job = store_->GetJob("job-1", false);
  ASSERT_TRUE(job.ok());
  ASSERT_EQ(job->lost_hosts_size(), 1);
  EXPECT_EQ(job->lost_hosts(0), "h0");
  EXPECT_EQ(store_->GetJob("job-2", false)->lost_hosts_size(), 0);

  // The driver aborts the operation; the job comes back DEGRADED.
  ASSERT_TRUE(store_
                  ->TransitionOperation("op-1", v1::OPERATION_STATE_TRANSFERRING,
                                        v1::OPERATION_STATE_ABORTED, {})
                  .ok());
  EXPECT_EQ(store_->GetJob("job-1", false)->state(), v1::JOB_STATE_DEGRADED);
  EXPECT_TRUE(store_->OperationsOnHosts({"h0"})->empty());
}

RESHARD_STORE_CONTRACT(HostsTest);

}  // namespace
}  // namespace reshard::coordinator::store_test
