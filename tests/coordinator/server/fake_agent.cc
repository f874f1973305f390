#include "tests/coordinator/server/fake_agent.h"

#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/rpc/status.h"
#include "grpcpp/grpcpp.h"
#include "planner/layout.h"
#include "tests/coordinator/server/test_channel.h"
#include "tests/support/job_builders.h"

namespace reshard::coordinator::testing {
namespace {

constexpr absl::Duration kCallTimeout = absl::Seconds(5);

void SetDeadline(grpc::ClientContext* context) {
  context->set_deadline(absl::ToChronoTime(absl::Now() + kCallTimeout));
}

// Written from the plan's definition, not from the coordinator's code.
std::vector<v1::ShardChecksum> ChecksumsFor(const v1::HostTask& task, const std::string& host) {
  return ShardChecksumsFor(task, host, [&task](int item, int rank) {
    return std::hash<std::string>()(absl::StrCat(task.operation_id(), "/", item, "/", rank));
  });
}

}  // namespace

std::vector<v1::ShardChecksum> ShardChecksumsFor(
    const v1::HostTask& task, const std::string& host,
    const std::function<uint64_t(int item, int rank)>& checksum) {
  const std::vector<v1::DeviceSlot> slots =
      planner::ExpandPlacement(task.plan().target_layout().placement());
  auto on_host = [&](int rank) {
    return rank >= 0 && rank < static_cast<int>(slots.size()) && slots[rank].host() == host;
  };
  std::map<std::pair<int, int>, int64_t> bytes;
  for (const v1::CopyStep& step : task.plan().steps()) {
    for (const v1::Destination& dst : step.dsts()) {
      if (on_host(dst.rank())) bytes[{step.item(), dst.rank()}] += step.bytes();
    }
  }
  for (const v1::ZeroFill& fill : task.plan().zero_fills()) {
    if (!on_host(fill.rank())) continue;
    const int element_bytes =
        fill.item() < task.plan().items_size() ? task.plan().items(fill.item()).element_bytes() : 0;
    bytes[{fill.item(), fill.rank()}] += fill.count() * element_bytes;
  }
  std::vector<v1::ShardChecksum> out;
  for (const auto& [shard, n] : bytes) {
    v1::ShardChecksum sum;
    sum.set_item(shard.first);
    sum.set_rank(shard.second);
    sum.set_checksum(checksum(shard.first, shard.second));
    sum.set_bytes(n);
    out.push_back(sum);
  }
  return out;
}

FakeAgent::FakeAgent(std::string host_id, int devices)
    : host_id_(std::move(host_id)), devices_(devices) {}

FakeAgent::~FakeAgent() { Stop(); }

void FakeAgent::SetCoordinator(const std::string& address) {
  // Each fake agent has its own host's certificate, as a real one does.
  auto channel = TestChannel(
      address, DefaultTestInsecure() ? kInsecureIdentity : absl::StrCat("agent:", host_id_));
  std::lock_guard<std::mutex> lock(mu_);
  stub_ = v1::AgentService::NewStub(channel);
}

std::shared_ptr<v1::AgentService::Stub> FakeAgent::stub() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stub_;
}

absl::Status FakeAgent::Register() {
  v1::RegisterAgentRequest request;
  *request.mutable_host() =
      test_support::MakeHost(host_id_, {.address = absl::StrCat(host_id_, ":7171"),
                                        .devices = devices_,
                                        .device_name = "fake",
                                        .transports = {"local", "ucx"},
                                        .ucx_address = absl::StrCat("ucx-", host_id_),
                                        .memory_limit_bytes = int64_t{64} << 30});
  grpc::ClientContext context;
  SetDeadline(&context);
  v1::RegisterAgentResponse reply;
  const absl::Status s = rpc::FromGrpc(stub()->RegisterAgent(&context, request, &reply));
  if (!s.ok()) return s;
  epoch_.store(reply.epoch());
  return absl::OkStatus();
}

void FakeAgent::Start(absl::Duration period) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = false;
  }
  thread_ = std::thread([this, period] { Run(period); });
}

