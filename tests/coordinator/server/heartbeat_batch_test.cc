// Heartbeats in batches (docs/coordinator.md, "Agent calls: no thread per
// agent, heartbeats in batches"), against the real PostgreSQL: the
// PostgreSQL store's one-transaction HeartbeatHosts tells every host what the
// per-host methods would (assigned operations, generations to release and
// to discard, deleted jobs); a batch with an unknown host and a stale epoch
// answers the others; the batcher writes N queued heartbeats with one store
// call; Heartbeat over gRPC (callback API) renews the lease it answers.
#include <chrono>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "gmock/gmock.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "reshard/v1/agent.grpc.pb.h"
#include "services/coordinator/logic/heartbeat_batcher.h"
#include "services/coordinator/server/agent_service.h"
#include "services/coordinator/server/auth.h"
#include "tests/coordinator/harness/eventually.h"
#include "tests/coordinator/logic/logic_fixture.h"
#include "tests/coordinator/server/agent_service_on_port.h"
#include "tests/support/jobs.h"

namespace reshard::coordinator::testing {
namespace {

using test_support::MakeLayout;
using test_support::TwoLayerJob;
using ::testing::HasSubstr;

std::string Text(const HostHeartbeatResult& r) {
  std::string s = r.status.ToString() + " assigned:";
  for (const std::string& id : r.assigned_operations) s += " " + id;
  s += " release:";
  for (const v1::GenerationRef& g : r.release)
    s += " " + g.job_id() + "@" + std::to_string(g.generation());
  s += " discard:";
  for (const v1::GenerationRef& g : r.discard)
    s += " " + g.job_id() + "@" + std::to_string(g.generation());
  s += " deleted:";
  for (const std::string& id : r.deleted_jobs) s += " " + id;
  return s;
}

class HeartbeatBatchTest : public LogicTest {
 protected:
  HostHeartbeat Beat(const std::string& host, std::vector<std::string> held = {}) {
    HostHeartbeat beat;
    beat.host_id = host;
    beat.epoch = epochs_.count(host) != 0 ? epochs_[host] : 1;
    beat.now_unix_ms = clock_.NowUnixMs();
    beat.lease_expires_unix_ms = beat.now_unix_ms + kLeaseMs;
    beat.held_jobs = std::move(held);
    return beat;
  }

