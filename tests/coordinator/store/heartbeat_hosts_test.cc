// Store::HeartbeatHosts (heartbeats in batches) on both stores: PostgreSQL's
// one-transaction form and the default per-host form answer alike. A
// stale epoch, a LOST host and an unknown host are refused alone, in the
// batch's order, and the others' leases are renewed; each host hears of the
// deleted jobs among its own held ones.
#include <gtest/gtest.h>

#include "tests/coordinator/store/store_fixture.h"

namespace reshard::coordinator::store_test {
namespace {

using HeartbeatHostsTest = StoreContractTest;

HostHeartbeat Beat(const std::string& host, int64_t epoch, std::vector<std::string> held = {}) {
  HostHeartbeat beat;
  beat.host_id = host;
  beat.epoch = epoch;
  beat.now_unix_ms = 5000;
  beat.lease_expires_unix_ms = 15000;
  beat.held_jobs = std::move(held);
  return beat;
}

TEST_P(HeartbeatHostsTest, EachHostIsAnsweredAloneInTheBatchsOrder) {
  ASSERT_TRUE(store_->CreateJob("job-1", test_support::StoreSmallSpec("m1"), {}).ok());
  ASSERT_TRUE(store_->RegisterHost(test_support::MakeHost("h0"), 1000, 11000).ok());
  ASSERT_TRUE(store_->RegisterHost(test_support::MakeHost("h0"), 1500, 11500).ok());  // epoch 2
  ASSERT_TRUE(store_->RegisterHost(test_support::MakeHost("h1"), 0, 1000).ok());
  ASSERT_TRUE(store_->RegisterHost(test_support::MakeHost("h2"), 1000, 11000).ok());
  ASSERT_EQ(*store_->ExpireLeases(2000), std::vector<std::string>{"h1"});

  absl::StatusOr<std::vector<HostHeartbeatResult>> results = store_->HeartbeatHosts(
      {Beat("h0", 1), Beat("h1", 1), Beat("h9", 1), Beat("h2", 1, {"job-gone", "job-1", "job-x"}),
       Beat("h0", 2, {"job-1"})});
  ASSERT_TRUE(results.ok()) << results.status();
  ASSERT_EQ(results->size(), 5u);
  EXPECT_EQ((*results)[0].status,
            absl::FailedPreconditionError("host \"h0\": heartbeat for epoch 1 but the latest "
                                          "registration is epoch 2; register again"));
  EXPECT_EQ((*results)[1].status.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE((*results)[1].status.message().find("LOST"), absl::string_view::npos)
      << (*results)[1].status;
  EXPECT_EQ((*results)[2].status.code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE((*results)[3].status.ok()) << (*results)[3].status;
  EXPECT_EQ((*results)[3].deleted_jobs, (std::vector<std::string>{"job-gone", "job-x"}));
  EXPECT_TRUE((*results)[4].status.ok()) << (*results)[4].status;
  EXPECT_TRUE((*results)[4].deleted_jobs.empty());
  for (int refused : {0, 1, 2}) EXPECT_TRUE((*results)[refused].deleted_jobs.empty());

  EXPECT_EQ(store_->GetHost("h0")->lease_expires_unix_ms(), 15000);
  EXPECT_EQ(store_->GetHost("h2")->lease_expires_unix_ms(), 15000);
  EXPECT_EQ(store_->GetHost("h1")->state(), v1::HOST_STATE_LOST);
  EXPECT_EQ(store_->GetHost("h1")->lease_expires_unix_ms(), 1000);
  EXPECT_TRUE(store_->HeartbeatHosts({})->empty());
}

// A beat the store cannot record (a NUL byte in a held job id or in the
// host id: anything an agent sends) is refused alone, INVALID_ARGUMENT
// naming the field and value; every other host of the batch is renewed and
// told its lists. Before, the first bad beat was the whole batch's error and
// every live host's heartbeat failed with it.
TEST_P(HeartbeatHostsTest, ABadBeatIsRefusedAloneAndTheOthersAreRecorded) {
  ASSERT_TRUE(store_->RegisterHost(test_support::MakeHost("h0"), 1000, 11000).ok());
  ASSERT_TRUE(store_->RegisterHost(test_support::MakeHost("h1"), 1000, 11000).ok());
  const std::string nul("\0", 1);

  absl::StatusOr<std::vector<HostHeartbeatResult>> results = store_->HeartbeatHosts(
      {Beat("h0", 1, {nul}), Beat("h1", 1, {"job-gone"}), Beat("h" + nul, 1), Beat("h0", 1)});
  ASSERT_TRUE(results.ok()) << results.status();
  ASSERT_EQ(results->size(), 4u);
  EXPECT_EQ((*results)[0].status,
            absl::InvalidArgumentError("held_jobs entry \"\\x00\" contains a NUL byte"));
  EXPECT_TRUE((*results)[1].status.ok()) << (*results)[1].status;
  EXPECT_EQ((*results)[1].deleted_jobs, std::vector<std::string>{"job-gone"});
  EXPECT_EQ((*results)[2].status,
            absl::InvalidArgumentError("host id \"h\\x00\" contains a NUL byte"));
  EXPECT_TRUE((*results)[3].status.ok()) << (*results)[3].status;
  EXPECT_EQ(store_->GetHost("h0")->lease_expires_unix_ms(), 15000);
  EXPECT_EQ(store_->GetHost("h1")->lease_expires_unix_ms(), 15000);

  // A batch of bad beats only: each refused, nothing recorded, no error.
  results = store_->HeartbeatHosts({Beat("h1", 1, {nul})});
  ASSERT_TRUE(results.ok()) << results.status();
  EXPECT_EQ((*results)[0].status.code(), absl::StatusCode::kInvalidArgument);
}

// Task polls are read in batches too (AssignedOperationsOfHosts): an id the
// store cannot hold names no host, has none assigned, and does not fail the
// others' read.
TEST_P(HeartbeatHostsTest, AnUnstorableHostIdDoesNotFailABatchedTaskRead) {
  ASSERT_TRUE(store_->RegisterHost(test_support::MakeHost("h0"), 1000, 11000).ok());
  absl::StatusOr<std::map<std::string, std::vector<std::string>>> assigned =
      store_->AssignedOperationsOfHosts({"h0", std::string("h\0", 2)});
  ASSERT_TRUE(assigned.ok()) << assigned.status();
  EXPECT_EQ(assigned->count(std::string("h\0", 2)), 0u);
}

RESHARD_STORE_CONTRACT(HeartbeatHostsTest);

}  // namespace
}  // namespace reshard::coordinator::store_test
