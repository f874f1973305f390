// WorkerService (proto/reshard/v1/worker.proto): the API the training
// workers of this host use on the agent's unix socket to publish their
// rank's shards (written in place into shared memory, then sealed) and to
// open the shards of a generation. Item sizes come from the job's PTC and
// layout (RankItemBytes), fetched from the coordinator's GetJob.
//
// Every call must carry the worker token of the job it names
// (`authorization: Bearer wt-JOB.MAC`, docs/security.md "Worker tokens"):
// the agent compares its SHA-256, in constant time, with the one the
// coordinator's GetJob gives agents for jobs placed on their host. No token:
// UNAUTHENTICATED; another job's token or a wrong one: PERMISSION_DENIED
// naming the job (never the token). Thread-safe.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>

#include "absl/status/statusor.h"
#include "agent/device/device_api.h"
#include "agent/process/job_cache.h"
#include "agent/process/metrics.h"
#include "agent/process/worker_socket.h"
#include "agent/shard_store/device_buffer.h"
#include "agent/shard_store/shard_store.h"
#include "grpcpp/grpcpp.h"
#include "reshard/v1/coordinator.grpc.pb.h"
#include "reshard/v1/worker.grpc.pb.h"

namespace reshard::agent {

class WorkerServiceImpl final : public v1::WorkerService::Service {
 public:
  /// `store` and `metrics` (may be null) are not owned and must outlive the
  /// service; `coordinator` reaches CoordinatorService. Every handler is
  /// timed into reshard_agent_worker_rpc_duration_seconds{method, code}.
  /// What the service fetches of the jobs (PTC and layout per generation,
  /// token hashes) is cached in at most `cache_bytes` (AgentConfig's
  /// --worker-cache-bytes) and forgotten when the store drops the generation
  /// or the job's last buffer (the service is the store's drop listener
  /// while it lives).
  WorkerServiceImpl(ShardStore* store, std::shared_ptr<grpc::Channel> coordinator,
                    AgentMetrics* metrics = nullptr, int64_t cache_bytes = kDefaultCacheBytes);
  ~WorkerServiceImpl() override;
  WorkerServiceImpl(const WorkerServiceImpl&) = delete;
  WorkerServiceImpl& operator=(const WorkerServiceImpl&) = delete;

  static constexpr int64_t kDefaultCacheBytes = int64_t{64} << 20;

  /// The generation a running checkpoint task copies the layout of when it
  /// waits for a publish of (job, generation, rank), else 0
  /// (CoordinatorSession::AcceptsPublish). Set before the server serves.
  using PublishGate = std::function<int64_t(const std::string&, int64_t, int)>;
  void SetPublishGate(PublishGate gate) { publish_gate_ = std::move(gate); }
  /// For a publish that a checkpoint opens before its task reached this
  /// agent: fetch the task now and wait up to the last argument's
  /// milliseconds for the gate to open (CoordinatorSession::
  /// AwaitPublishAccepted); returns what the gate then says. Unset: such a
  /// publish answers UNAVAILABLE at once (the worker retries). Set before
  /// the server serves.
  using PublishWait = std::function<int64_t(const std::string&, int64_t, int, int)>;
  void SetPublishWait(PublishWait wait) { publish_wait_ = std::move(wait); }
  /// The socket the calls come from (not owned; may stay unset): log lines
  /// then name the caller's pid, uid and gid (SO_PEERCRED).
  void SetSocket(const WorkerSocket* socket) { socket_ = socket; }
  /// The agent's device API and device store (not owned; both or neither):
  /// PublishDeviceShard and OpenDeviceGeneration answer FAILED_PRECONDITION
  /// without them, and OpenGeneration stages a device-resident generation to
  /// host with them. Set before the server serves.
  void SetDevices(DeviceApi* api, DeviceBufferStore* devices) {
    device_api_ = api;
    devices_ = devices;
  }

  grpc::Status PublishShard(grpc::ServerContext* ctx, const v1::PublishShardRequest* req,
                            v1::PublishShardResponse* resp) override;
  grpc::Status SealShard(grpc::ServerContext* ctx, const v1::SealShardRequest* req,
                         v1::SealShardResponse* resp) override;
  grpc::Status OpenGeneration(grpc::ServerContext* ctx, const v1::OpenGenerationRequest* req,
                              v1::OpenGenerationResponse* resp) override;
  /// CUDA IPC (worker_service_device.cc): the worker's device items copied
  /// device to device into a device buffer of the agent, sealed.
  grpc::Status PublishDeviceShard(grpc::ServerContext* ctx,
                                  const v1::PublishDeviceShardRequest* req,
                                  v1::PublishDeviceShardResponse* resp) override;
  /// A sealed rank as a device buffer and its IPC handle.
  grpc::Status OpenDeviceGeneration(grpc::ServerContext* ctx,
                                    const v1::OpenDeviceGenerationRequest* req,
                                    v1::OpenDeviceGenerationResponse* resp) override;

