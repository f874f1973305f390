// Unit tests (no database) of the logic's pure pieces: slicing a plan to a
// host, per-host bytes, request hashes, ids, error truncation and the
// request checks.
#include "services/coordinator/logic/task.h"

#include <map>
#include <set>
#include <string>
#include <utility>

#include "gmock/gmock.h"
#include "google/protobuf/util/message_differencer.h"
#include "gtest/gtest.h"
#include "planner/layout.h"
#include "planner/plan_steps.h"
#include "planner/planner.h"
#include "reshard/v1/coordinator.pb.h"
#include "services/coordinator/logic/error_text.h"
#include "services/coordinator/logic/idempotency.h"
#include "services/coordinator/logic/ids.h"
#include "services/coordinator/logic/request_checks.h"
#include "tests/support/job_builders.h"
#include "tests/support/jobs.h"

namespace reshard::coordinator {
namespace {

using ::google::protobuf::util::MessageDifferencer;
using test_support::MakeLayout;
using test_support::TwoLayerPtc;
using ::testing::HasSubstr;

// tp 2 pp 2 dp 1 on h0,h1 -> tp 1 pp 2 dp 2 on h1,h2,h3: sources on h0 and
// h1, destinations on h1..h3, DP_FLAT padding on the new ranks.
v1::TransferPlan SamplePlan() {
  const v1::Layout from = MakeLayout(2, 2, 1, {"h0", "h1"}, 2);
  v1::Layout to;
  *to.mutable_config() = test_support::Config(1, 2, 2);
  const std::pair<const char*, int> slots[] = {{"h1", 0}, {"h1", 1}, {"h2", 0}, {"h3", 0}};
  for (const auto& [host, device] : slots) {
    v1::DeviceSlot* slot = to.mutable_placement()->add_ranks();
    slot->set_host(host);
    slot->set_device(device);
  }
  absl::StatusOr<v1::TransferPlan> plan = planner::PlanTransfer(TwoLayerPtc(), from, to, {});
  EXPECT_TRUE(plan.ok()) << plan.status();
  return plan.ok() ? *plan : v1::TransferPlan();
}

std::vector<std::string> NewHosts(const v1::TransferPlan& plan) {
  std::vector<std::string> hosts;
  for (const auto& s : planner::ExpandPlacement(plan.target_layout().placement())) {
    hosts.push_back(s.host());
  }
  return hosts;
}

std::vector<std::string> OldHosts(const v1::TransferPlan& plan) {
  std::vector<std::string> hosts;
  for (const auto& s : planner::ExpandPlacement(plan.source_layout().placement())) {
    hosts.push_back(s.host());
  }
  return hosts;
}

TEST(HostsTakingPart, SourcesAndDestinations) {
  const v1::TransferPlan plan = SamplePlan();
  ASSERT_GT(plan.zero_fills_size(), 0);
  ASSERT_GT(plan.stats().cross_host_steps(), 0);
  EXPECT_THAT(HostsTakingPart(plan), ::testing::ElementsAre("h0", "h1", "h2", "h3"));
}

TEST(SliceForHost, KeepsExactlyTheHostsStepsAndFills) {
  const v1::TransferPlan plan = SamplePlan();
  const std::vector<std::string> old_hosts = OldHosts(plan);
  const std::vector<std::string> new_hosts = NewHosts(plan);
  std::map<std::string, int> step_seen;  // serialized step -> slices holding it
  for (const std::string& host : HostsTakingPart(plan)) {
    const v1::TransferPlan slice = SliceForHost(plan, host);
    EXPECT_TRUE(MessageDifferencer::Equals(slice.items(0), plan.items(0)));
    EXPECT_EQ(slice.items_size(), plan.items_size());
    EXPECT_TRUE(MessageDifferencer::Equals(slice.stats(), plan.stats()));
    EXPECT_TRUE(MessageDifferencer::Equals(slice.source_layout(), plan.source_layout()));
    EXPECT_TRUE(MessageDifferencer::Equals(slice.target_layout(), plan.target_layout()));
    for (const v1::CopyStep& step : slice.steps()) {
      const bool source = old_hosts[step.src_rank()] == host;
      const bool dest = new_hosts[step.dsts(0).rank()] == host;
      EXPECT_TRUE(source || dest) << host << ": " << step.ShortDebugString();
    }
    for (const v1::ZeroFill& fill : slice.zero_fills()) {
      EXPECT_EQ(new_hosts[fill.rank()], host);
    }
    for (const v1::CopyStep& step : slice.steps()) ++step_seen[step.SerializeAsString()];
  }
  // Every step is in its source's slice and its destinations' slice: one
  // slice when they share a host, two when it crosses.
  for (const v1::CopyStep& step : plan.steps()) {
    EXPECT_EQ(step_seen[step.SerializeAsString()], step.cross_host() ? 2 : 1)
        << step.ShortDebugString();
  }
  int fills = 0;
  for (const std::string& host : HostsTakingPart(plan)) {
    fills += SliceForHost(plan, host).zero_fills_size();
  }
  EXPECT_EQ(fills, plan.zero_fills_size());
  EXPECT_EQ(SliceForHost(plan, "elsewhere").steps_size(), 0);
}

// TransferPlan.regenerate entries go to the host of their new rank (its
// agent records them with the rank's buffer for the worker).
TEST(SliceForHost, KeepsTheHostsRegenerateEntries) {
  v1::TransferPlan plan = SamplePlan();
  const std::vector<std::string> new_hosts = NewHosts(plan);
  const int item = plan.items_size() - 1;
  for (int rank = 0; rank < static_cast<int>(new_hosts.size()); ++rank) {
    v1::Regenerate* g = plan.add_regenerate();
    g->set_rank(rank);
    g->set_item(item);
  }
  int entries = 0;
  for (const std::string& host : HostsTakingPart(plan)) {
    const v1::TransferPlan slice = SliceForHost(plan, host);
    for (const v1::Regenerate& g : slice.regenerate()) {
      EXPECT_EQ(new_hosts[g.rank()], host) << g.ShortDebugString();
      EXPECT_EQ(g.item(), item);
    }
    entries += slice.regenerate_size();
  }
  EXPECT_EQ(entries, plan.regenerate_size());
  EXPECT_EQ(SliceForHost(plan, "h0").regenerate_size(), 0);  // a source only
}

TEST(BytesWrittenByHost, EveryDestinationAndFill) {
  const v1::TransferPlan plan = SamplePlan();
  const std::vector<std::string> new_hosts = NewHosts(plan);
  std::map<std::string, int64_t> expected = {{"h0", 0}, {"h1", 0}, {"h2", 0}, {"h3", 0}};
  for (const v1::CopyStep& step : plan.steps()) {
    for (const v1::Destination& d : step.dsts()) expected[new_hosts[d.rank()]] += step.bytes();
  }
  for (const v1::ZeroFill& fill : plan.zero_fills()) {
    expected[new_hosts[fill.rank()]] += fill.count() * plan.items(fill.item()).element_bytes();
  }
  EXPECT_EQ(BytesWrittenByHost(plan), expected);
  EXPECT_EQ(BytesWrittenByHost(plan).at("h0"), 0);  // h0 only sends
  int64_t total = 0;
  for (const auto& [host, bytes] : expected) total += bytes;
  EXPECT_EQ(BytesTotal(plan), total);
  EXPECT_GE(total, plan.stats().bytes_local() + plan.stats().bytes_cross_host() +
                       plan.stats().bytes_zero_filled());
}

TEST(ShardsWrittenOnHost, CoverEveryNewShardOnce) {
  const v1::TransferPlan plan = SamplePlan();
  std::set<std::pair<int, int>> all;
  size_t sum = 0;
  for (const std::string& host : HostsTakingPart(plan)) {
    const auto shards = ShardsWrittenOnHost(plan, host);
    sum += shards.size();
    all.insert(shards.begin(), shards.end());
  }
  EXPECT_EQ(sum, all.size());  // no shard is written on two hosts
  EXPECT_TRUE(ShardsWrittenOnHost(plan, "h0").empty());
  // Every new rank gets every blob.
  const int blob = plan.items_size() - 1;
  for (int rank = 0; rank < 4; ++rank) EXPECT_EQ(all.count({blob, rank}), 1u) << rank;
}

// An HSDP job whose 2 replicas plan alone (TransferPlan.replicas): tp 2 pp
// 2 dp 4 dp_shard 2 -> tp 1 pp 2 dp 8 dp_shard 4 on h0..h7.
v1::TransferPlan RepeatingPlan() {
  absl::StatusOr<v1::TransferPlan> plan =
      planner::PlanTransfer(TwoLayerPtc(), test_support::HsdpLayout(2, 2, 4, 2, 2),
                            test_support::HsdpLayout(1, 2, 8, 4, 2), {});
  EXPECT_TRUE(plan.ok()) << plan.status();
  return plan.ok() ? *plan : v1::TransferPlan();
}

TEST(RepeatingPlan, EveryReadingEqualsTheWrittenOutPlans) {
  const v1::TransferPlan plan = RepeatingPlan();
  ASSERT_EQ(plan.replicas().count(), 2);
  const v1::TransferPlan whole = planner::ExpandReplicas(plan);
  ASSERT_EQ(whole.steps_size(), 2 * plan.steps_size());
  EXPECT_EQ(HostsTakingPart(plan), HostsTakingPart(whole));
  EXPECT_EQ(HostsTakingPart(plan).size(), 8u);
  EXPECT_EQ(BytesWrittenByHost(plan), BytesWrittenByHost(whole));
  EXPECT_EQ(BytesTotal(plan), BytesTotal(whole));
  int64_t sliced_steps = 0;
  for (const std::string& host : HostsTakingPart(whole)) {
    SCOPED_TRACE(host);
    const v1::TransferPlan slice = SliceForHost(plan, host);
    EXPECT_FALSE(slice.has_replicas());
    EXPECT_TRUE(MessageDifferencer::Equals(slice, SliceForHost(whole, host)));
    EXPECT_EQ(ShardsWrittenOnHost(plan, host), ShardsWrittenOnHost(whole, host));
    EXPECT_EQ(ShardsReadOnHost(plan, host), ShardsReadOnHost(whole, host));
    EXPECT_FALSE(ShardsWrittenOnHost(plan, host).empty());
    sliced_steps += slice.steps_size();
  }
  // A local step is in its host's slice, a cross-host step in two.
  EXPECT_EQ(sliced_steps, whole.steps_size() + plan.stats().cross_host_steps());
  EXPECT_GT(plan.stats().cross_host_steps(), 0);
}

TEST(StatsOf, EqualsToProtoStats) {
  const v1::Layout from = MakeLayout(2, 2, 1, {"h0", "h1"}, 2);
  const v1::Layout to = MakeLayout(1, 2, 2, {"h1", "h2"}, 2);
  absl::StatusOr<planner::Plan> plan = planner::MakePlan(TwoLayerPtc(), from, to, {});
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_TRUE(MessageDifferencer::Equals(planner::StatsOf(*plan),
                                         planner::ToProto(*plan, from, to).stats()));
}

TEST(RequestHash, IgnoresTheKeyAndNamesTheContent) {
  v1::ResizeRequest a;
  a.set_job_id("j");
  a.set_expected_generation(3);
  *a.mutable_placement() = test_support::HostsPlacement({"h0", "h1"}, 2);
  a.set_idempotency_key("k1");
  v1::ResizeRequest b = a;
  b.set_idempotency_key("k2");
  EXPECT_EQ(RequestHash(a), RequestHash(b));
  EXPECT_EQ(RequestHash(a).size(), 64u);
  // A known value pins the algorithm: hashes are stored and compared across
  // versions and replicas.
  v1::GetJobRequest empty;
  EXPECT_EQ(RequestHash(empty), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  b.set_expected_generation(4);
  EXPECT_NE(RequestHash(a), RequestHash(b));
  v1::MigrateRequest m;
  m.set_job_id("j");
  EXPECT_NE(RequestHash(m), RequestHash(a));
}

TEST(MakeIdempotency, EmptyKeyDisablesIt) {
  v1::DeleteJobRequest r;
  r.set_job_id("j");
  const Idempotency none = MakeIdempotency(KeyScope{{"team-a"}}, r);
  EXPECT_TRUE(none.key.empty());
  EXPECT_TRUE(none.request_hash.empty());
  EXPECT_TRUE(none.tenants.empty());
  r.set_idempotency_key("k");
  const Idempotency idem = MakeIdempotency(KeyScope{}, r);
  EXPECT_EQ(idem.key, "k");
  EXPECT_EQ(idem.method, "DeleteJob");
  EXPECT_EQ(idem.request_hash, RequestHash(r));
  EXPECT_TRUE(idem.tenants.empty());  // the admin's own scope
}

// The scope is the caller's set of tenants, whatever order its certificate
// or token lists them in.
TEST(MakeIdempotency, ScopeIsTheSortedSetOfTenants) {
  v1::ResizeRequest r;
  r.set_job_id("j");
  r.set_idempotency_key("k");
  EXPECT_EQ(MakeIdempotency(KeyScope{{"team-b", "team-a", "team-b"}}, r).tenants,
            (std::vector<std::string>{"team-a", "team-b"}));
  EXPECT_EQ(MakeIdempotency(KeyScope{{"team-a"}}, r).tenants,
            std::vector<std::string>{"team-a"});
}

// The method stored with a key is the request's own: no call site can pair
// a request with another method's name.
TEST(MakeIdempotency, MethodIsTheRequestsRpc) {
  EXPECT_EQ(RequestMethod(v1::RegisterJobRequest()), "RegisterJob");
  EXPECT_EQ(RequestMethod(v1::DeleteJobRequest()), "DeleteJob");
  EXPECT_EQ(RequestMethod(v1::ResizeRequest()), "Resize");
  EXPECT_EQ(RequestMethod(v1::MigrateRequest()), "Migrate");
  EXPECT_EQ(RequestMethod(v1::RecoverFromFailureRequest()), "RecoverFromFailure");
  EXPECT_EQ(RequestMethod(v1::CheckpointRequest()), "Checkpoint");
  EXPECT_EQ(RequestMethod(v1::CancelOperationRequest()), "CancelOperation");
}

TEST(NewId, ThirtyTwoHexCharsAndUnique) {
  std::set<std::string> ids;
  for (int i = 0; i < 1000; ++i) {
    const std::string id = NewId();
    ASSERT_TRUE(LooksLikeId(id)) << id;
    ids.insert(id);
  }
  EXPECT_EQ(ids.size(), 1000u);
  EXPECT_FALSE(LooksLikeId("0123"));
  EXPECT_FALSE(LooksLikeId("0123456789ABCDEF0123456789abcdef"));
}

TEST(TruncateError, KeepsShortTextsAndCutsLongOnes) {
  EXPECT_EQ(TruncateError("host \"h2\": disk full"), "host \"h2\": disk full");
  const std::string exact(kMaxErrorBytes, 'x');
  EXPECT_EQ(TruncateError(exact), exact);
  const std::string long_text = "tensor \"a\" " + std::string(10000, 'y');
  const std::string cut = TruncateError(long_text);
  EXPECT_LE(cut.size(), kMaxErrorBytes);
  EXPECT_THAT(cut, ::testing::StartsWith("tensor \"a\" yyy"));
  EXPECT_THAT(cut, HasSubstr("more bytes)"));
}

TEST(TruncateError, NeverSplitsAUtf8Character) {
  std::string text;
  while (text.size() < 3 * kMaxErrorBytes) text += "\xC3\xA9";  // U+00E9, 2 bytes
  for (size_t limit : {size_t{100}, size_t{101}, kMaxErrorBytes}) {
    const std::string cut = TruncateError(text, limit);
    EXPECT_LE(cut.size(), limit);
    const size_t body = cut.find("...");
    ASSERT_NE(body, std::string::npos);
    EXPECT_EQ(body % 2, 0u) << "cut inside a character at limit " << limit;
  }
}

TEST(RequestChecks, FieldsAndGenerations) {
  EXPECT_EQ(RequireNonEmpty("job_id", "").message(), "job_id is empty");
  EXPECT_TRUE(RequireNonEmpty("job_id", "x").ok());
  EXPECT_THAT(CheckExpectedGeneration(0).message(), HasSubstr("expected_generation is 0"));
  EXPECT_EQ(CheckExpectedGeneration(-1).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(CheckExpectedGeneration(1).ok());
}

TEST(RequestChecks, MigrateKeepsTheWorldSize) {
  const v1::ParallelConfig c = test_support::Config(2, 2, 1);
  EXPECT_TRUE(CheckMigrateWorld(c, test_support::HostsPlacement({"a", "b"}, 2)).ok());
  const absl::Status s = CheckMigrateWorld(c, test_support::HostsPlacement({"a", "b", "c"}, 2));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("placement has 6 slots but the job's world size is 4"));
}

TEST(RequestChecks, LostSets) {
  google::protobuf::RepeatedPtrField<std::string> hosts;
  google::protobuf::RepeatedField<int32_t> ranks;
  EXPECT_THAT(CheckLostFields(hosts, ranks).message(), HasSubstr("both empty"));
  ranks.Add(-2);
  EXPECT_THAT(CheckLostFields(hosts, ranks).message(), HasSubstr("lost_ranks[0] is -2"));
  ranks.Clear();
  *hosts.Add() = "";
  EXPECT_THAT(CheckLostFields(hosts, ranks).message(), HasSubstr("lost_hosts[0] is empty"));

  const v1::Layout current = MakeLayout(2, 2, 1, {"h0", "h1"}, 2);
  hosts.Clear();
  *hosts.Add() = "h9";
  EXPECT_THAT(CheckLostAgainst(current, current, hosts, ranks).message(),
              HasSubstr("host \"h9\" holds no rank of the current layout"));
  hosts.Clear();
  *hosts.Add() = "h1";
  EXPECT_THAT(CheckLostAgainst(current, current, hosts, ranks).message(),
              HasSubstr("rank 2 is on lost host \"h1\""));
  EXPECT_TRUE(CheckLostAgainst(current, MakeLayout(2, 2, 1, {"h0", "h2"}, 2), hosts, ranks).ok());
  hosts.Clear();
  ranks.Add(7);
  EXPECT_THAT(CheckLostAgainst(current, current, hosts, ranks).message(),
              HasSubstr("rank 7 is out of range"));
  ranks.Clear();
  ranks.Add(1);  // h0 device 1
  EXPECT_THAT(CheckLostAgainst(current, current, hosts, ranks).message(),
              HasSubstr("rank 1 is on host \"h0\" device 1, the device of a lost rank"));
  // On a live host that no lost_hosts name, the rank restarts in place.
  EXPECT_TRUE(CheckLostAgainst(current, current, hosts, ranks, {"h0"}).ok());
  EXPECT_THAT(CheckLostAgainst(current, current, hosts, ranks, {"h1"}).message(),
              HasSubstr("the device of a lost rank"));
}

TEST(NameNotFound, RewritesOnlyNotFound) {
  EXPECT_EQ(NameNotFound(absl::NotFoundError("no rows"), JobNotFound("j1")).message(),
            "job \"j1\" not found");
  EXPECT_EQ(NameNotFound(absl::UnavailableError("down"), JobNotFound("j1")).message(), "down");
}

}  // namespace
}  // namespace reshard::coordinator
