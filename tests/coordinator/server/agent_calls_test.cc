// AgentService's WaitForTasks on gRPC's callback API (docs/coordinator.md,
// "Agent calls: no thread per agent, heartbeats in batches"): a real gRPC
// server on port 0 in this process, the real AgentApi on a real PostgreSQL.
// 500 polls open at once add no thread per poll (the process's threads are
// counted) and, woken together, share a few store reads; a task created
// wakes its poll; a cancelled call releases its poll and its notifier
// subscription; the notifier's shutdown ends every poll; refusals and bad
// requests keep their codes.
#include <atomic>
#include <chrono>
#include <filesystem>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "reshard/v1/agent.grpc.pb.h"
#include "services/coordinator/logic/task_notifier.h"
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
using Clock = std::chrono::steady_clock;
using ::testing::Contains;
using ::testing::IsEmpty;

constexpr int kNeverMs = 600000;  // no safety re-read within a test

int ProcessThreads() {
  int n = 0;
  for ([[maybe_unused]] const auto& entry : std::filesystem::directory_iterator("/proc/self/task")) {
    ++n;
  }
  return n;
}

/// One WaitForTasks in flight on a completion queue (no client thread).
struct PendingPoll {
  grpc::ClientContext context;
  v1::WaitForTasksResponse reply;
  grpc::Status status;
  std::unique_ptr<grpc::ClientAsyncResponseReader<v1::WaitForTasksResponse>> call;
};

class AgentCallsTest : public LogicTest {
 protected:
  void SetUp() override {
    LogicTest::SetUp();
    if (HasFatalFailure()) return;
    PgStoreOptions options;
    options.dsn = dsn_;
    options.pool_size = 4;
    options.on_tasks_changed = [this](const std::vector<std::string>& hosts) {
      for (const std::string& host : hosts) notifier_.Notify(host);
    };
    absl::StatusOr<std::shared_ptr<PgStore>> store = PgStore::Connect(options);
    ASSERT_TRUE(store.ok()) << store.status();
    signalling_store_ = *store;
    AgentApi::Options agent_options;
    agent_options.lease_ms = kLeaseMs;
    agent_options.notifier = &notifier_;
    agent_options.safety_reread_ms = kNeverMs;
    api_on_grpc_ = std::make_unique<AgentApi>(signalling_store_, &clock_, metrics_.get(),
                                              agent_options);
    authorizer_ = std::make_unique<Authorizer>(/*insecure=*/true, nullptr);
    on_port_ = std::make_unique<AgentServiceOnPort>(api_on_grpc_.get(), authorizer_.get(),
                                                    metrics_.get());
    ASSERT_NE(on_port_->server, nullptr);
    service_ = &on_port_->service;
    stub_ = on_port_->stub.get();
  }

  void TearDown() override {
    notifier_.Shutdown();
    on_port_.reset();
    cq_.Shutdown();
    void* tag = nullptr;
    bool ok = false;
    while (cq_.Next(&tag, &ok)) {
    }
    api_on_grpc_.reset();
    signalling_store_.reset();
    LogicTest::TearDown();
  }

  std::unique_ptr<PendingPoll> StartPoll(const std::string& host, int wait_ms = 10000) {
    auto poll = std::make_unique<PendingPoll>();
    v1::WaitForTasksRequest request;
    request.set_host_id(host);
    request.set_wait_ms(wait_ms);
    poll->call = stub_->AsyncWaitForTasks(&poll->context, request, &cq_);
    poll->call->Finish(&poll->reply, &poll->status, poll.get());
    return poll;
  }

  /// The next poll to answer, within `within`; null when none did.
  PendingPoll* NextAnswer(std::chrono::milliseconds within) {
    void* tag = nullptr;
    bool ok = false;
    const grpc::CompletionQueue::NextStatus next =
        cq_.AsyncNext(&tag, &ok, std::chrono::system_clock::now() + within);
    if (next != grpc::CompletionQueue::GOT_EVENT) return nullptr;
    EXPECT_TRUE(ok);
    return static_cast<PendingPoll*>(tag);
  }

  /// One blocking call, answered.
  grpc::Status Call(const v1::WaitForTasksRequest& request, v1::WaitForTasksResponse* reply) {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
    return stub_->WaitForTasks(&context, request, reply);
  }

  TaskNotifier notifier_;
  std::shared_ptr<PgStore> signalling_store_;
  std::unique_ptr<AgentApi> api_on_grpc_;
  std::unique_ptr<Authorizer> authorizer_;
  std::unique_ptr<AgentServiceOnPort> on_port_;
  AgentServiceImpl* service_ = nullptr;
  v1::AgentService::Stub* stub_ = nullptr;
  grpc::CompletionQueue cq_;
};

