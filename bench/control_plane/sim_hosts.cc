#include "bench/control_plane/sim_hosts.h"

#include <algorithm>
#include <random>
#include <set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "tests/coordinator/server/fake_agent.h"

namespace reshard::bench {
namespace {

constexpr int kRegisterInFlight = 64;
// As agent/process/session_pickup.cc: how long the coordinator may hold one
// long poll, the deadline's margin beyond it, and the least time between two
// polls that brought nothing new.
constexpr int kPollWaitMs = 10000;
constexpr int kPollDeadlineMarginMs = 5000;
constexpr int kPollMinIntervalMs = 50;
constexpr int kCallTimeoutMs = 10000;

template <typename Req, typename Resp>
struct Call {
  grpc::ClientContext context;
  Req request;
  Resp response;
  explicit Call(int timeout_ms) {
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::milliseconds(timeout_ms));
  }
};

}  // namespace

Timer::Timer() : thread_([this] { Run(); }) {}

Timer::~Timer() { Stop(); }

void Timer::At(Clock::time_point when, std::function<void()> fn) {
  std::lock_guard<std::mutex> l(mu_);
  if (stop_) return;
  const uint64_t seq = next_seq_++;
  fns_[seq] = std::move(fn);
  queue_.push({when, seq});
  cv_.notify_one();
}

