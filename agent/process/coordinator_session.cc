#include "agent/process/coordinator_session.h"

#include <algorithm>
#include <chrono>
#include <set>
#include <vector>

#include "absl/random/random.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "agent/executor/peer_wait.h"
#include "agent/process/session_rpc.h"
#include "agent/transfer/backend.h"
#include "common/log.h"
#include "common/rpc/retry.h"
#include "common/rpc/status.h"

namespace reshard::agent {

absl::StatusOr<std::shared_ptr<grpc::Channel>> CoordinatorChannel(const std::string& target,
                                                                  const TlsFiles& tls,
                                                                  bool own_connection) {
  absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> credentials =
      MakeChannelCredentials(tls);
  if (!credentials.ok()) return credentials.status();
  if (tls.insecure) {
    RESHARD_LOG(WARNING) << "--insecure: plaintext to the coordinator at " << target
                         << "; anyone on the path can read and forge this host's reports";
  }
  if (!own_connection) return grpc::CreateChannel(target, *credentials);
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  return grpc::CreateCustomChannel(target, *credentials, args);
}

using session_rpc::SetDeadline;

CoordinatorSession::CoordinatorSession(Options options, std::shared_ptr<grpc::Channel> channel,
                                       ShardStore* store, TaskExecutor* executor,
                                       Transport* transport,
                                       std::shared_ptr<grpc::Channel> heartbeat_channel)
    : options_(std::move(options)),
      stub_(v1::AgentService::NewStub(channel)),
      heartbeat_stub_(v1::AgentService::NewStub(heartbeat_channel != nullptr ? heartbeat_channel
                                                                             : channel)),
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
  *h.mutable_probe() = options_.probe;
  // The devices of the device API this agent uses (the one its store and
  // executor use), each with the bytes of rank buffers it may hold: the
  // store's limit (the per-device limit, else the device's total memory:
  // DeviceBufferStore::Open's rule); 0 without a store. Without a device
  // API, state stays in host memory: the CUDA devices the training uses (for
  // the advisor) with memory_bytes 0, as they hold no rank buffer, else one
  // "cpu" device.
  auto add_device = [&](int index, const std::string& kind, const std::string& name,
                        int64_t memory_bytes) {
    v1::Device* d = h.add_devices();
    d->set_index(index);
    d->set_kind(kind);
    d->set_name(name);
    d->set_memory_bytes(memory_bytes);
  };
  if (options_.device_api != nullptr) {
    const DeviceApiCapabilities caps = options_.device_api->capabilities();
    for (int i = 0; i < caps.device_count; ++i) {
      add_device(i, caps.name, absl::StrCat(caps.name, ":", i),
                 options_.devices != nullptr ? options_.devices->limit_bytes(i) : 0);
    }
  } else if (const int cuda = CudaDeviceCount(); cuda > 0) {
    for (int i = 0; i < cuda; ++i) add_device(i, "cuda", absl::StrCat("cuda:", i), 0);
  } else {
    add_device(0, "cpu", "cpu", options_.memory_limit_bytes);
  }
  // Only backends that loaded here and that an execution path uses.
  for (const std::string& name :
       AdvertisedTransports(LoadedBackends(transport_, options_.device_api, options_.device_comm,
                                           options_.device_ipc))) {
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
  auto add_held = [&](const RankBufferKey& key, bool sealed, const std::vector<uint64_t>& sums) {
    v1::HeldRank* held = req.add_held_ranks();
    held->set_job_id(key.job_id);
    held->set_generation(key.generation);
    held->set_rank(key.rank);
    held->set_sealed(sealed);
    if (sealed) {
      for (uint64_t c : sums) held->add_checksums(c);
    }
  };
  for (const RankBufferKey& key : store_->List()) {
    jobs.insert(key.job_id);
    absl::StatusOr<RankBufferPtr> buffer = store_->Get(key);
    if (!buffer.ok()) continue;  // dropped since the listing
    add_held(key, (*buffer)->sealed(), (*buffer)->checksums());
  }
  // Device-resident ranks (those not also staged to host) are held too.
  if (options_.devices != nullptr) {
    for (const RankBufferKey& key : options_.devices->List()) {
      jobs.insert(key.job_id);
      absl::StatusOr<DeviceRankBufferPtr> buffer = options_.devices->Get(key);
      if (!buffer.ok() || store_->Get(key).ok()) continue;
      add_held(key, (*buffer)->sealed(), (*buffer)->checksums());
    }
  }
  for (const std::string& job : jobs) req.add_held_jobs(job);
  v1::RegisterAgentResponse resp;
  grpc::ClientContext ctx;
  SetDeadline(&ctx);
  absl::Status s = rpc::FromGrpc(stub_->RegisterAgent(&ctx, req, &resp));
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
  // Failed calls in a row (RegisterAgent, then Heartbeat): the backoff's
  // attempt number (common/rpc/retry.h, kAgentCall: jittered so that a
  // coordinator back from a restart is not met by every agent at once).
  int failures = 0;
  absl::BitGen rng;
  const auto backoff_ms = [&] {
    return static_cast<int>(absl::ToInt64Milliseconds(
        rpc::Backoff(rpc::DefaultPolicy(rpc::CallKind::kAgentCall), ++failures, rng)));
  };
  // When this heartbeat should have left (the previous one's send plus its
  // period); how much later it leaves is the agent's own scheduling lag.
  std::chrono::steady_clock::time_point planned{};
  while (!stopping_.load()) {
    if (!registered) {
      const auto register_sent = std::chrono::steady_clock::now();
      absl::Status s = Register();
      NoteReach(s, register_sent);
      if (!s.ok()) {
        const int wait_ms = backoff_ms();
        RESHARD_LOG(WARNING) << "host " << options_.host_id << ": RegisterAgent: " << s
                             << "; retrying in " << wait_ms << " ms";
        if (!Sleep(wait_ms)) break;
        continue;
      }
      registered = true;
      failures = 0;
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
    if (options_.metrics != nullptr) req.set_bytes_written(options_.metrics->bytes_written());
    {
      std::lock_guard<std::mutex> l(mu_);
      req.set_tasks_running(static_cast<int32_t>(ops_.size()));
    }
    v1::HeartbeatResponse resp;
    grpc::ClientContext ctx;
    SetDeadline(&ctx);
    const auto heartbeat_sent = std::chrono::steady_clock::now();
    if (planned != std::chrono::steady_clock::time_point{} && heartbeat_sent > planned) {
      req.set_scheduling_lag_ms(
          std::chrono::duration_cast<std::chrono::milliseconds>(heartbeat_sent - planned).count());
    }
    absl::Status s = rpc::FromGrpc(heartbeat_stub_->Heartbeat(&ctx, req, &resp));
    NoteReach(s, heartbeat_sent);
    if (options_.metrics != nullptr) options_.metrics->HeartbeatDone(s.ok());
    int period = options_.heartbeat_ms > 0
                     ? options_.heartbeat_ms
                     : static_cast<int>(std::max<int64_t>(lease_ms_.load() / 3, 10));
    if (s.ok()) {
      failures = 0;
      if (resp.lease_ms() > 0) lease_ms_.store(resp.lease_ms());
      Apply(resp, listed_at);
    } else if (absl::IsNotFound(s) || absl::IsFailedPrecondition(s)) {
      RESHARD_LOG(WARNING) << "host " << options_.host_id << ": Heartbeat: " << s
                           << "; registering again";
      registered = false;
      continue;
    } else {
      const int wait_ms = backoff_ms();
      RESHARD_LOG(WARNING) << "host " << options_.host_id << ": Heartbeat: " << s
                           << "; retrying in " << wait_ms << " ms";
      period = std::min(period, wait_ms);
    }
    ReapFinished();
    planned = heartbeat_sent + std::chrono::milliseconds(period);
    const auto now = std::chrono::steady_clock::now();
    if (now >= planned) continue;  // late already: beat at once
    if (!Sleep(static_cast<int>(
            std::chrono::duration_cast<std::chrono::milliseconds>(planned - now).count()))) {
      break;
    }
  }
}

void CoordinatorSession::NoteReach(const absl::Status& s,
                                   std::chrono::steady_clock::time_point sent_at) {
  CoordinatorReach* reach = options_.coordinator_reach;
  if (reach == nullptr) return;
  // UNAVAILABLE (the coordinator's store does not answer, or the coordinator
  // does not) and a missed deadline are silence; a call this agent cancelled
  // says nothing; any other outcome is an answer.
  if (rpc::IsSilence(s.code())) {
    if (reach->Unanswered(sent_at)) {
      RESHARD_LOG(WARNING) << "host " << options_.host_id << ": the coordinator does not answer ("
                           << s << "); waits on peers stop counting until it does";
    }
  } else if (!absl::IsCancelled(s)) {
    const std::chrono::milliseconds silence = reach->Answered();
    if (silence.count() > 0) {
      RESHARD_LOG(INFO) << "host " << options_.host_id << ": the coordinator answers again after "
                        << silence.count() << " ms";
    }
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
  if (options_.devices != nullptr) {
    for (const RankBufferKey& key : options_.devices->List()) jobs.insert(key.job_id);
  }
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
  if (options_.devices != nullptr) {
    for (const RankBufferKey& key : options_.devices->List()) {
      if (deleted.count(key.job_id) == 0) continue;
      options_.devices->Drop(key);
      ++dropped;
    }
  }
  for (const std::string& job : deleted) {
    RESHARD_LOG(INFO) << "job " << job << " was deleted: its buffers here are dropped";
  }
  RESHARD_LOG(INFO) << "dropped " << dropped << " rank buffers of " << deleted.size()
                    << " deleted jobs; " << store_->used_bytes() << " bytes used";
}

void CoordinatorSession::DropGeneration(const std::string& job_id, int64_t generation) {
  store_->DropGeneration(job_id, generation);
  if (options_.devices != nullptr) options_.devices->DropGeneration(job_id, generation);
}

void CoordinatorSession::Release(
    const google::protobuf::RepeatedPtrField<v1::GenerationRef>& generations) {
  for (const v1::GenerationRef& g : generations) {
    RESHARD_LOG(DEBUG) << "job " << g.job_id() << ": releasing generation " << g.generation();
    DropGeneration(g.job_id(), g.generation());
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
    DropGeneration(g.job_id(), g.generation());
  }
  Release(r.release());
  StartAssigned(r.assigned_operations(), listed_at);
}

absl::Status CoordinatorSession::Report(const v1::ReportProgressRequest& req, bool retry,
                                        bool* abort) {
  absl::BitGen rng;
  for (int attempt = 0;; ++attempt) {
    v1::ReportProgressResponse resp;
    grpc::ClientContext ctx;
    SetDeadline(&ctx);
    const auto sent = std::chrono::steady_clock::now();
    absl::Status s = rpc::FromGrpc(stub_->ReportProgress(&ctx, req, &resp));
    NoteReach(s, sent);
    if (s.ok()) {
      if (resp.abort()) *abort = true;
      return s;
    }
    // A final report is worth retrying for a while: the coordinator may be
    // restarting. It aborts the operation itself if the host stays silent.
    if (!retry || !rpc::IsRetryable(rpc::CallKind::kAgentCall, s.code()) || attempt >= 30 ||
        stopping_.load()) {
      return s;
    }
    const absl::Duration wait =
        rpc::Backoff(rpc::DefaultPolicy(rpc::CallKind::kAgentCall), attempt + 1, rng);
    if (!Sleep(static_cast<int>(absl::ToInt64Milliseconds(wait)))) return s;
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

}  // namespace reshard::agent
