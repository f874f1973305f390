#include "agent/process/coordinator_session.h"

#include <algorithm>
#include <chrono>
#include <set>
#include <vector>

#include "absl/strings/str_cat.h"
#include "agent/executor/published_task.h"
#include "agent/transfer/backend.h"
#include "common/log.h"

namespace reshard::agent {

absl::StatusOr<std::shared_ptr<grpc::Channel>> CoordinatorChannel(const std::string& target,
                                                                  const TlsFiles& tls) {
  absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> credentials =
      MakeChannelCredentials(tls);
  if (!credentials.ok()) return credentials.status();
  if (tls.insecure) {
    RESHARD_LOG(WARNING) << "--insecure: plaintext to the coordinator at " << target
                         << "; anyone on the path can read and forge this host's reports";
  }
  return grpc::CreateChannel(target, *credentials);
}

namespace {

constexpr int kReportPeriodMs = 500;
constexpr int kMaxBackoffMs = 2000;
constexpr int kRpcDeadlineMs = 5000;

void SetDeadline(grpc::ClientContext* ctx, int ms = kRpcDeadlineMs) {
  ctx->set_deadline(std::chrono::system_clock::now() + std::chrono::milliseconds(ms));
}

bool Retryable(const absl::Status& s) {
  return absl::IsUnavailable(s) || absl::IsDeadlineExceeded(s) || absl::IsResourceExhausted(s);
}

}  // namespace

absl::Status FromGrpc(const grpc::Status& s) {
  return absl::Status(static_cast<absl::StatusCode>(s.error_code()), s.error_message());
}

grpc::Status ToGrpc(const absl::Status& s) {
  if (s.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(s.code()), std::string(s.message()));
}

CoordinatorSession::CoordinatorSession(Options options, std::shared_ptr<grpc::Channel> channel,
                                       ShardStore* store, TaskExecutor* executor,
                                       Transport* transport)
    : options_(std::move(options)),
      stub_(v1::AgentService::NewStub(channel)),
      store_(store),
      executor_(executor),
      transport_(transport) {}

CoordinatorSession::~CoordinatorSession() { Stop(); }

void CoordinatorSession::Start() {
  std::lock_guard<std::mutex> l(mu_);
  if (started_) return;
  started_ = true;
  loop_ = std::thread([this] { Loop(); });
  poll_ = std::thread([this] { PollLoop(); });
}

void CoordinatorSession::Stop() {
  {
    std::lock_guard<std::mutex> l(mu_);
    if (stopping_.exchange(true)) return;
    for (auto& [id, op] : ops_) op->cancel.store(true);
    if (poll_ctx_ != nullptr) poll_ctx_->TryCancel();
    if (pickup_ctx_ != nullptr) pickup_ctx_->TryCancel();
  }
  cv_.notify_all();
  if (loop_.joinable()) loop_.join();
  if (poll_.joinable()) poll_.join();
  std::map<std::string, std::unique_ptr<RunningOp>> ops;
  {
    std::lock_guard<std::mutex> l(mu_);
    ops.swap(ops_);
  }
  for (auto& [id, op] : ops) {
    if (op->thread.joinable()) op->thread.join();
  }
}

bool CoordinatorSession::Sleep(int ms) {
  std::unique_lock<std::mutex> l(mu_);
  cv_.wait_for(l, std::chrono::milliseconds(ms), [this] { return stopping_.load(); });
  return !stopping_.load();
}

v1::Host CoordinatorSession::DescribeHost() const {
  v1::Host h;
  h.set_host_id(options_.host_id);
  h.set_address(options_.address);
  h.set_memory_limit_bytes(options_.memory_limit_bytes);
  const int cuda = CudaDeviceCount();
  if (cuda > 0) {
    for (int i = 0; i < cuda; ++i) {
      v1::Device* d = h.add_devices();
      d->set_index(i);
      d->set_kind("cuda");
      d->set_name(absl::StrCat("cuda:", i));
    }
  } else {
    v1::Device* d = h.add_devices();
    d->set_index(0);
    d->set_kind("cpu");
    d->set_name("cpu");
    d->set_memory_bytes(options_.memory_limit_bytes);
  }
  // Only backends that loaded here and that an execution path uses.
  for (const std::string& name : AdvertisedTransports(LoadedBackends(transport_))) {
    h.add_transports(name);
  }
  if (transport_ != nullptr) h.set_ucx_address(transport_->LocalAddress());
  return h;
}

absl::Status CoordinatorSession::Register() {
  v1::RegisterAgentRequest req;
  *req.mutable_host() = DescribeHost();
  // What this host holds, so that the coordinator can name deleted jobs and
  // give back the jobs that counted this host lost while its shards survived.
  std::set<std::string> jobs;
  for (const RankBufferKey& key : store_->List()) {
    jobs.insert(key.job_id);
    absl::StatusOr<RankBufferPtr> buffer = store_->Get(key);
    if (!buffer.ok()) continue;  // dropped since the listing
    v1::HeldRank* held = req.add_held_ranks();
    held->set_job_id(key.job_id);
    held->set_generation(key.generation);
    held->set_rank(key.rank);
    held->set_sealed((*buffer)->sealed());
    if ((*buffer)->sealed()) {
      for (uint64_t c : (*buffer)->checksums()) held->add_checksums(c);
    }
  }
  for (const std::string& job : jobs) req.add_held_jobs(job);
  v1::RegisterAgentResponse resp;
  grpc::ClientContext ctx;
  SetDeadline(&ctx);
  absl::Status s = FromGrpc(stub_->RegisterAgent(&ctx, req, &resp));
  if (options_.metrics != nullptr) options_.metrics->RegisterDone(s.ok());
  if (!s.ok()) return s;
  {
    std::lock_guard<std::mutex> l(mu_);
    epoch_.store(resp.epoch());
  }
  cv_.notify_all();  // PollLoop opens its long poll once registered
  if (resp.lease_ms() > 0) lease_ms_.store(resp.lease_ms());
  DropDeletedJobs(resp.deleted_jobs());
  Release(resp.release());
  RESHARD_LOG(INFO) << "host " << options_.host_id << " registered, epoch " << resp.epoch()
                    << ", lease " << resp.lease_ms() << " ms";
  return absl::OkStatus();
}

void CoordinatorSession::Loop() {
  bool registered = false;
  int backoff_ms = 100;
  while (!stopping_.load()) {
    if (!registered) {
      absl::Status s = Register();
      if (!s.ok()) {
        RESHARD_LOG(WARNING) << "host " << options_.host_id << ": RegisterAgent: " << s
                             << "; retrying in " << backoff_ms << " ms";
        if (!Sleep(backoff_ms)) break;
        backoff_ms = std::min(backoff_ms * 2, kMaxBackoffMs);
        continue;
      }
      registered = true;
      backoff_ms = 100;
    }
    uint64_t listed_at = 0;
    {
      std::lock_guard<std::mutex> l(mu_);
      listed_at = list_clock_;
    }
    v1::HeartbeatRequest req;
    req.set_host_id(options_.host_id);
    req.set_epoch(epoch_.load());
    req.set_memory_used_bytes(store_->used_bytes());
    for (std::string& job : HeldJobs()) req.add_held_jobs(std::move(job));
    v1::HeartbeatResponse resp;
    grpc::ClientContext ctx;
    SetDeadline(&ctx);
    absl::Status s = FromGrpc(stub_->Heartbeat(&ctx, req, &resp));
    if (options_.metrics != nullptr) options_.metrics->HeartbeatDone(s.ok());
    int period = options_.heartbeat_ms > 0
                     ? options_.heartbeat_ms
                     : static_cast<int>(std::max<int64_t>(lease_ms_.load() / 3, 10));
    if (s.ok()) {
      backoff_ms = 100;
      if (resp.lease_ms() > 0) lease_ms_.store(resp.lease_ms());
      Apply(resp, listed_at);
    } else if (absl::IsNotFound(s) || absl::IsFailedPrecondition(s)) {
      RESHARD_LOG(WARNING) << "host " << options_.host_id << ": Heartbeat: " << s
                           << "; registering again";
      registered = false;
      continue;
    } else {
      RESHARD_LOG(WARNING) << "host " << options_.host_id << ": Heartbeat: " << s
                           << "; retrying in " << backoff_ms << " ms";
      period = std::min(period, backoff_ms);
      backoff_ms = std::min(backoff_ms * 2, kMaxBackoffMs);
    }
    ReapFinished();
    if (!Sleep(period)) break;
  }
}

void CoordinatorSession::ReapFinished() {
  std::vector<std::unique_ptr<RunningOp>> done;
  {
    std::lock_guard<std::mutex> l(mu_);
    for (auto it = ops_.begin(); it != ops_.end();) {
      if (it->second->finished.load()) {
        // A prepared operation is held in prepared_ (RunOperation put it
        // there) until its transfer phase is assigned.
        if (!it->second->prepared.load()) finished_.insert(it->first);
        done.push_back(std::move(it->second));
        it = ops_.erase(it);
      } else {
        ++it;
      }
    }
  }
  for (auto& op : done) {
    if (op->thread.joinable()) op->thread.join();
  }
}

std::vector<std::string> CoordinatorSession::HeldJobs() const {
  std::set<std::string> jobs;
  for (const RankBufferKey& key : store_->List()) jobs.insert(key.job_id);
  return {jobs.begin(), jobs.end()};
}

void CoordinatorSession::DropDeletedJobs(
    const google::protobuf::RepeatedPtrField<std::string>& job_ids) {
  if (job_ids.empty()) return;
  const std::set<std::string> deleted(job_ids.begin(), job_ids.end());
  {
    std::lock_guard<std::mutex> l(mu_);
    for (auto& [id, op] : ops_) {
      if (deleted.count(op->job_id) != 0) op->cancel.store(true);
    }
    for (const std::string& job : deleted) ForgetPreparedLocked(job, 0);
  }
  int dropped = 0;
  for (const RankBufferKey& key : store_->List()) {
    if (deleted.count(key.job_id) == 0) continue;
    store_->Drop(key);
    ++dropped;
  }
  for (const std::string& job : deleted) {
    RESHARD_LOG(INFO) << "job " << job << " was deleted: its buffers here are dropped";
  }
  RESHARD_LOG(INFO) << "dropped " << dropped << " rank buffers of " << deleted.size()
                    << " deleted jobs; " << store_->used_bytes() << " bytes used";
}

void CoordinatorSession::Release(
    const google::protobuf::RepeatedPtrField<v1::GenerationRef>& generations) {
  for (const v1::GenerationRef& g : generations) {
    RESHARD_LOG(DEBUG) << "job " << g.job_id() << ": releasing generation " << g.generation();
    store_->DropGeneration(g.job_id(), g.generation());
  }
}

void CoordinatorSession::Apply(const v1::HeartbeatResponse& r, uint64_t listed_at) {
  DropDeletedJobs(r.deleted_jobs());
  for (const v1::GenerationRef& g : r.discard()) {
    {
      std::lock_guard<std::mutex> l(mu_);
      for (auto& [id, op] : ops_) {
        if (op->job_id == g.job_id() && op->to_generation == g.generation()) {
          op->cancel.store(true);
        }
      }
      // An operation aborted after its prepare: its buffers go below.
      ForgetPreparedLocked(g.job_id(), g.generation());
    }
    RESHARD_LOG(INFO) << "job " << g.job_id() << ": discarding generation " << g.generation();
    store_->DropGeneration(g.job_id(), g.generation());
  }
  Release(r.release());
  StartAssigned(r.assigned_operations(), listed_at);
}

absl::Status CoordinatorSession::Report(const v1::ReportProgressRequest& req, bool retry,
                                        bool* abort) {
  int backoff_ms = 100;
  for (int attempt = 0;; ++attempt) {
    v1::ReportProgressResponse resp;
    grpc::ClientContext ctx;
    SetDeadline(&ctx);
    absl::Status s = FromGrpc(stub_->ReportProgress(&ctx, req, &resp));
    if (s.ok()) {
      if (resp.abort()) *abort = true;
      return s;
    }
    // A final report is worth retrying for a while: the coordinator may be
    // restarting. It aborts the operation itself if the host stays silent.
    if (!retry || !Retryable(s) || attempt >= 30 || stopping_.load()) return s;
    if (!Sleep(backoff_ms)) return s;
    backoff_ms = std::min(backoff_ms * 2, kMaxBackoffMs);
  }
}

int64_t CoordinatorSession::AcceptsPublish(const std::string& job_id, int64_t generation,
                                           int rank) const {
  std::lock_guard<std::mutex> l(mu_);
  return AcceptsPublishLocked(job_id, generation, rank);
}

int64_t CoordinatorSession::AcceptsPublishLocked(const std::string& job_id, int64_t generation,
                                                 int rank) const {
  for (const auto& [id, op] : ops_) {
    if (op->job_id == job_id && op->to_generation == generation && !op->finished.load() &&
        !op->cancel.load() && op->published_ranks.count(rank) != 0) {
      return op->from_generation;
    }
  }
  return 0;
}

void CoordinatorSession::RunOperation(const std::string& operation_id, RunningOp* op) {
  const std::string& host = options_.host_id;
  v1::HostTask task;
  absl::Status s;
  int backoff_ms = 100;
  for (int attempt = 0;; ++attempt) {
    v1::GetTaskRequest req;
    req.set_host_id(host);
    req.set_operation_id(operation_id);
    grpc::ClientContext ctx;
    SetDeadline(&ctx, 30000);
    s = FromGrpc(stub_->GetTask(&ctx, req, &task));
    if (s.ok() || !Retryable(s) || attempt >= 10 || !Sleep(backoff_ms)) break;
    backoff_ms = std::min(backoff_ms * 2, kMaxBackoffMs);
  }
  if (!s.ok()) {
    RESHARD_LOG(WARNING) << "operation " << operation_id << ": GetTask: " << s;
    op->finished.store(true);
    cv_.notify_all();  // a publish waiting for this task (AwaitPublishAccepted) stops waiting
    return;
  }
  // A checkpoint's ranks here are known before the task reports anything,
  // so that the workers' publish is accepted as soon as the operation shows
  // TRANSFERRING.
  std::set<int> published;
  absl::StatusOr<HostSteps> publish_steps = absl::UnknownError("not a checkpoint");
  if (task.publish_by_workers()) {
    publish_steps = PrepareHostSteps(store_, host, task);
    if (publish_steps.ok()) {
      published.insert(publish_steps->new_ranks.begin(), publish_steps->new_ranks.end());
    }
  }
  {
    std::lock_guard<std::mutex> l(mu_);
    op->job_id = task.job_id();
    op->to_generation = task.to_generation();
    op->published_ranks = std::move(published);
    op->from_generation = task.from_generation();
    op->task_fetched = true;
  }
  cv_.notify_all();  // publishes waiting in AwaitPublishAccepted
  RESHARD_LOG(INFO) << "operation " << operation_id << " job " << task.job_id() << ": generation "
                    << task.from_generation() << " -> " << task.to_generation() << ", "
                    << task.plan().steps_size() << " steps here";

  AgentMetrics* metrics = options_.metrics;
  const auto started = std::chrono::steady_clock::now();
  const int64_t token = metrics != nullptr ? metrics->TaskStarted() : 0;
  std::atomic<int64_t> done{0}, total{0};
  std::mutex waiting_mu;
  std::string waiting_on;  // what the task waits on, for the coordinator's stall message
  // Ends the task in the metrics: takes its bytes out of the progress gauges
  // (counting the rest as written when it succeeded) and records the result.
  auto finish_metrics = [&](TaskResult r) {
    if (metrics == nullptr) return;
    const int64_t d = done.load(), t = total.load();
    if (r == TaskResult::kDone && t > d) metrics->TaskProgress(t - d, 0);
    const int64_t shown = r == TaskResult::kDone ? std::max(d, t) : d;
    metrics->TaskProgress(-shown, -t);
    const std::chrono::duration<double> seconds = std::chrono::steady_clock::now() - started;
    metrics->TaskFinished(token, r, seconds.count());
  };
  std::atomic<bool> exec_finished{false};
  absl::StatusOr<std::vector<v1::ShardChecksum>> result =
      absl::UnknownError("operation did not run");
  auto progress = [&](int64_t d, int64_t t) {
    const int64_t prev_done = done.exchange(d);
    const int64_t prev_total = total.exchange(t);
    if (metrics != nullptr) metrics->TaskProgress(d - prev_done, t - prev_total);
  };
  auto cancelled = [&] { return op->cancel.load() || stopping_.load(); };
  auto waiting = [&](const std::string& what) {
    std::lock_guard<std::mutex> l(waiting_mu);
    waiting_on = what;
  };
  std::thread worker([&] {
    absl::Status connect = absl::OkStatus();
    if (task.publish_by_workers()) {
      if (publish_steps.ok()) {
        result = AwaitPublished(store_, task, *publish_steps, progress, cancelled, waiting);
      } else {
        result = publish_steps.status();
      }
      exec_finished.store(true);
      cv_.notify_all();
      return;
    }
    if (transport_ != nullptr) {
      for (const v1::PeerHost& p : task.peers()) {
        if (p.host_id() == host || p.ucx_address().empty()) continue;
        // An endpoint can fail to come up for a moment (e.g. while one to the
        // same peer from an aborted attempt is being torn down): a few tries
        // within about a second before the task fails.
        for (int attempt = 0; attempt < 4; ++attempt) {
          if (attempt > 0) std::this_thread::sleep_for(std::chrono::milliseconds(100 << attempt));
          connect = transport_->Connect(p.host_id(), p.ucx_address());
          if (connect.ok() || !absl::IsUnavailable(connect) || op->cancel.load()) break;
        }
        if (!connect.ok()) {
          connect = absl::Status(connect.code(), absl::StrCat("connecting to host \"", p.host_id(),
                                                              "\": ", connect.message()));
          break;
        }
      }
    }
    if (!connect.ok()) {
      result = connect;
    } else {
      result = executor_->Execute(host, task, progress, cancelled, waiting);
    }
    exec_finished.store(true);
    cv_.notify_all();
  });

  bool abort = false;
  while (!exec_finished.load()) {
    {
      std::unique_lock<std::mutex> l(mu_);
      cv_.wait_for(l, std::chrono::milliseconds(kReportPeriodMs),
                   [&] { return exec_finished.load() || stopping_.load(); });
    }
    if (exec_finished.load() || stopping_.load()) break;
    if (abort) continue;
    v1::ReportProgressRequest req;
    req.set_host_id(host);
    req.set_operation_id(operation_id);
    req.set_state(v1::HOST_TASK_STATE_RUNNING);
    req.set_bytes_done(done.load());
    req.set_bytes_total(total.load());
    {
      std::lock_guard<std::mutex> l(waiting_mu);
      req.set_waiting_on(waiting_on);
    }
    absl::Status rs = Report(req, /*retry=*/false, &abort);
    if (!rs.ok()) {
      RESHARD_LOG(WARNING) << "operation " << operation_id << ": ReportProgress: " << rs;
    }
    if (abort) {
      RESHARD_LOG(INFO) << "operation " << operation_id << ": aborted by the coordinator";
      op->cancel.store(true);
    }
  }
  worker.join();

  if (abort || stopping_.load()) {
    // The executor dropped the new buffers; the coordinator knows already,
    // or learns it from the lease.
    finish_metrics(TaskResult::kAborted);
    op->finished.store(true);
    return;
  }
  v1::ReportProgressRequest req;
  req.set_host_id(host);
  req.set_operation_id(operation_id);
  req.set_bytes_done(done.load());
  req.set_bytes_total(total.load());
  const bool prepare = task.prepare();
  if (result.ok() && prepare) {
    // The buffers stay; the coordinator learns what the pre-copy read.
    req.set_state(v1::HOST_TASK_STATE_PREPARED);
    req.set_bytes_done(std::max(done.load(), total.load()));
    for (const v1::ShardChecksum& c : *result) *req.add_source_checksums() = c;
    RESHARD_LOG(INFO) << "operation " << operation_id << ": prepared, " << result->size()
                      << " source shards read here";
  } else if (result.ok()) {
    req.set_state(v1::HOST_TASK_STATE_DONE);
    req.set_bytes_done(std::max(done.load(), total.load()));
    for (const v1::ShardChecksum& c : *result) *req.add_checksums() = c;
    RESHARD_LOG(INFO) << "operation " << operation_id << ": done, " << result->size()
                      << " shards written here";
  } else {
    req.set_state(v1::HOST_TASK_STATE_FAILED);
    req.set_error(result.status().ToString());
    RESHARD_LOG(WARNING) << "operation " << operation_id << ": failed: " << result.status();
  }
  if (req.state() == v1::HOST_TASK_STATE_PREPARED) {
    // The poll in flight names this operation known, so its transfer phase
    // would not wake it: a fresh one without it replaces it.
    std::lock_guard<std::mutex> l(mu_);
    op->reporting_prepared.store(true);
    if (poll_ctx_ != nullptr) {
      repoll_ = true;
      poll_ctx_->TryCancel();
    }
  }
  absl::Status rs = Report(req, /*retry=*/true, &abort);
  if (!rs.ok()) {
    RESHARD_LOG(WARNING) << "operation " << operation_id << ": final ReportProgress: " << rs;
  }
  if (abort && result.ok()) {
    // Committed nowhere: the coordinator discards the generation too.
    store_->DropGeneration(task.job_id(), task.to_generation());
  }
  if (result.ok() && prepare && !abort) {
    // Held until the transfer phase is assigned (StartAssigned). Also when
    // the report was lost: a coordinator that still lists the prepare then
    // gets it run again.
    std::lock_guard<std::mutex> l(mu_);
    prepared_[operation_id] = PreparedOp{task.job_id(), task.to_generation(), ++list_clock_};
    op->prepared.store(true);
    cv_.notify_all();
  }
  finish_metrics(!result.ok() ? TaskResult::kFailed
                 : abort      ? TaskResult::kAborted
                              : TaskResult::kDone);
  op->finished.store(true);
}

}  // namespace reshard::agent
