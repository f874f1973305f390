// The measurement behind docs/coordinator.md's "Agent calls: no thread per
// agent, heartbeats in batches": 2,000 simulated agents, each holding one
// WaitForTasks poll and sending heartbeats back to back (closed loop: the
// next as soon as the last is answered), against a real gRPC server on port
// 0 in this process and the real PostgreSQL. It prints heartbeats/s
// sustained, heartbeats per store transaction, and the process's threads,
// and checks what must hold on any machine: every heartbeat answered OK,
// batches of more than one, no thread per agent.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <filesystem>
#include <iostream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "grpcpp/grpcpp.h"
#include "reshard/v1/agent.grpc.pb.h"
#include "services/coordinator/logic/task_notifier.h"
#include "services/coordinator/server/agent_service.h"
#include "services/coordinator/server/auth.h"
#include "tests/coordinator/server/agent_service_on_port.h"
#include "tests/coordinator/harness/eventually.h"
#include "tests/coordinator/logic/logic_fixture.h"

namespace reshard::coordinator::testing {
namespace {

using Clock = std::chrono::steady_clock;

constexpr int kAgents = 2000;
constexpr auto kRun = std::chrono::seconds(5);

int ProcessThreads() {
  int n = 0;
  for ([[maybe_unused]] const auto& e : std::filesystem::directory_iterator("/proc/self/task")) ++n;
  return n;
}

// One agent's calls in flight on the completion queue.
struct SimAgent {
  std::string host;
  int64_t epoch = 0;
  grpc::ClientContext poll_context;
  v1::WaitForTasksResponse poll_reply;
  grpc::Status poll_status;
  std::unique_ptr<grpc::ClientAsyncResponseReader<v1::WaitForTasksResponse>> poll;
  std::unique_ptr<grpc::ClientContext> beat_context;
  v1::HeartbeatResponse beat_reply;
  grpc::Status beat_status;
  std::unique_ptr<grpc::ClientAsyncResponseReader<v1::HeartbeatResponse>> beat;
};

// Tags: the agent's index, times two, plus 1 for its poll.
void* Tag(int agent, bool poll) { return reinterpret_cast<void*>(uintptr_t(agent) * 2 + poll); }

class AgentLoadTest : public LogicTest {
 protected:
  /// The run; `max_batch` 1 is the same path without batching, to compare.
  void Run(size_t max_batch);
};

void AgentLoadTest::Run(size_t max_batch) {
  TaskNotifier notifier;
  AgentApi::Options options;
  options.lease_ms = kLeaseMs;
  options.notifier = &notifier;
  AgentApi api(store_, &clock_, metrics_.get(), options);
  Authorizer authorizer(/*insecure=*/true, nullptr);
  HeartbeatBatcher::Options batching;
  batching.max_batch = max_batch;
  AgentServiceOnPort on_port(&api, &authorizer, metrics_.get(), batching);
  ASSERT_NE(on_port.server, nullptr);
  AgentServiceImpl& service = on_port.service;
  v1::AgentService::Stub* stub = on_port.stub.get();

  const auto register_start = Clock::now();
  std::vector<std::string> hosts;
  for (int i = 0; i < kAgents; ++i) hosts.push_back("sim-" + std::to_string(i));
  RegisterAgents(hosts);
  const std::chrono::duration<double> registered = Clock::now() - register_start;
  {  // one call answered: gRPC's own threads exist before counting
    grpc::ClientContext context;
    v1::HeartbeatRequest request;
    request.set_host_id(hosts[0]);
    request.set_epoch(epochs_[hosts[0]]);
    v1::HeartbeatResponse reply;
    ASSERT_TRUE(stub->Heartbeat(&context, request, &reply).ok());
  }
  const int threads_before = ProcessThreads();

  grpc::CompletionQueue cq;
  std::vector<std::unique_ptr<SimAgent>> agents;
  auto send_beat = [&](int i) {
    SimAgent& a = *agents[i];
    a.beat_context = std::make_unique<grpc::ClientContext>();
    v1::HeartbeatRequest request;
    request.set_host_id(a.host);
    request.set_epoch(a.epoch);
    a.beat = stub->AsyncHeartbeat(a.beat_context.get(), request, &cq);
    a.beat->Finish(&a.beat_reply, &a.beat_status, Tag(i, false));
  };
  for (int i = 0; i < kAgents; ++i) {
    auto a = std::make_unique<SimAgent>();
    a->host = hosts[i];
    a->epoch = epochs_[hosts[i]];
    v1::WaitForTasksRequest request;
    request.set_host_id(a->host);
    request.set_wait_ms(10000);
    a->poll = stub->AsyncWaitForTasks(&a->poll_context, request, &cq);
    a->poll->Finish(&a->poll_reply, &a->poll_status, Tag(i, true));
    agents.push_back(std::move(a));
  }
  ASSERT_TRUE(Eventually([&] { return notifier.subscribers() == kAgents; }))
      << notifier.subscribers() << " of " << kAgents << " polls waiting";

  const HeartbeatBatcher::Stats stats_before = service.heartbeat_stats();
  const auto start = Clock::now();
  for (int i = 0; i < kAgents; ++i) send_beat(i);
  int64_t answered = 0;
  int64_t failed = 0;
  int peak_threads = 0;
  int in_flight = kAgents;
  while (in_flight > 0) {
    void* tag = nullptr;
    bool ok = false;
    ASSERT_TRUE(cq.Next(&tag, &ok));
    const int i = static_cast<int>(reinterpret_cast<uintptr_t>(tag) / 2);
    ASSERT_FALSE(reinterpret_cast<uintptr_t>(tag) % 2) << "a poll answered during the run";
    --in_flight;
    ++answered;
    if (!agents[i]->beat_status.ok()) ++failed;
    if (answered % 2000 == 0) peak_threads = std::max(peak_threads, ProcessThreads());
    if (Clock::now() - start < kRun) {
      send_beat(i);
      ++in_flight;
    }
  }
  const std::chrono::duration<double> ran = Clock::now() - start;
  const HeartbeatBatcher::Stats stats = service.heartbeat_stats();
  const uint64_t batches = stats.batches - stats_before.batches;
  const uint64_t beats = stats.heartbeats - stats_before.heartbeats;
  std::cout << "max_batch " << max_batch << ": agents: " << kAgents << " (registered in " << registered.count() << " s)\n"
            << "heartbeats: " << answered << " in " << ran.count() << " s = "
            << answered / ran.count() << "/s sustained, closed loop\n"
            << "store transactions: " << batches << " (" << double(beats) / batches
            << " heartbeats each, largest " << stats.largest_batch << ")\n"
            << "threads: " << threads_before << " before the polls, at most " << peak_threads
            << " with " << kAgents << " polls open and heartbeats flowing\n";
  EXPECT_EQ(failed, 0);
  if (max_batch > 1) {
    EXPECT_GT(double(beats) / batches, 2.0) << "heartbeats were not batched";
  }
  EXPECT_LT(peak_threads - threads_before, 30);

  for (auto& a : agents) a->poll_context.TryCancel();
  for (int i = 0; i < kAgents; ++i) {
    void* tag = nullptr;
    bool ok = false;
    ASSERT_TRUE(cq.Next(&tag, &ok));
  }
  ASSERT_TRUE(Eventually([&] { return service.waiting_polls() == 0; }));
  notifier.Shutdown();
  on_port.server->Shutdown(std::chrono::system_clock::now());
  cq.Shutdown();
  void* tag = nullptr;
  bool ok = false;
  while (cq.Next(&tag, &ok)) {
  }
}

TEST_F(AgentLoadTest, TwoThousandAgentsPollAndHeartbeatInBatches) { Run(2000); }

TEST_F(AgentLoadTest, TwoThousandAgentsPollAndHeartbeatOneByOne) { Run(1); }

}  // namespace
}  // namespace reshard::coordinator::testing