void Timer::Stop() {
  {
    std::lock_guard<std::mutex> l(mu_);
    if (stop_ && !thread_.joinable()) return;
    stop_ = true;
    fns_.clear();
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void Timer::Run() {
  std::unique_lock<std::mutex> l(mu_);
  while (!stop_) {
    if (queue_.empty()) {
      cv_.wait(l);
      continue;
    }
    const Entry next = queue_.top();
    if (Clock::now() < next.when) {
      cv_.wait_until(l, next.when);
      continue;
    }
    queue_.pop();
    auto it = fns_.find(next.seq);
    if (it == fns_.end()) continue;
    std::function<void()> fn = std::move(it->second);
    fns_.erase(it);
    l.unlock();
    fn();
    l.lock();
  }
}

uint64_t SimChecksum(const std::string& job_id, int item) {
  return std::hash<std::string>()(absl::StrCat(job_id, "/", item));
}

struct SimHosts::Host {
  std::string id;
  v1::AgentService::Stub* stub = nullptr;
  std::atomic<int64_t> epoch{0};
  std::mutex mu;
  std::set<std::string> handled;    // every operation picked up
  std::vector<std::string> listed;  // the last list of assigned operations
  grpc::ClientContext* poll = nullptr;
};

SimHosts::SimHosts(const std::vector<std::shared_ptr<grpc::Channel>>& channels, int hosts,
                   Timer* timer, PickupFn on_pickup)
    : timer_(timer), on_pickup_(std::move(on_pickup)) {
  for (const auto& channel : channels) stubs_.push_back(v1::AgentService::NewStub(channel));
  for (int i = 0; i < hosts; ++i) {
    auto host = std::make_unique<Host>();
    host->id = HostId(i);
    host->stub = stubs_[i % stubs_.size()].get();
    hosts_.push_back(std::move(host));
  }
}

SimHosts::~SimHosts() { Stop(); }

std::string SimHosts::HostId(int i) { return absl::StrCat("h", i); }

absl::Status SimHosts::Start(std::chrono::milliseconds timeout) {
  const int n = static_cast<int>(hosts_.size());
  for (int k = 0; k < std::min(n, kRegisterInFlight); ++k) RegisterNext();
  std::unique_lock<std::mutex> l(mu_);
  const bool done = cv_.wait_for(
      l, timeout, [&] { return registered_.load() == n || errors_.load() > 0; });
  if (errors_.load() > 0) return absl::InternalError(first_error_);
  if (!done) {
    return absl::DeadlineExceededError(absl::StrCat(registered_.load(), " of ", n,
                                                    " hosts registered in ", timeout.count(),
                                                    " ms"));
  }
  return absl::OkStatus();
}

void SimHosts::Stop() {
  if (stopping_.exchange(true)) return;
  for (auto& host : hosts_) {
    std::lock_guard<std::mutex> l(host->mu);
    if (host->poll != nullptr) host->poll->TryCancel();
  }
  std::unique_lock<std::mutex> l(mu_);
  cv_.wait_for(l, std::chrono::seconds(10), [&] { return in_flight_.load() == 0; });
}

std::string SimHosts::first_error() const {
  std::lock_guard<std::mutex> l(mu_);
  return first_error_;
}

void SimHosts::Failed(const std::string& what, const grpc::Status& s) {
  if (stopping_.load()) return;
  errors_.fetch_add(1);
  std::lock_guard<std::mutex> l(mu_);
  if (first_error_.empty()) {
    first_error_ = absl::StrCat(what, ": ", s.error_code(), " ", s.error_message());
  }
  cv_.notify_all();
}

void SimHosts::Ended() {
  if (in_flight_.fetch_sub(1) == 1) {
    std::lock_guard<std::mutex> l(mu_);
    cv_.notify_all();
  }
}

void SimHosts::RegisterNext() {
  const int i = next_register_.fetch_add(1);
  if (i >= static_cast<int>(hosts_.size()) || stopping_.load()) return;
  Host* host = hosts_[i].get();
  using C = Call<v1::RegisterAgentRequest, v1::RegisterAgentResponse>;
  auto* call = new C(kCallTimeoutMs);
  v1::Host* h = call->request.mutable_host();
  h->set_host_id(host->id);
  h->set_address(absl::StrCat(host->id, ":7171"));
  h->add_transports("local");
  h->add_transports("ucx");
  h->set_ucx_address(absl::StrCat("ucx-", host->id));
  h->set_memory_limit_bytes(int64_t{64} << 30);
  v1::Device* device = h->add_devices();
  device->set_index(0);
  device->set_kind("cuda");
  device->set_name("simulated");
  device->set_memory_bytes(int64_t{80} << 30);
  Began();
  host->stub->async()->RegisterAgent(
      &call->context, &call->request, &call->response, [this, host, call](grpc::Status s) {
        std::unique_ptr<C> owned(call);
        if (!s.ok()) {
          Failed(absl::StrCat("RegisterAgent host \"", host->id, "\""), s);
        } else {
          host->epoch.store(owned->response.epoch());
          lease_ms_.store(owned->response.lease_ms());
          // Heartbeats spread over a period, as agents started at random times.
          thread_local std::mt19937_64 rng(std::random_device{}());
          const int64_t period = std::max<int64_t>(owned->response.lease_ms() / 3, 10);
          timer_->At(Clock::now() + std::chrono::milliseconds(rng() % period),
                     [this, host] { Heartbeat(host); });
          Poll(host);
          {
            std::lock_guard<std::mutex> l(mu_);
            registered_.fetch_add(1);
            cv_.notify_all();
          }
          RegisterNext();
        }
        Ended();
      });
}

void SimHosts::Heartbeat(Host* host) {
  if (stopping_.load()) return;
  using C = Call<v1::HeartbeatRequest, v1::HeartbeatResponse>;
  auto* call = new C(kCallTimeoutMs);
  call->request.set_host_id(host->id);
  call->request.set_epoch(host->epoch.load());
  Began();
  host->stub->async()->Heartbeat(
      &call->context, &call->request, &call->response, [this, host, call](grpc::Status s) {
        std::unique_ptr<C> owned(call);
        int64_t lease = lease_ms_.load();
        if (s.ok()) {
          heartbeats_.fetch_add(1);
          if (owned->response.lease_ms() > 0) lease = owned->response.lease_ms();
          Listed(host, owned->response.assigned_operations(), /*by_poll=*/false);
        } else {
          Failed(absl::StrCat("Heartbeat host \"", host->id, "\""), s);
        }
        // The agent's period: lease/3 (agent/process/coordinator_session.cc).
        timer_->At(Clock::now() + std::chrono::milliseconds(std::max<int64_t>(lease / 3, 10)),
                   [this, host] { Heartbeat(host); });
        Ended();
      });
}

void SimHosts::Poll(Host* host) {
  if (stopping_.load()) return;
  using C = Call<v1::WaitForTasksRequest, v1::WaitForTasksResponse>;
  auto* call = new C(kPollWaitMs + kPollDeadlineMarginMs);
  call->request.set_host_id(host->id);
  call->request.set_wait_ms(kPollWaitMs);
  {
    std::lock_guard<std::mutex> l(host->mu);
    // What the host runs or ran and is still listed: the coordinator answers
    // at once when anything else is assigned.
    for (const std::string& id : host->listed) {
      if (host->handled.count(id) != 0) call->request.add_known_operations(id);
    }
    host->poll = &call->context;
  }
  const Clock::time_point sent = Clock::now();
  Began();
  host->stub->async()->WaitForTasks(
      &call->context, &call->request, &call->response, [this, host, call, sent](grpc::Status s) {
        std::unique_ptr<C> owned(call);
        {
          std::lock_guard<std::mutex> l(host->mu);
          host->poll = nullptr;
        }
        if (s.ok()) {
          polls_.fetch_add(1);
          const int started = static_cast<int>(std::count_if(
              owned->response.assigned_operations().begin(),
              owned->response.assigned_operations().end(), [&](const std::string& id) {
                std::lock_guard<std::mutex> l(host->mu);
                return host->handled.count(id) == 0;
              }));
          Listed(host, owned->response.assigned_operations(), /*by_poll=*/true);
          if (started == 0 && Clock::now() - sent < std::chrono::milliseconds(kPollMinIntervalMs)) {
            timer_->At(sent + std::chrono::milliseconds(kPollMinIntervalMs),
                       [this, host] { Poll(host); });
          } else {
            Poll(host);
          }
        } else {
          Failed(absl::StrCat("WaitForTasks host \"", host->id, "\""), s);
          timer_->At(Clock::now() + std::chrono::milliseconds(100), [this, host] { Poll(host); });
        }
        Ended();
      });
}

void SimHosts::Listed(Host* host, const google::protobuf::RepeatedPtrField<std::string>& assigned,
                      bool by_poll) {
  std::vector<std::string> fresh;
  {
    std::lock_guard<std::mutex> l(host->mu);
    host->listed.assign(assigned.begin(), assigned.end());
    for (const std::string& id : assigned) {
      if (host->handled.insert(id).second) fresh.push_back(id);
    }
  }
  const Clock::time_point now = Clock::now();
  for (const std::string& id : fresh) {
    on_pickup_(id, host->id, now, by_poll);
    RunTask(host, id);
  }
}

void SimHosts::RunTask(Host* host, const std::string& operation_id) {
  if (stopping_.load()) return;
  using C = Call<v1::GetTaskRequest, v1::HostTask>;
  auto* call = new C(kCallTimeoutMs);
  call->request.set_host_id(host->id);
  call->request.set_operation_id(operation_id);
  Began();
  host->stub->async()->GetTask(&call->context, &call->request, &call->response,
                               [this, host, call](grpc::Status s) {
                                 std::unique_ptr<C> owned(call);
                                 if (s.ok()) {
                                   Report(host, owned->response);
                                 } else {
                                   Failed(absl::StrCat("GetTask host \"", host->id,
                                                       "\" operation \"",
                                                       owned->request.operation_id(), "\""),
                                          s);
                                 }
                                 Ended();
                               });
}

void SimHosts::Report(Host* host, const v1::HostTask& task) {
  if (stopping_.load()) return;
  using C = Call<v1::ReportProgressRequest, v1::ReportProgressResponse>;
  auto* call = new C(kCallTimeoutMs);
  call->request.set_host_id(host->id);
  call->request.set_operation_id(task.operation_id());
  call->request.set_state(v1::HOST_TASK_STATE_DONE);
  // One per (item, new rank) the slice writes here (the rule AgentApi checks).
  for (v1::ShardChecksum& sum : coordinator::testing::ShardChecksumsFor(
           task, host->id, [&task](int item, int) { return SimChecksum(task.job_id(), item); })) {
    *call->request.add_checksums() = std::move(sum);
  }
  Began();
  host->stub->async()->ReportProgress(
      &call->context, &call->request, &call->response, [this, host, call](grpc::Status s) {
        std::unique_ptr<C> owned(call);
        const std::string what = absl::StrCat("ReportProgress DONE host \"", host->id,
                                              "\" operation \"", owned->request.operation_id(),
                                              "\"");
        if (!s.ok()) {
          Failed(what, s);
        } else if (owned->response.abort()) {
          Failed(what, grpc::Status(grpc::StatusCode::ABORTED,
                                    "the coordinator answered abort: the operation ended"));
        } else {
          done_reports_.fetch_add(1);
        }
        Ended();
      });
}

}  // namespace reshard::bench
