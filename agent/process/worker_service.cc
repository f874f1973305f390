#include "agent/process/worker_service.h"

#if defined(__GLIBC__)
#include <malloc.h>
#endif
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <limits>
#include <optional>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "agent/executor/peer_proof.h"
#include "agent/process/coordinator_session.h"
#include "agent/shard_store/device_staging.h"
#include "common/log.h"
#include "common/rpc/status.h"
#include "planner/bucket.h"
#include "planner/layout.h"
#include "planner/shard.h"

namespace reshard::agent {
namespace {

// How long a publish waits for a checkpoint's task to reach this agent
// before it answers UNAVAILABLE (and the worker retries).
constexpr int kPublishWaitMs = 5000;

absl::Status CheckKey(const std::string& job_id, int64_t generation, int32_t rank) {
  if (job_id.empty()) return absl::InvalidArgumentError("job_id is empty");
  if (generation <= 0) {
    return absl::InvalidArgumentError(absl::StrCat("generation ", generation, " must be > 0"));
  }
  if (rank < 0) return absl::InvalidArgumentError(absl::StrCat("rank ", rank, " must be >= 0"));
  return absl::OkStatus();
}

// Runs a handler body, recording its time and status code (named like the
// coordinator's `code` label: "OK", "INVALID_ARGUMENT", ...).
template <typename Body>
grpc::Status Timed(AgentMetrics* metrics, const char* method, Body&& body) {
  const auto start = std::chrono::steady_clock::now();
  grpc::Status status = body();
  if (metrics != nullptr) {
    const std::chrono::duration<double> seconds = std::chrono::steady_clock::now() - start;
    metrics->WorkerRpcDone(method, rpc::CodeName(rpc::FromGrpc(status).code()), seconds.count());
  }
  return status;
}

// Gives the heap's free pages back to the system after the store dropped a
// generation. glibc keeps what a thread freed for that thread's arena, and
// an operation's copies of a job's PTC and plan (the task, GetJob replies,
// the cache's entry) are made and freed on many threads: without a trim the
// agent's RSS climbed by about 0.25 MB per checkpoint of a 2,000-tensor PTC
// (flat with one arena, or with this). At most once a second (malloc_trim
// walks every arena), and always when `force` (a job's last buffer went).
class HeapTrimmer {
 public:
  void AfterDrop(bool force) {
#if defined(__GLIBC__)
    const int64_t now = std::chrono::duration_cast<std::chrono::milliseconds>(
                            std::chrono::steady_clock::now().time_since_epoch())
                            .count();
    int64_t last = last_ms_.load();
    if (!force && now - last < kMinIntervalMs) return;
    if (!last_ms_.compare_exchange_strong(last, now) && !force) return;  // another drop trims
    ::malloc_trim(0);
#else
    (void)force;
#endif
  }