  /// A request of the worker socket's companion `<socket>.fds`
  /// (worker_fd_socket.h) from `caller` ("pid P uid U gid G"): a descriptor
  /// of the rank buffer it names, admitted as the gRPC calls are (the job's
  /// worker token) and only for what the buffer's state allows: ACCESS_PUBLISH
  /// a writable one of a buffer PublishShard made and nobody sealed,
  /// ACCESS_LOAD a read-only one of a sealed buffer, ACCESS_PUBLISHED_READ a
  /// read-only one of a buffer ACCESS_PUBLISH would open (a worker keeps its
  /// view of it private while it is sealed in place). Errors name job,
  /// generation and rank; the caller closes the descriptor.
  absl::StatusOr<RankBuffer::WorkerFile> OpenForWorker(const v1::WorkerFdRequest& req,
                                                       const std::string& caller);

 private:
  /// Whether the call's worker token is job `job_id`'s (see above).
  absl::Status Admit(const grpc::ServerContext& ctx, const char* method, const std::string& job_id);
  /// Admit for a `token` (null: none presented) from `caller`.
  absl::Status AdmitToken(const std::string* token, const std::string& caller, const char* method,
                          const std::string& job_id);
  /// The buffer states in which a worker may write (PublishShard) or read
  /// (OpenGeneration) `buffer`: FailedPrecondition naming it otherwise.
  static absl::Status CheckPublishable(const RankBufferKey& key, const RankBuffer& buffer);
  static absl::Status CheckLoadable(const RankBufferKey& key, const RankBuffer& buffer);
  /// The SHA-256 of job `job_id`'s worker token (cached: it never changes).
  absl::StatusOr<std::string> TokenSha256(const std::string& job_id);

  grpc::Status DoPublishShard(const v1::PublishShardRequest* req, v1::PublishShardResponse* resp);
  grpc::Status DoSealShard(const v1::SealShardRequest* req, v1::SealShardResponse* resp);
  grpc::Status DoOpenGeneration(const v1::OpenGenerationRequest* req,
                                v1::OpenGenerationResponse* resp);
  // `peer_pid`: the caller's process (PeerPid), whose memory alone its IPC
  // handles may name.
  grpc::Status DoPublishDeviceShard(const v1::PublishDeviceShardRequest* req,
                                    v1::PublishDeviceShardResponse* resp, int64_t peer_pid);
  // The caller's pid as the kernel recorded it at connect (SO_PEERCRED);
  // 0 when unknown (no socket set, or a connection not accepted by it).
  int64_t PeerPid(const grpc::ServerContext& ctx) const;
  grpc::Status DoOpenDeviceGeneration(const v1::OpenDeviceGenerationRequest* req,
                                      v1::OpenDeviceGenerationResponse* resp);
  /// FailedPrecondition saying how to enable a device when the agent has none.
  absl::Status RequireDevices(const char* method) const;
  /// Copies the device items of `req` into `buffer` (IpcOpen, D2D on one
  /// stream, synchronize, IpcClose).
  absl::Status CopyDeviceItems(const v1::PublishDeviceShardRequest& req,
                               const DeviceRankBuffer& buffer, int64_t peer_pid);

  using JobGeneration = JobCache::Generation;
  /// The PTC and layout a worker publishes (job, generation, rank) against
  /// (a checkpoint's: the generation it copies the layout of), with the rank
  /// in range: PublishShard's and PublishDeviceShard's admission of the
  /// generation.
  absl::StatusOr<std::shared_ptr<const JobGeneration>> PublishLayout(const std::string& job_id,
                                                                     int64_t generation, int rank);
  /// The PTC and layout of (job, generation); FailedPrecondition when
  /// `require_current` and it is not the job's current generation.
  absl::StatusOr<std::shared_ptr<const JobGeneration>> Lookup(const std::string& job_id,
                                                              int64_t generation,
                                                              bool require_current);
  /// Whether `generation` is after the current one of `job_id` and an
  /// operation (a checkpoint whose task has not arrived here yet) runs.
  bool CheckpointOpening(const std::string& job_id, int64_t generation);
  /// GetJob at the coordinator (10 s deadline); PERMISSION_DENIED (the job
  /// is not placed here) becomes FailedPrecondition.
  absl::StatusOr<v1::Job> FetchJob(const std::string& job_id, bool include_ptc);
  /// Fills names and local shapes of `buffer`'s items (when `jg` is known),
  /// offsets and sizes always.
  static void DescribeItems(const JobGeneration* jg, int rank, const std::vector<ItemSlot>& slots,
                            google::protobuf::RepeatedPtrField<v1::WorkerItem>* items);

  /// Who called: "pid P uid U gid G" when the socket knows, else the peer.
  std::string Caller(const grpc::ServerContext& ctx) const;

  ShardStore* store_;
  AgentMetrics* metrics_;
  PublishGate publish_gate_;
  PublishWait publish_wait_;
  const WorkerSocket* socket_ = nullptr;
  DeviceApi* device_api_ = nullptr;
  DeviceBufferStore* devices_ = nullptr;
  std::unique_ptr<v1::CoordinatorService::Stub> stub_;
  const std::shared_ptr<JobCache> cache_;  // shared with the store's drop listener
};

}  // namespace reshard::agent