TEST_F(AgentCallsTest, FiveHundredOpenPollsAddNoThreadPerPollReadTogetherAndCancelReleasesThem) {
  constexpr int kPolls = 500;
  std::vector<std::string> hosts;
  for (int i = 0; i < kPolls; ++i) hosts.push_back("h" + std::to_string(i));
  RegisterAgents(hosts);
  // Warm up: one poll answered, so that gRPC's own threads exist already.
  v1::WaitForTasksRequest warm;
  warm.set_host_id("h0");
  warm.set_wait_ms(1);
  v1::WaitForTasksResponse warm_reply;
  ASSERT_TRUE(Call(warm, &warm_reply).ok());
  const int before = ProcessThreads();

  std::vector<std::unique_ptr<PendingPoll>> polls;
  for (const std::string& host : hosts) polls.push_back(StartPoll(host));
  // Each poll read the store once and sleeps on the notifier.
  ASSERT_TRUE(Eventually([&] { return notifier_.subscribers() == kPolls; }))
      << notifier_.subscribers() << " polls subscribed";
  EXPECT_EQ(service_->waiting_polls(), static_cast<size_t>(kPolls));
  const int during = ProcessThreads();
  std::cout << "threads: " << before << " before, " << during << " with " << kPolls
            << " WaitForTasks polls open\n";
  EXPECT_LT(during - before, 30) << before << " threads before, " << during << " with " << kPolls
                                 << " polls open";
  EXPECT_EQ(NextAnswer(std::chrono::milliseconds(0)), nullptr) << "a poll answered early";

  // Every poll woken at once (a listener reconnected): they re-read together,
  // a few store reads for all 500, and wait again.
  const uint64_t reads_before = service_->poll_store_reads();
  notifier_.NotifyAll();
  ASSERT_TRUE(Eventually([&] { return notifier_.subscribers() == kPolls; }))
      << notifier_.subscribers() << " polls subscribed again";
  const uint64_t reads = service_->poll_store_reads() - reads_before;
  std::cout << kPolls << " polls woken at once re-read with " << reads << " store reads\n";
  EXPECT_LT(reads, 30u);
  EXPECT_EQ(NextAnswer(std::chrono::milliseconds(0)), nullptr) << "a poll answered without news";

  for (auto& poll : polls) poll->context.TryCancel();
  int cancelled = 0;
  for (int i = 0; i < kPolls; ++i) {
    PendingPoll* answered = NextAnswer(std::chrono::seconds(30));
    ASSERT_NE(answered, nullptr) << i << " of " << kPolls << " cancelled polls answered";
    if (answered->status.error_code() == grpc::StatusCode::CANCELLED) ++cancelled;
  }
  EXPECT_EQ(cancelled, kPolls);
  // The server saw every cancel: no poll, no subscription is left behind.
  ASSERT_TRUE(Eventually([&] { return service_->waiting_polls() == 0; }))
      << service_->waiting_polls() << " polls still waiting";
  EXPECT_EQ(notifier_.subscribers(), 0u);
}

TEST_F(AgentCallsTest, ATaskCreatedWakesItsPoll) {
  const v1::Job job = Register(TwoLayerJob("pickup"));
  RegisterAgents({"h0", "h1", "h2"});
  absl::StatusOr<v1::Operation> op = ResizeTo(job, MakeLayout(1, 2, 2, {"h1", "h2"}, 2));
  ASSERT_TRUE(op.ok()) << op.status();
  std::unique_ptr<PendingPoll> poll = StartPoll("h1");
  ASSERT_TRUE(Eventually([&] { return notifier_.subscribers() == 1; }));
  const auto created = Clock::now();
  std::unique_ptr<OperationDriver> driver = MakeDriver(signalling_store_);
  ASSERT_TRUE(driver->Tick().ok());
  PendingPoll* answered = NextAnswer(std::chrono::seconds(3));
  ASSERT_EQ(answered, poll.get()) << "no answer 3 s after the task was created";
  ASSERT_TRUE(poll->status.ok()) << poll->status.error_message();
  EXPECT_THAT(poll->reply.assigned_operations(), Contains(op->id()));
  EXPECT_LT(Clock::now() - created, std::chrono::seconds(3));
  EXPECT_EQ(service_->waiting_polls(), 0u);
  EXPECT_EQ(notifier_.subscribers(), 0u);
}

