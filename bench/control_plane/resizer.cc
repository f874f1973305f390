#include "bench/control_plane/resizer.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "grpcpp/grpcpp.h"
#include "tests/support/job_builders.h"

namespace reshard::bench {
namespace {

constexpr int kCallTimeoutMs = 10000;
constexpr auto kPollPeriod = std::chrono::milliseconds(20);

void SetDeadline(grpc::ClientContext* context) {
  context->set_deadline(std::chrono::system_clock::now() +
                        std::chrono::milliseconds(kCallTimeoutMs));
}

v1::Placement PairPlacement(const std::string (&pair)[2]) {
  return test_support::HostsPlacement({pair[0], pair[1]}, 1);
}

// One float32 tensor of 4 KiB held by every stage, data-parallel
// replicated: dp 2 on two hosts, one device each.
v1::JobSpec SmallSpec(const std::string& name, const std::string (&pair)[2]) {
  v1::JobSpec spec;
  spec.set_name(name);
  spec.set_tenant("bench-control-plane");
  v1::Ptc* ptc = spec.mutable_ptc();
  ptc->set_num_layers(1);
  test_support::AddTensor(ptc, "w", {1024});
  *spec.mutable_layout() = test_support::MakeLayout(1, 1, 2, {pair[0], pair[1]}, 1);
  return spec;
}

}  // namespace

Resizer::Resizer(v1::CoordinatorService::Stub* stub, int jobs, int hosts, int in_flight)
    : stub_(stub), hosts_(hosts), in_flight_(in_flight) {
  for (int j = 0; j < jobs; ++j) {
    Job job;
    for (int k = 0; k < 4; ++k) job.pair[k / 2][k % 2] = absl::StrCat("h", (4 * j + k) % hosts_);
    jobs_.push_back(std::move(job));
  }
}

Resizer::~Resizer() { Stop(std::chrono::milliseconds(0)); }

absl::Status Resizer::RegisterJobs() {
  for (size_t j = 0; j < jobs_.size(); ++j) {
    v1::RegisterJobRequest request;
    *request.mutable_spec() = SmallSpec(absl::StrCat("cp-", j), jobs_[j].pair[0]);
    v1::RegisterJobResponse reply;
    grpc::ClientContext context;
    SetDeadline(&context);
    const grpc::Status s = stub_->RegisterJob(&context, request, &reply);
    if (!s.ok()) {
      return absl::InternalError(
          absl::StrCat("RegisterJob cp-", j, ": ", s.error_code(), " ", s.error_message()));
    }
    jobs_[j].id = reply.job().id();
    jobs_[j].generation = reply.job().generation();
    job_ids_.push_back(reply.job().id());
  }
  return absl::OkStatus();
}

void Resizer::Start() {
  thread_ = std::thread([this] { Run(); });
}

void Resizer::Stop(std::chrono::milliseconds drain) {
  draining_.store(true);
  const Clock::time_point deadline = Clock::now() + drain;
  while (Clock::now() < deadline) {
    {
      std::lock_guard<std::mutex> l(mu_);
      if (running_.empty()) break;
    }
    std::this_thread::sleep_for(kPollPeriod);
  }
  stop_.store(true);
  if (thread_.joinable()) thread_.join();
  std::lock_guard<std::mutex> l(mu_);
  if (drain.count() == 0) return;
  for (const auto& [id, job] : running_) {
    errors_.fetch_add(1);
    if (first_error_.empty()) {
      first_error_ = absl::StrCat("operation \"", id, "\" of job \"", jobs_[job].id,
                                  "\" did not commit within ", drain.count(), " ms");
    }
  }
  for (const auto& [id, op] : ops_) {
    if (!op.committed) continue;
    for (const std::string& host : op.targets) {
      auto p = picked_.find(id);
      if (p != picked_.end() && p->second.count(host) != 0) continue;
      errors_.fetch_add(1);
      if (first_error_.empty()) {
        first_error_ = absl::StrCat("operation \"", id, "\" committed but its target host \"", host,
                                    "\" never picked it up");
      }
    }
  }
}

void Resizer::Failed(const std::string& what) {
  errors_.fetch_add(1);
  std::lock_guard<std::mutex> l(mu_);
  if (first_error_.empty()) first_error_ = what;
}

std::string Resizer::first_error() const {
  std::lock_guard<std::mutex> l(mu_);
  return first_error_;
}

void Resizer::Run() {
  std::set<int> busy;
  while (!stop_.load()) {
    if (!draining_.load()) {
      for (size_t tries = 0; tries < jobs_.size(); ++tries) {
        {
          std::lock_guard<std::mutex> l(mu_);
          if (static_cast<int>(running_.size()) >= in_flight_) break;
          busy.clear();
          for (const auto& [id, job] : running_) busy.insert(job);
        }
        const int j = next_job_;
        next_job_ = (next_job_ + 1) % static_cast<int>(jobs_.size());
        if (busy.count(j) != 0) continue;
        if (!StartResize(j)) break;
      }
    }
    PollInFlight();
    std::this_thread::sleep_for(kPollPeriod);
  }
}

bool Resizer::StartResize(int j) {
  Job& job = jobs_[j];
  v1::ResizeRequest request;
  request.set_job_id(job.id);
  request.set_expected_generation(job.generation);
  *request.mutable_placement() = PairPlacement(job.pair[1 - job.on]);
  v1::Operation op;
  grpc::ClientContext context;
  SetDeadline(&context);
  const grpc::Status s = stub_->Resize(&context, request, &op);
  const Clock::time_point created = Clock::now();
  if (!s.ok()) {
    Failed(absl::StrCat("Resize job \"", job.id, "\": ", s.error_code(), " ", s.error_message()));
    return false;
  }
  std::lock_guard<std::mutex> l(mu_);
  Op& rec = ops_[op.id()];
  rec.job = j;
  rec.row = row_.load();
  rec.created = created;
  rec.targets = {job.pair[1 - job.on][0], job.pair[1 - job.on][1]};
  running_[op.id()] = j;
  return true;
}

void Resizer::PollInFlight() {
  std::map<std::string, int> running;
  {
    std::lock_guard<std::mutex> l(mu_);
    running = running_;
  }
  for (const auto& [id, j] : running) {
    v1::GetOperationRequest request;
    request.set_operation_id(id);
    v1::Operation op;
    grpc::ClientContext context;
    SetDeadline(&context);
    const grpc::Status s = stub_->GetOperation(&context, request, &op);
    if (!s.ok()) {
      Failed(absl::StrCat("GetOperation \"", id, "\": ", s.error_code(), " ", s.error_message()));
      continue;
    }
    if (op.state() == v1::OPERATION_STATE_COMMITTED) {
      jobs_[j].generation = op.to_generation();
      jobs_[j].on = 1 - jobs_[j].on;
      committed_.fetch_add(1);
      std::lock_guard<std::mutex> l(mu_);
      ops_[id].committed = true;
      running_.erase(id);
    } else if (op.state() == v1::OPERATION_STATE_ABORTED ||
               op.state() == v1::OPERATION_STATE_FAILED) {
      Failed(absl::StrCat("operation \"", id, "\" of job \"", jobs_[j].id, "\" ended ",
                          v1::OperationState_Name(op.state()), ": ", op.error()));
      std::lock_guard<std::mutex> l(mu_);
      running_.erase(id);
    }
  }
}

void Resizer::Picked(const std::string& operation_id, const std::string& host_id,
                     Clock::time_point when, bool by_poll) {
  std::lock_guard<std::mutex> l(mu_);
  picked_[operation_id].emplace(host_id, std::make_pair(when, by_poll));
}

void Resizer::CrossSeen(const v1::Job& job, Clock::time_point when) {
  if (job.active_operation_id().empty()) return;
  std::lock_guard<std::mutex> l(mu_);
  cross_seen_.emplace(job.active_operation_id(), when);
}

Resizer::RowFigures Resizer::Figures(int row) const {
  RowFigures f;
  std::lock_guard<std::mutex> l(mu_);
  for (const auto& [id, op] : ops_) {
    if (op.row != row) continue;
    ++f.created;
    if (op.committed) ++f.committed;
    auto p = picked_.find(id);
    for (const std::string& host : op.targets) {
      if (p == picked_.end()) continue;
      auto h = p->second.find(host);
      if (h == p->second.end()) continue;
      f.pickup_ms.push_back(
          std::chrono::duration<double, std::milli>(h->second.first - op.created).count());
      if (!h->second.second) ++f.picked_by_heartbeat;
    }
    auto c = cross_seen_.find(id);
    if (c != cross_seen_.end()) {
      f.cross_ms.push_back(
          std::chrono::duration<double, std::milli>(c->second - op.created).count());
    }
  }
  return f;
}

}  // namespace reshard::bench