  v1::HeartbeatRequest Request(const std::string& host, int64_t epoch) {
    v1::HeartbeatRequest request;
    request.set_host_id(host);
    request.set_epoch(epoch);
    return request;
  }
};

// One committed resize (its old generation RETIRED: to release), one in
// TRANSFERRING (assigned), a deleted job among the held ones: the batch
// query tells each host exactly what the per-host methods tell it.
TEST_F(HeartbeatBatchTest, OneTransactionTellsWhatThePerHostCallsTell) {
  RegisterAgents({"h0", "h1", "h2", "h3"});
  const v1::Job done_job = Register(TwoLayerJob("committed"));
  const v1::Operation done_op = StartTransfer(done_job, MakeLayout(1, 2, 2, {"h1", "h2"}, 2));
  for (const std::string& host : Participants(done_op.id())) CompleteTask(host, done_op.id());
  Tick();
  ASSERT_EQ(Op(done_op.id()).state(), v1::OPERATION_STATE_COMMITTED);
  const v1::Job busy_job = Register(TwoLayerJob("busy"));
  const v1::Operation busy_op = StartTransfer(busy_job, MakeLayout(1, 2, 2, {"h0", "h2"}, 2));
  const std::vector<HostHeartbeat> beats = {Beat("h0", {done_job.id(), "job-gone"}), Beat("h1"),
                                            Beat("h2", {"job-gone"}), Beat("h3")};

  absl::StatusOr<std::vector<HostHeartbeatResult>> batched = store_->HeartbeatHosts(beats);
  ASSERT_TRUE(batched.ok()) << batched.status();
  absl::StatusOr<std::vector<HostHeartbeatResult>> one_by_one =
      store_->Store::HeartbeatHosts(beats);
  ASSERT_TRUE(one_by_one.ok()) << one_by_one.status();
  ASSERT_EQ(batched->size(), beats.size());
  ASSERT_EQ(one_by_one->size(), beats.size());
  for (size_t i = 0; i < beats.size(); ++i) {
    EXPECT_EQ(Text((*batched)[i]), Text((*one_by_one)[i])) << beats[i].host_id;
  }
  // WaitForTasks' read for many hosts at once agrees too.
  const std::vector<std::string> hosts = {"h0", "h1", "h2", "h3"};
  absl::StatusOr<std::map<std::string, std::vector<std::string>>> of_hosts =
      store_->AssignedOperationsOfHosts(hosts);
  ASSERT_TRUE(of_hosts.ok()) << of_hosts.status();
  for (size_t i = 0; i < hosts.size(); ++i) {
    auto it = of_hosts->find(hosts[i]);
    EXPECT_EQ(it == of_hosts->end() ? std::vector<std::string>() : it->second,
              (*one_by_one)[i].assigned_operations)
        << hosts[i];
  }
  // The state is what the test built, so the comparison compared something.
  EXPECT_THAT((*batched)[2].assigned_operations, ::testing::Contains(busy_op.id()));
  EXPECT_THAT((*batched)[0].deleted_jobs, ::testing::ElementsAre("job-gone"));
  EXPECT_EQ((*batched)[3].assigned_operations.size(), 0u);
  bool released = false;
  for (const HostHeartbeatResult& r : *batched) {
    for (const v1::GenerationRef& g : r.release) {
      released |= g.job_id() == done_job.id() && g.generation() == done_job.generation();
    }
  }
  EXPECT_TRUE(released) << "no host was told to release generation " << done_job.generation()
                        << " of the committed job";
}

TEST_F(HeartbeatBatchTest, AnUnknownHostAndAStaleEpochAreRefusedAloneAndTheOthersRenewed) {
  RegisterAgents({"h0", "h1"});
  RegisterAgents({"h1"});  // epoch 2: the beat for epoch 1 is stale
  clock_.Advance(1234);
  const std::vector<v1::HeartbeatRequest> requests = {Request("h0", epochs_["h0"]),
                                                      Request("nobody", 1), Request("h1", 1),
                                                      Request("h1", epochs_["h1"]), Request("", 1)};
  std::vector<const v1::HeartbeatRequest*> pointers;
  for (const v1::HeartbeatRequest& r : requests) pointers.push_back(&r);
  std::vector<absl::StatusOr<v1::HeartbeatResponse>> answers = agents_->HeartbeatMany(pointers);
  ASSERT_EQ(answers.size(), requests.size());
  EXPECT_TRUE(answers[0].ok()) << answers[0].status();
  EXPECT_EQ(answers[1].status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(answers[1].status().message(), HasSubstr("\"nobody\""));
  EXPECT_EQ(answers[2].status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(answers[2].status().message(),
              HasSubstr("epoch 1 but the latest registration is epoch 2"));
  EXPECT_TRUE(answers[3].ok()) << answers[3].status();
  EXPECT_EQ(answers[4].status().code(), absl::StatusCode::kInvalidArgument);
  for (const std::string host : {"h0", "h1"}) {
    absl::StatusOr<v1::Host> h = store_->GetHost(host);
    ASSERT_TRUE(h.ok()) << h.status();
    EXPECT_EQ(h->lease_expires_unix_ms(), clock_.NowUnixMs() + kLeaseMs) << host;
  }
}

// Full batches leave at once: N heartbeats queued while the batch waits
// (max_wait far beyond the test) are written by one store call.
TEST_F(HeartbeatBatchTest, TheBatcherWritesAFullBatchWithOneStoreCall) {
  constexpr int kHosts = 40;
  std::vector<std::string> hosts;
  for (int i = 0; i < kHosts; ++i) hosts.push_back("h" + std::to_string(i));
  RegisterAgents(hosts);
  HeartbeatBatcher::Options options;
  options.max_wait_ms = 600000;
  options.max_batch = kHosts + 1;  // the unknown host fills it
  HeartbeatBatcher batcher(agents_.get(), options);
  std::mutex mu;
  std::vector<absl::StatusCode> codes(kHosts + 1, absl::StatusCode::kUnknown);
  int answered = 0;
  for (int i = 0; i <= kHosts; ++i) {
    const v1::HeartbeatRequest request =
        i < kHosts ? Request(hosts[i], epochs_[hosts[i]]) : Request("nobody", 1);
    batcher.Submit(request, [&, i](HeartbeatBatcher::Answer answer) {
      std::lock_guard<std::mutex> l(mu);
      codes[i] = answer.status().code();
      if (answer.ok()) {
        EXPECT_EQ(answer->lease_ms(), kLeaseMs);
      }
      ++answered;
    });
  }
  ASSERT_TRUE(Eventually([&] {
    std::lock_guard<std::mutex> l(mu);
    return answered == kHosts + 1;
  }));
  for (int i = 0; i < kHosts; ++i) EXPECT_EQ(codes[i], absl::StatusCode::kOk) << hosts[i];
  EXPECT_EQ(codes[kHosts], absl::StatusCode::kNotFound);
  const HeartbeatBatcher::Stats stats = batcher.stats();
  EXPECT_EQ(stats.batches, 1u);
  EXPECT_EQ(stats.heartbeats, static_cast<uint64_t>(kHosts + 1));
  batcher.Shutdown();
  // After the shutdown a heartbeat is refused at once, retryably.
  absl::StatusCode late = absl::StatusCode::kOk;
  batcher.Submit(Request(hosts[0], epochs_[hosts[0]]),
                 [&](HeartbeatBatcher::Answer answer) { late = answer.status().code(); });
  EXPECT_EQ(late, absl::StatusCode::kUnavailable);
}

// LagMs (what the leader reads before judging leases, lease_judge.h) is the
// age of the oldest beat not yet answered: 0 when none waits, growing while
// one is queued, 0 again once its batch is answered.
TEST_F(HeartbeatBatchTest, LagIsTheAgeOfTheOldestBeatNotYetAnswered) {
  RegisterAgents({"h0", "h1"});
  HeartbeatBatcher::Options options;
  options.max_wait_ms = 600000;  // the first beat waits for a full batch
  options.max_batch = 2;
  HeartbeatBatcher batcher(agents_.get(), options);
  EXPECT_EQ(batcher.LagMs(), 0);
  std::mutex mu;
  int answered = 0;
  auto count = [&](HeartbeatBatcher::Answer answer) {
    EXPECT_TRUE(answer.ok()) << answer.status();
    std::lock_guard<std::mutex> l(mu);
    ++answered;
  };
  const auto submitted = std::chrono::steady_clock::now();
  batcher.Submit(Request("h0", epochs_["h0"]), count);
  ASSERT_TRUE(Eventually([&] { return batcher.LagMs() >= 100; }));
  const int64_t lag = batcher.LagMs();
  const int64_t waited = std::chrono::duration_cast<std::chrono::milliseconds>(
                             std::chrono::steady_clock::now() - submitted)
                             .count();
  EXPECT_LE(lag, waited);
  batcher.Submit(Request("h1", epochs_["h1"]), count);  // fills the batch
  ASSERT_TRUE(Eventually([&] {
    std::lock_guard<std::mutex> l(mu);
    return answered == 2;
  }));
  EXPECT_TRUE(Eventually([&] { return batcher.LagMs() == 0; }));
}

// One agent's bad beat (a NUL byte in held_jobs, from a registered host and
// from one nobody registered) lands in the same batch as every live host's:
// it alone is refused, INVALID_ARGUMENT naming the field and value, and
// every other host is renewed and answered OK. Before, the first bad beat
// was the whole batch's answer, so one agent that sent it back to back kept
// every live host from renewing its lease until all were LOST.
TEST_F(HeartbeatBatchTest, OneBadBeatDoesNotFailTheOthersInItsBatch) {
  constexpr int kHosts = 20;
  std::vector<std::string> hosts;
  for (int i = 0; i < kHosts; ++i) hosts.push_back("h" + std::to_string(i));
  RegisterAgents(hosts);
  clock_.Advance(4321);
  HeartbeatBatcher::Options options;
  options.max_wait_ms = 600000;
  options.max_batch = kHosts + 2;  // the two bad beats fill it: one batch
  HeartbeatBatcher batcher(agents_.get(), options);
  std::mutex mu;
  std::vector<absl::Status> answers(kHosts + 2);
  int answered = 0;
  auto submit = [&](int i, v1::HeartbeatRequest request) {
    batcher.Submit(request, [&, i](HeartbeatBatcher::Answer answer) {
      std::lock_guard<std::mutex> l(mu);
      answers[i] = answer.status();
      ++answered;
    });
  };
  v1::HeartbeatRequest poisoned = Request(hosts[3], epochs_[hosts[3]]);
  poisoned.add_held_jobs(std::string("\0", 1));
  submit(0, poisoned);
  for (int i = 0; i < kHosts; ++i) {
    if (i != 3) submit(i + 1, Request(hosts[i], epochs_[hosts[i]]));
  }
  v1::HeartbeatRequest stranger = Request("nobody", 1);
  stranger.add_held_jobs(std::string("\0", 1));
  submit(kHosts, stranger);
  submit(kHosts + 1, Request(hosts[3], epochs_[hosts[3]]));  // its own good beat
  ASSERT_TRUE(Eventually([&] {
    std::lock_guard<std::mutex> l(mu);
    return answered == kHosts + 2;
  }));
  EXPECT_EQ(batcher.stats().batches, 1u);
  const absl::Status refused =
      absl::InvalidArgumentError("held_jobs entry \"\\x00\" contains a NUL byte");
  EXPECT_EQ(answers[0], refused);
  EXPECT_EQ(answers[kHosts], refused);
  for (int i = 1; i < kHosts; ++i) EXPECT_TRUE(answers[i].ok()) << i << ": " << answers[i];
  EXPECT_TRUE(answers[kHosts + 1].ok()) << answers[kHosts + 1];
  for (const std::string& host : hosts) {
    absl::StatusOr<v1::Host> h = store_->GetHost(host);
    ASSERT_TRUE(h.ok()) << h.status();
    EXPECT_EQ(h->lease_expires_unix_ms(), clock_.NowUnixMs() + kLeaseMs) << host;
  }
  batcher.Shutdown();
}

// Over gRPC (the callback API): the answer comes after the batch committed,
// so the lease it names is in the database when the agent reads it.
TEST_F(HeartbeatBatchTest, HeartbeatOverGrpcRenewsTheLeaseItAnswers) {
  RegisterAgents({"h0"});
  Authorizer authorizer(/*insecure=*/true, nullptr);
  AgentServiceOnPort on_port(agents_.get(), &authorizer, metrics_.get());
  ASSERT_NE(on_port.server, nullptr);
  clock_.Advance(5000);
  for (const auto& [host, epoch, code] :
       std::vector<std::tuple<std::string, int64_t, grpc::StatusCode>>{
           {"h0", epochs_["h0"], grpc::StatusCode::OK},
           {"nobody", 1, grpc::StatusCode::NOT_FOUND},
           {"h0", 0, grpc::StatusCode::INVALID_ARGUMENT}}) {
    grpc::ClientContext context;
    v1::HeartbeatResponse reply;
    const grpc::Status status = on_port.stub->Heartbeat(&context, Request(host, epoch), &reply);
    EXPECT_EQ(status.error_code(), code) << host << ": " << status.error_message();
    if (status.ok()) {
      EXPECT_EQ(reply.lease_ms(), kLeaseMs);
    }
  }
  absl::StatusOr<v1::Host> h0 = store_->GetHost("h0");
  ASSERT_TRUE(h0.ok()) << h0.status();
  EXPECT_EQ(h0->lease_expires_unix_ms(), clock_.NowUnixMs() + kLeaseMs);
  // Each went through the batcher; the bad ones were refused there alone.
  EXPECT_EQ(on_port.service.heartbeat_stats().heartbeats, 3u);
}

// Through the real gRPC server: concurrent agents' Heartbeat calls, one of
// them with held_jobs=["\0"] (from a host nobody registered), land in one
// batch (max_batch is the number of callers). The bad caller alone gets
// INVALID_ARGUMENT naming the field and value; every good host is answered
// OK and renewed, so none can be made LOST by another's beats.
TEST_F(HeartbeatBatchTest, ABadBeatOverGrpcFailsOnlyItsOwnCaller) {
  constexpr int kHosts = 8;
  std::vector<std::string> hosts;
  for (int i = 0; i < kHosts; ++i) hosts.push_back("h" + std::to_string(i));
  RegisterAgents(hosts);
  clock_.Advance(4321);
  Authorizer authorizer(/*insecure=*/true, nullptr);
  HeartbeatBatcher::Options options;
  options.max_wait_ms = 600000;  // the batch is written once all callers are in it
  options.max_batch = kHosts + 1;
  AgentServiceOnPort on_port(agents_.get(), &authorizer, metrics_.get(), options);
  ASSERT_NE(on_port.server, nullptr);
  std::vector<grpc::Status> statuses(kHosts + 1);
  std::vector<std::thread> callers;
  for (int i = 0; i <= kHosts; ++i) {
    callers.emplace_back([&, i] {
      v1::HeartbeatRequest request =
          i < kHosts ? Request(hosts[i], epochs_[hosts[i]]) : Request("stranger", 1);
      if (i == kHosts) request.add_held_jobs(std::string("\0", 1));
      grpc::ClientContext context;
      context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
      v1::HeartbeatResponse reply;
      statuses[i] = on_port.stub->Heartbeat(&context, request, &reply);
    });
  }
  for (std::thread& caller : callers) caller.join();
  EXPECT_EQ(statuses[kHosts].error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(statuses[kHosts].error_message(), "held_jobs entry \"\\x00\" contains a NUL byte");
  for (int i = 0; i < kHosts; ++i) {
    EXPECT_TRUE(statuses[i].ok()) << hosts[i] << ": " << statuses[i].error_message();
    absl::StatusOr<v1::Host> h = store_->GetHost(hosts[i]);
    ASSERT_TRUE(h.ok()) << h.status();
    EXPECT_EQ(h->state(), v1::HOST_STATE_ALIVE) << hosts[i];
    EXPECT_EQ(h->lease_expires_unix_ms(), clock_.NowUnixMs() + kLeaseMs) << hosts[i];
  }
  EXPECT_EQ(on_port.service.heartbeat_stats().batches, 1u);
  EXPECT_EQ(on_port.service.heartbeat_stats().heartbeats, static_cast<uint64_t>(kHosts + 1));
}

}  // namespace
}  // namespace reshard::coordinator::testing