void FakeAgent::Stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

bool FakeAgent::Fetched(const std::string& operation_id) const {
  std::lock_guard<std::mutex> lock(mu_);
  return fetched_.count(operation_id) > 0;
}

int FakeAgent::DoneCount() const {
  std::lock_guard<std::mutex> lock(mu_);
  return static_cast<int>(done_.size());
}

void FakeAgent::Run(absl::Duration period) {
  std::unique_lock<std::mutex> lock(mu_);
  while (!stop_) {
    lock.unlock();
    Pass();
    lock.lock();
    cv_.wait_for(lock, absl::ToChronoMilliseconds(period), [this] { return stop_; });
  }
}

void FakeAgent::Pass() {
  if (epoch_.load() == 0 && !Register().ok()) return;
  v1::HeartbeatRequest hb;
  hb.set_host_id(host_id_);
  hb.set_epoch(epoch_.load());
  v1::HeartbeatResponse hb_reply;
  {
    grpc::ClientContext context;
    SetDeadline(&context);
    const grpc::Status s = stub()->Heartbeat(&context, hb, &hb_reply);
    if (s.error_code() == grpc::StatusCode::NOT_FOUND ||
        s.error_code() == grpc::StatusCode::FAILED_PRECONDITION) {
      epoch_.store(0);  // lost or superseded: register again next pass
      return;
    }
    if (!s.ok()) return;  // coordinator down or busy: try again next pass
    heartbeats_.fetch_add(1);
  }
  for (const std::string& op_id : hb_reply.assigned_operations()) {
    bool have = false;
    {
      std::lock_guard<std::mutex> lock(mu_);
      have = tasks_.count(op_id) > 0;
    }
    if (!have) {
      v1::GetTaskRequest request;
      request.set_host_id(host_id_);
      request.set_operation_id(op_id);
      v1::HostTask task;
      grpc::ClientContext context;
      SetDeadline(&context);
      if (!stub()->GetTask(&context, request, &task).ok()) continue;
      std::lock_guard<std::mutex> lock(mu_);
      tasks_[op_id] = std::move(task);
      fetched_.insert(op_id);
    }
    v1::HostTask task;
    {
      std::lock_guard<std::mutex> lock(mu_);
      task = tasks_[op_id];
    }
    v1::ReportProgressRequest report;
    report.set_host_id(host_id_);
    report.set_operation_id(op_id);
    const bool done = !hold_.load();
    v1::ReportProgressResponse reply;
    auto send = [&] {
      grpc::ClientContext context;
      SetDeadline(&context);
      return stub()->ReportProgress(&context, report, &reply).ok();
    };
    if (task.prepare()) {
      // The prepare of a stop-free operation (docs/coordinator.md, "Agents
      // prepare"): PREPARED without source checksums, so that its transfer
      // moves every step again; the transfer-phase task is fetched anew.
      report.set_state(done ? v1::HOST_TASK_STATE_PREPARED : v1::HOST_TASK_STATE_RUNNING);
      if (!send()) continue;
      if (done || reply.abort()) {
        std::lock_guard<std::mutex> lock(mu_);
        prepared_[op_id] = std::move(task);
        tasks_.erase(op_id);
      }
      continue;
    }
    report.set_state(done ? v1::HOST_TASK_STATE_DONE : v1::HOST_TASK_STATE_RUNNING);
    if (done) {
      // A prepared task's slice leaves out what the prepare wrote already.
      const v1::HostTask* written = &task;
      std::lock_guard<std::mutex> lock(mu_);
      if (task.prepared() && prepared_.count(op_id) > 0) written = &prepared_[op_id];
      for (v1::ShardChecksum& sum : ChecksumsFor(*written, host_id_)) {
        *report.add_checksums() = std::move(sum);
      }
    }
    if (!send()) continue;
    if (done || reply.abort()) {
      std::lock_guard<std::mutex> lock(mu_);
      tasks_.erase(op_id);
      if (done && !reply.abort()) done_.insert(op_id);
    }
  }
}

}  // namespace reshard::coordinator::testing