 private:
  static constexpr int64_t kMinIntervalMs = 1000;
  std::atomic<int64_t> last_ms_{std::numeric_limits<int64_t>::min() / 2};
};

int WorldSize(const v1::Layout& layout) {
  const v1::ParallelConfig& c = layout.config();
  return static_cast<int>(planner::WorldSize(c));
}

}  // namespace

WorkerServiceImpl::WorkerServiceImpl(ShardStore* store, std::shared_ptr<grpc::Channel> coordinator,
                                     AgentMetrics* metrics, int64_t cache_bytes)
    : store_(store),
      metrics_(metrics),
      stub_(v1::CoordinatorService::NewStub(coordinator)),
      cache_(std::make_shared<JobCache>(cache_bytes, [metrics](const JobCache::Stats& s) {
        if (metrics != nullptr) metrics->SetWorkerCache(s.bytes, s.generations, s.tokens);
      })) {
  // A generation the host no longer holds (released after its successor
  // committed, retired, discarded) is forgotten, and so is a job once its
  // last buffer here goes (DeleteJob, or it moved away): the cache holds
  // what the host holds, not every generation a job ever had.
  store_->SetDropListener([cache = cache_, trimmer = std::make_shared<HeapTrimmer>()](
                              const std::string& job_id, int64_t generation, bool job_held) {
    cache->Forget(job_id, generation);
    if (!job_held) cache->ForgetJob(job_id);
    trimmer->AfterDrop(/*force=*/!job_held);
  });
}

WorkerServiceImpl::~WorkerServiceImpl() { store_->SetDropListener(nullptr); }

grpc::Status WorkerServiceImpl::PublishShard(grpc::ServerContext* ctx,
                                             const v1::PublishShardRequest* req,
                                             v1::PublishShardResponse* resp) {
  return Timed(metrics_, "PublishShard", [&] {
    absl::Status s = CheckKey(req->job_id(), req->generation(), req->rank());
    if (s.ok()) s = Admit(*ctx, "PublishShard", req->job_id());
    return s.ok() ? DoPublishShard(req, resp) : rpc::ToGrpc(s);
  });
}

grpc::Status WorkerServiceImpl::SealShard(grpc::ServerContext* ctx, const v1::SealShardRequest* req,
                                          v1::SealShardResponse* resp) {
  return Timed(metrics_, "SealShard", [&] {
    absl::Status s = CheckKey(req->job_id(), req->generation(), req->rank());
    if (s.ok()) s = Admit(*ctx, "SealShard", req->job_id());
    if (!s.ok()) return rpc::ToGrpc(s);
    grpc::Status sealed = DoSealShard(req, resp);
    if (sealed.ok()) {
      RESHARD_LOG(INFO) << "job " << req->job_id() << " generation " << req->generation()
                        << " rank " << req->rank() << " sealed by worker " << Caller(*ctx);
    }
    return sealed;
  });
}

grpc::Status WorkerServiceImpl::OpenGeneration(grpc::ServerContext* ctx,
                                               const v1::OpenGenerationRequest* req,
                                               v1::OpenGenerationResponse* resp) {
  return Timed(metrics_, "OpenGeneration", [&] {
    absl::Status s = CheckKey(req->job_id(), req->generation(), req->rank());
    if (s.ok()) s = Admit(*ctx, "OpenGeneration", req->job_id());
    return s.ok() ? DoOpenGeneration(req, resp) : rpc::ToGrpc(s);
  });
}

grpc::Status WorkerServiceImpl::PublishDeviceShard(grpc::ServerContext* ctx,
                                                   const v1::PublishDeviceShardRequest* req,
                                                   v1::PublishDeviceShardResponse* resp) {
  return Timed(metrics_, "PublishDeviceShard", [&] {
    absl::Status s = CheckKey(req->job_id(), req->generation(), req->rank());
    if (s.ok()) s = Admit(*ctx, "PublishDeviceShard", req->job_id());
    if (!s.ok()) return rpc::ToGrpc(s);
    grpc::Status sealed = DoPublishDeviceShard(req, resp, PeerPid(*ctx));
    if (sealed.ok()) {
      RESHARD_LOG(INFO) << "job " << req->job_id() << " generation " << req->generation()
                        << " rank " << req->rank() << " published on device " << resp->device()
                        << " (CUDA IPC) and sealed by worker " << Caller(*ctx);
    }
    return sealed;
  });
}

grpc::Status WorkerServiceImpl::OpenDeviceGeneration(grpc::ServerContext* ctx,
                                                     const v1::OpenDeviceGenerationRequest* req,
                                                     v1::OpenDeviceGenerationResponse* resp) {
  return Timed(metrics_, "OpenDeviceGeneration", [&] {
    absl::Status s = CheckKey(req->job_id(), req->generation(), req->rank());
    if (s.ok()) s = Admit(*ctx, "OpenDeviceGeneration", req->job_id());
    return s.ok() ? DoOpenDeviceGeneration(req, resp) : rpc::ToGrpc(s);
  });
}

absl::StatusOr<std::string> WorkerServiceImpl::TokenSha256(const std::string& job_id) {
  if (std::optional<std::string> cached = cache_->FindToken(job_id)) return *std::move(cached);
  absl::StatusOr<v1::Job> fetched = FetchJob(job_id, /*include_ptc=*/false);
  if (!fetched.ok()) return fetched.status();
  const v1::Job& job = *fetched;
  if (job.worker_token_sha256().size() != 32) {
    return absl::FailedPreconditionError(
        absl::StrCat("the coordinator gave no worker token hash for job \"", job_id,
                     "\" (a coordinator without worker tokens): refusing every worker of the job"));
  }
  cache_->PutToken(job_id, job.worker_token_sha256());
  return job.worker_token_sha256();
}

int64_t WorkerServiceImpl::PeerPid(const grpc::ServerContext& ctx) const {
  if (socket_ == nullptr) return 0;
  std::optional<PeerCredentials> c = socket_->CredentialsOf(ctx.peer());
  return c.has_value() ? c->pid : 0;
}

std::string WorkerServiceImpl::Caller(const grpc::ServerContext& ctx) const {
  return socket_ != nullptr ? socket_->Describe(ctx.peer()) : ctx.peer();
}

absl::Status WorkerServiceImpl::Admit(const grpc::ServerContext& ctx, const char* method,
                                      const std::string& job_id) {
  const auto& metadata = ctx.client_metadata();
  const auto header = metadata.find("authorization");
  constexpr absl::string_view kBearer = "Bearer ";
  if (header == metadata.end() ||
      !absl::StartsWith(absl::string_view(header->second.data(), header->second.size()), kBearer)) {
    return AdmitToken(nullptr, Caller(ctx), method, job_id);
  }
  const std::string token(header->second.data() + kBearer.size(),
                          header->second.size() - kBearer.size());
  return AdmitToken(&token, Caller(ctx), method, job_id);
}

absl::Status WorkerServiceImpl::AdmitToken(const std::string* presented, const std::string& caller,
                                           const char* method, const std::string& job_id) {
  if (presented == nullptr || presented->empty()) {
    RESHARD_LOG(WARNING) << "worker " << caller << ": " << method << " of job " << job_id
                         << " refused: no worker token";
    return absl::UnauthenticatedError(absl::StrCat(
        method, " of job \"", job_id,
        "\": no worker token (send `authorization: Bearer <the job's worker token>`, from "
        "RegisterJob or `reshardctl jobs worker-token JOB`; Python: Worker(worker_token=...) or "
        "RESHARD_WORKER_TOKEN)"));
  }
  const std::string& token = *presented;
  if (!absl::StartsWith(token, "wt-")) {
    RESHARD_LOG(WARNING) << "worker " << caller << ": " << method << " of job " << job_id
                         << " refused: not a worker token";
    return absl::UnauthenticatedError(absl::StrCat(
        method, " of job \"", job_id,
        "\": the bearer token is not a worker token (expected wt-JOB.MAC, from RegisterJob or "
        "`reshardctl jobs worker-token JOB`)"));
  }
  absl::StatusOr<std::string> expected = TokenSha256(job_id);
  if (!expected.ok()) {
    return absl::Status(
        expected.status().code(),
        absl::StrCat(method, " of job \"", job_id, "\" refused: ", expected.status().message()));
  }
  if (!ConstantTimeEqual(Sha256Of(token), *expected)) {
    RESHARD_LOG(WARNING) << "worker " << caller << ": " << method << " of job " << job_id
                         << " refused: not the job's worker token";
    return absl::PermissionDeniedError(absl::StrCat(
        method, " of job \"", job_id, "\" refused: the worker token presented is not job \"",
        job_id, "\"'s (a worker may use only the job whose token it holds)"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::shared_ptr<const WorkerServiceImpl::JobGeneration>> WorkerServiceImpl::Lookup(
    const std::string& job_id, int64_t generation, bool require_current) {
  if (!require_current) {
    if (JobCache::GenerationPtr cached = cache_->Find(job_id, generation)) return cached;
  }
  absl::StatusOr<v1::Job> fetched = FetchJob(job_id, /*include_ptc=*/true);
  if (!fetched.ok()) return fetched.status();
  const v1::Job& job = *fetched;
  auto jg = std::make_shared<JobGeneration>();
  jg->ptc = job.ptc();
  jg->layout = job.layout();
  cache_->Put(job_id, job.generation(), jg);
  if (job.generation() != generation) {
    if (!require_current) {
      if (JobCache::GenerationPtr cached = cache_->Find(job_id, generation)) return cached;
    }
    return absl::FailedPreconditionError(absl::StrCat("job \"", job_id, "\" is at generation ",
                                                      job.generation(), ", not ", generation));
  }
  return std::shared_ptr<const JobGeneration>(jg);
}

bool WorkerServiceImpl::CheckpointOpening(const std::string& job_id, int64_t generation) {
  absl::StatusOr<v1::Job> job = FetchJob(job_id, /*include_ptc=*/false);
  return job.ok() && generation > job->generation() && !job->active_operation_id().empty();
}

absl::StatusOr<v1::Job> WorkerServiceImpl::FetchJob(const std::string& job_id, bool include_ptc) {
  v1::GetJobRequest req;
  req.set_job_id(job_id);
  req.set_include_ptc(include_ptc);
  v1::Job job;
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  // A restarted coordinator leaves the channel in reconnect backoff for a
  // while; wait for it (within the deadline) instead of failing the worker's
  // call at once with "connection refused".
  ctx.set_wait_for_ready(true);
  absl::Status s = rpc::FromGrpc(stub_->GetJob(&ctx, req, &job));
  if (s.code() == absl::StatusCode::kPermissionDenied) {
    // An agent may read only the jobs placed on its host (docs/security.md):
    // for the worker, the job is not (or no longer) here, a precondition.
    return absl::FailedPreconditionError(s.message());
  }
  if (!s.ok()) return rpc::WithContext(s, absl::StrCat("GetJob \"", job_id, "\""));
  return job;
}

void WorkerServiceImpl::DescribeItems(const JobGeneration* jg, int rank,
                                      const std::vector<ItemSlot>& slots,
                                      google::protobuf::RepeatedPtrField<v1::WorkerItem>* items) {
  std::optional<planner::ResolvedLayout> rl;
  std::optional<planner::Buckets> buckets;
  if (jg != nullptr && rank < WorldSize(jg->layout)) {
    planner::HostTable hosts;
    rl = planner::ResolvedLayout::Resolve(jg->layout, jg->ptc.num_layers(), &hosts);
    buckets.emplace(jg->ptc, *rl);
  }
  for (size_t i = 0; i < slots.size(); ++i) {
    v1::WorkerItem* it = items->Add();
    it->set_offset(slots[i].offset);
    it->set_bytes(slots[i].bytes);
    if (jg == nullptr) continue;
    const int ntensors = jg->ptc.tensors_size();
    if (static_cast<int>(i) < ntensors) {
      const v1::TensorSpec& t = jg->ptc.tensors(static_cast<int>(i));
      it->set_name(t.name());
      if (rl.has_value() && slots[i].bytes > 0) {
        const planner::CoordShard cs =
            planner::DeriveRankShard(jg->ptc, static_cast<int>(i), *rl, *buckets, rank);
        for (int64_t d : cs.local_shape) it->add_local_shape(d);
      }
    } else if (static_cast<int>(i) - ntensors < jg->ptc.blobs_size()) {
      it->set_name(jg->ptc.blobs(static_cast<int>(i) - ntensors).name());
    }
  }
}

absl::StatusOr<std::shared_ptr<const WorkerServiceImpl::JobGeneration>>
WorkerServiceImpl::PublishLayout(const std::string& job_id, int64_t generation, int rank) {
  // A checkpoint's workers publish the generation after the current one, on
  // the same layout (HostTask.publish_by_workers).
  int64_t from = publish_gate_ ? publish_gate_(job_id, generation, rank) : 0;
  absl::StatusOr<std::shared_ptr<const JobGeneration>> jg =
      Lookup(job_id, from > 0 ? from : generation, /*require_current=*/true);
  if (!jg.ok() && absl::IsFailedPrecondition(jg.status()) && publish_wait_ &&
      CheckpointOpening(job_id, generation)) {
    // The checkpoint exists but its task has not reached this agent: fetch
    // it now rather than at the next heartbeat (issue 20).
    from = publish_wait_(job_id, generation, rank, kPublishWaitMs);
    if (from > 0) jg = Lookup(job_id, from, /*require_current=*/true);
  }
  if (!jg.ok() && absl::IsFailedPrecondition(jg.status()) &&
      CheckpointOpening(job_id, generation)) {
    // The checkpoint exists but this agent has not fetched its task yet.
    return absl::UnavailableError(absl::StrCat(
        "job \"", job_id, "\" generation ", generation,
        " is being opened for publishing by a checkpoint that has not reached this agent yet; "
        "retry"));
  }
  if (!jg.ok()) return jg.status();
  const int world = WorldSize((*jg)->layout);
  if (rank >= world) {
    return absl::InvalidArgumentError(absl::StrCat("rank ", rank, " out of range: job \"", job_id,
                                                   "\" generation ", generation, " has ", world,
                                                   " ranks"));
  }
  // A rank is published on the host its layout places it on: elsewhere its
  // buffer is one no operation reads, taking that host's memory until the
  // generation goes.
  const std::string host = store_->host_id();
  const std::vector<v1::DeviceSlot> slots = planner::ExpandPlacement((*jg)->layout.placement());
  if (!host.empty() && rank < static_cast<int>(slots.size()) && slots[rank].host() != host) {
    return absl::FailedPreconditionError(absl::StrCat(
        "job \"", job_id, "\" generation ", generation, " rank ", rank, " is placed on host \"",
        slots[rank].host(), "\" device ", slots[rank].device(), ", not on this agent's host \"",
        host,
        "\": a worker publishes a rank through the agent of the host that its layout places it "
        "on"));
  }
  return jg;
}

grpc::Status WorkerServiceImpl::DoPublishShard(const v1::PublishShardRequest* req,
                                               v1::PublishShardResponse* resp) {
  // Held in device memory (a device-resident rank; a CPU load may have
  // staged a host copy of it, which is not the worker's either).
  if (devices_ != nullptr && devices_->Get({req->job_id(), req->generation(), req->rank()}).ok()) {
    return rpc::ToGrpc(absl::FailedPreconditionError(absl::StrCat(
        "job \"", req->job_id(), "\" generation ", req->generation(), " rank ", req->rank(),
        " is in device memory here (PublishDeviceShard, or an "
        "operation's): a rank is published once")));
  }
  // A buffer the agent made under this key is an operation's (a transfer's
  // or a prepare's destination, or what one committed), never a worker's to
  // write: say so before asking the coordinator, which would take a
  // prepared generation for a checkpoint not here yet (UNAVAILABLE, retry).
  if (absl::StatusOr<RankBufferPtr> existing =
          store_->Get({req->job_id(), req->generation(), req->rank()});
      existing.ok() && !(*existing)->published()) {
    return rpc::ToGrpc(absl::FailedPreconditionError(absl::StrCat(
        "job \"", req->job_id(), "\" generation ", req->generation(), " rank ", req->rank(),
        " is written by an operation of the agent (a transfer or a prepare), not by workers")));
  }
  absl::StatusOr<std::shared_ptr<const JobGeneration>> jg =
      PublishLayout(req->job_id(), req->generation(), req->rank());
  if (!jg.ok()) return rpc::ToGrpc(jg.status());
  RankBufferKey key{req->job_id(), req->generation(), req->rank()};
  absl::StatusOr<RankBufferPtr> buf = store_->Get(key);
  if (absl::IsNotFound(buf.status())) {
    std::vector<int64_t> bytes = RankItemBytes((*jg)->ptc, (*jg)->layout, req->rank());
    absl::StatusOr<std::vector<RankBufferPtr>> created = store_->CreateAll(
        {key}, {bytes}, ShardStore::Backing::kPrefaulted, ShardStore::Writer::kWorker);
    if (created.ok()) {
      buf = (*created)[0];
    } else if (absl::IsAlreadyExists(created.status())) {
      buf = store_->Get(key);  // a concurrent publish of the same rank won
    } else {
      buf = created.status();
    }
  }
  if (!buf.ok()) return rpc::ToGrpc(buf.status());
  if (absl::Status s = CheckPublishable(key, **buf); !s.ok()) return rpc::ToGrpc(s);
  // Published before: a worker may have grown the file since.
  if (absl::Status s = store_->CheckWorkerBuffer(key); !s.ok()) return rpc::ToGrpc(s);
  resp->set_path((*buf)->path());
  resp->set_size((*buf)->size());
  DescribeItems(jg->get(), req->rank(), (*buf)->items(), resp->mutable_items());
  return grpc::Status::OK;
}

absl::Status WorkerServiceImpl::CheckPublishable(const RankBufferKey& key,
                                                 const RankBuffer& buffer) {
  // A sealed generation is immutable: what a transfer reads must be what
  // was sealed.
  if (buffer.sealed()) {
    return absl::FailedPreconditionError(
        absl::StrCat("job \"", key.job_id, "\" generation ", key.generation, " rank ", key.rank,
                     " is sealed: a sealed generation cannot be published again"));
  }
  // Only a buffer made by PublishShard is the worker's to write (not one a
  // task is filling).
  if (!buffer.published()) {
    return absl::FailedPreconditionError(
        absl::StrCat("job \"", key.job_id, "\" generation ", key.generation, " rank ", key.rank,
                     " is being written by a transfer, not by workers"));
  }
  return absl::OkStatus();
}

absl::Status WorkerServiceImpl::CheckLoadable(const RankBufferKey& key, const RankBuffer& buffer) {
  if (!buffer.sealed()) {
    return absl::FailedPreconditionError(absl::StrCat("job \"", key.job_id, "\" generation ",
                                                      key.generation, " rank ", key.rank,
                                                      " is not sealed"));
  }
  return absl::OkStatus();
}

absl::StatusOr<RankBuffer::WorkerFile> WorkerServiceImpl::OpenForWorker(
    const v1::WorkerFdRequest& req, const std::string& caller) {
  // ACCESS_PUBLISHED_READ: a read-only descriptor of a worker's unsealed
  // buffer, under the publish checks (zero-copy publish seals in place).
  const bool publish_read = req.access() == v1::WorkerFdRequest::ACCESS_PUBLISHED_READ;
  const bool publish = publish_read || req.access() == v1::WorkerFdRequest::ACCESS_PUBLISH;
  const char* method = publish_read ? "ShardFilePublishedRead"
                       : publish    ? "ShardFilePublish"
                                    : "ShardFileLoad";
  absl::StatusOr<RankBuffer::WorkerFile> out = absl::UnknownError("not run");
  Timed(metrics_, method, [&] {
    absl::Status s = CheckKey(req.job_id(), req.generation(), req.rank());
    if (s.ok() && !publish && req.access() != v1::WorkerFdRequest::ACCESS_LOAD) {
      s = absl::InvalidArgumentError(absl::StrCat("access ", static_cast<int>(req.access()),
                                                  " is none of ACCESS_PUBLISH, ACCESS_LOAD, "
                                                  "ACCESS_PUBLISHED_READ"));
    }
    if (s.ok()) s = AdmitToken(&req.worker_token(), caller, method, req.job_id());
    const RankBufferKey key{req.job_id(), req.generation(), req.rank()};
    absl::StatusOr<RankBufferPtr> buf = absl::UnknownError("not looked up");
    // A worker's buffer whose file holds more than planned (or was refused
    // for it) gets no descriptor: FailedPrecondition naming the sizes.
    if (s.ok() && publish) s = store_->CheckWorkerBuffer(key);
    if (s.ok()) {
      buf = store_->Get(key);
      if (absl::IsNotFound(buf.status()) && publish) {
        s = absl::NotFoundError(absl::StrCat("job \"", key.job_id, "\" generation ", key.generation,
                                             " rank ", key.rank,
                                             " has no buffer here: call PublishShard first"));
      } else {
        s = buf.status();
      }
    }
    if (s.ok()) s = publish ? CheckPublishable(key, **buf) : CheckLoadable(key, **buf);
    if (s.ok()) {
      out = (*buf)->OpenForWorker(/*writable=*/publish && !publish_read);
      // Sealed meanwhile: the descriptor must not outlive the check.
      if (out.ok() && publish && (*buf)->sealed()) {
        ::close(out->fd);
        out = CheckPublishable(key, **buf);
      }
      s = out.status();
    } else {
      out = s;
    }
    return rpc::ToGrpc(s);
  });
  return out;
}

grpc::Status WorkerServiceImpl::DoSealShard(const v1::SealShardRequest* req,
                                            v1::SealShardResponse* resp) {
  std::vector<uint64_t> expected(req->expected_checksums().begin(),
                                 req->expected_checksums().end());
  // Only a buffer the worker published is the worker's to seal: one the
  // agent made is an operation's (a transfer receiving into it, a prepare's
  // pre-copy), and sealing it would remap it read-only under the operation's
  // writes (issue 19: SIGSEGV in UCX's receive). SealForWorker checks that
  // under the store's lock: FailedPrecondition naming job, generation, rank.
  absl::StatusOr<std::vector<uint64_t>> sums =
      store_->SealForWorker({req->job_id(), req->generation(), req->rank()}, expected);
  if (!sums.ok()) return rpc::ToGrpc(sums.status());
  for (uint64_t c : *sums) resp->add_checksums(c);
  return grpc::Status::OK;
}

grpc::Status WorkerServiceImpl::DoOpenGeneration(const v1::OpenGenerationRequest* req,
                                                 v1::OpenGenerationResponse* resp) {
  RankBufferKey key{req->job_id(), req->generation(), req->rank()};
  absl::StatusOr<RankBufferPtr> buf = store_->Get(key);
  if (absl::IsNotFound(buf.status()) && devices_ != nullptr && devices_->Get(key).ok()) {
    // A device-resident rank: CPU loads get a host copy, sealed with the
    // device buffer's checksums (and kept while the generation is held).
    buf = StageToHost(*devices_, *store_, key);
  }
  if (!buf.ok()) return rpc::ToGrpc(buf.status());
  if (absl::Status s = CheckLoadable(key, **buf); !s.ok()) return rpc::ToGrpc(s);
  // Names and shapes are best effort: a generation that is no longer current
  // and was never published here has only offsets and sizes.
  absl::StatusOr<std::shared_ptr<const JobGeneration>> jg =
      Lookup(req->job_id(), req->generation(), /*require_current=*/false);
  resp->set_path((*buf)->path());
  resp->set_size((*buf)->size());
  DescribeItems(jg.ok() ? jg->get() : nullptr, req->rank(), (*buf)->items(), resp->mutable_items());
  for (int32_t item : (*buf)->regenerated()) {
    if (item < resp->items_size()) resp->mutable_items(item)->set_regenerated(true);
  }
  for (uint64_t c : (*buf)->checksums()) resp->add_checksums(c);
  return grpc::Status::OK;
}

}  // namespace reshard::agent