// A task created through a store that signals nothing (a lost
// notification): the poll's safety re-read (the timer thread) finds it.
TEST_F(AgentCallsTest, ALostNotificationIsCaughtByTheSafetyReread) {
  AgentApi::Options options;
  options.lease_ms = kLeaseMs;
  options.notifier = &notifier_;
  options.safety_reread_ms = 200;
  AgentApi api(signalling_store_, &clock_, metrics_.get(), options);
  AgentServiceOnPort on_port(&api, authorizer_.get(), metrics_.get());
  ASSERT_NE(on_port.server, nullptr);
  const v1::Job job = Register(TwoLayerJob("pickup"));
  RegisterAgents({"h0", "h1", "h2"});
  absl::StatusOr<v1::Operation> op = ResizeTo(job, MakeLayout(1, 2, 2, {"h1", "h2"}, 2));
  ASSERT_TRUE(op.ok()) << op.status();
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
  v1::WaitForTasksRequest request;
  request.set_host_id("h1");
  request.set_wait_ms(10000);
  v1::WaitForTasksResponse reply;
  grpc::Status status;
  std::atomic<bool> answered{false};
  on_port.stub->async()->WaitForTasks(&context, &request, &reply, [&](grpc::Status s) {
    status = s;
    answered = true;
  });
  ASSERT_TRUE(Eventually([&] { return notifier_.subscribers() == 1; }));
  const auto created = Clock::now();
  std::unique_ptr<OperationDriver> driver = MakeDriver(store_);  // signals nothing
  ASSERT_TRUE(driver->Tick().ok());
  ASSERT_TRUE(Eventually([&] { return answered.load(); }, absl::Seconds(5)));
  ASSERT_TRUE(status.ok()) << status.error_message();
  EXPECT_THAT(reply.assigned_operations(), Contains(op->id()));
  // One safety period (200 ms) plus the grid (100 ms) and a busy machine.
  EXPECT_LT(Clock::now() - created, std::chrono::seconds(2));
  EXPECT_EQ(notifier_.subscribers(), 0u);
}

TEST_F(AgentCallsTest, APollEndsAtItsWaitWithTheListAsItIs) {
  RegisterAgents({"h0"});
  v1::WaitForTasksRequest request;
  request.set_host_id("h0");
  request.set_wait_ms(200);
  v1::WaitForTasksResponse reply;
  const auto start = Clock::now();
  const grpc::Status status = Call(request, &reply);
  ASSERT_TRUE(status.ok()) << status.error_message();
  EXPECT_GE(Clock::now() - start, std::chrono::milliseconds(200));
  EXPECT_THAT(reply.assigned_operations(), IsEmpty());
  EXPECT_EQ(service_->waiting_polls(), 0u);
}

TEST_F(AgentCallsTest, TheNotifiersShutdownEndsEveryPoll) {
  RegisterAgents({"h0", "h1"});
  std::vector<std::unique_ptr<PendingPoll>> polls;
  for (int i = 0; i < 20; ++i) polls.push_back(StartPoll(i % 2 == 0 ? "h0" : "h1"));
  ASSERT_TRUE(Eventually([&] { return notifier_.subscribers() == 20; }));
  notifier_.Shutdown();
  for (int i = 0; i < 20; ++i) {
    PendingPoll* answered = NextAnswer(std::chrono::seconds(3));
    ASSERT_NE(answered, nullptr) << i << " of 20 polls answered after the shutdown";
    EXPECT_TRUE(answered->status.ok()) << answered->status.error_message();
    EXPECT_THAT(answered->reply.assigned_operations(), IsEmpty());
  }
  EXPECT_EQ(service_->waiting_polls(), 0u);
}

TEST_F(AgentCallsTest, BadRequestsKeepTheirCodes) {
  v1::WaitForTasksRequest request;
  request.set_host_id("nobody");
  v1::WaitForTasksResponse reply;
  grpc::Status status = Call(request, &reply);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::NOT_FOUND) << status.error_message();
  EXPECT_THAT(status.error_message(), ::testing::HasSubstr("nobody"));
  RegisterAgents({"h0"});
  request.set_host_id("h0");
  request.set_wait_ms(-1);
  status = Call(request, &reply);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << status.error_message();
  EXPECT_EQ(service_->waiting_polls(), 0u);
}

// Admission runs as for every other handler: without a certificate or a
// token (and not --insecure) the call is refused before any store read.
TEST_F(AgentCallsTest, AnUnauthenticatedPollIsRefused) {
  Authorizer strict(/*insecure=*/false, nullptr);
  AgentServiceOnPort strict_service(api_on_grpc_.get(), &strict, metrics_.get());
  ASSERT_NE(strict_service.server, nullptr);
  grpc::ClientContext context;
  v1::WaitForTasksRequest request;
  request.set_host_id("h0");
  v1::WaitForTasksResponse reply;
  const grpc::Status status = strict_service.stub->WaitForTasks(&context, request, &reply);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::UNAUTHENTICATED) << status.error_message();
}

}  // namespace
}  // namespace reshard::coordinator::testing
