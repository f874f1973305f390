// The agent's side of the coordinator protocol (docs/coordinator.md, "Hosts
// and leases", "A host's slice of a plan"): registers the host, heartbeats at
// a third of the lease, registers again when the coordinator forgot it or
// gave it up (new epoch) telling it what it holds, drops the buffers of jobs
// the coordinator says were deleted, retries with backoff while the coordinator is
// unreachable, runs every assigned operation once on its own thread
// (GetTask -> TaskExecutor::Execute, ReportProgress RUNNING every ~500 ms,
// then DONE or FAILED), and frees released and discarded generations.
// Two-phase (stop-free) operations (docs/agent.md, "Two phases"): a task
// with `prepare` ends PREPARED and the operation is held as prepared (its
// buffers kept) until it is assigned again, when its transfer phase runs.
// From registration on a second thread keeps a WaitForTasks long poll open,
// which starts new operations as soon as the coordinator creates them, the
// way a heartbeat does (StartAssigned); heartbeats then only renew the lease
// (and still start what they list, for coordinators without WaitForTasks).
// Thread-safe; Stop() is idempotent and joins every thread.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "agent/executor/executor.h"
#include "agent/process/metrics.h"
#include "agent/shard_store/device_buffer.h"
#include "agent/shard_store/shard_store.h"
#include "agent/transfer/device_comm.h"
#include "agent/transfer/transport.h"
#include "common/tls.h"
#include "grpcpp/grpcpp.h"
#include "reshard/v1/agent.grpc.pb.h"

namespace reshard::agent {

class CoordinatorReach;

/// The channel to the coordinator at `target` (host:port): mutual TLS with
/// this host's certificate, or plaintext when `tls.insecure` (a warning is
/// logged). InvalidArgument naming the flag when the files do not do.
/// `own_connection`: a connection of its own, shared with no other channel
/// (the heartbeat's: it never queues behind task and progress calls).
[[nodiscard]] absl::StatusOr<std::shared_ptr<grpc::Channel>> CoordinatorChannel(
    const std::string& target, const TlsFiles& tls, bool own_connection = false);

class CoordinatorSession {
 public:
  struct Options {
    std::string host_id;
    std::string address;  // what peers and workers use to reach this agent
    int64_t memory_limit_bytes = 0;
    int heartbeat_ms = 0;             // 0: a third of the lease
    AgentMetrics* metrics = nullptr;  // not owned; null: no metrics
    /// The device API and device store (not owned; both null without a
    /// device): advertised with the backends and as the host's devices (one
    /// per device, memory_bytes the store's limit of it), and a released,
    /// discarded or deleted generation's device buffers are dropped with its
    /// host ones.
    const DeviceApi* device_api = nullptr;
    DeviceBufferStore* devices = nullptr;
    /// The device communicator (not owned; null without one): advertised
    /// with the backends (LoadedBackends).
    const DeviceCommFactory* device_comm = nullptr;
    /// Whether the device API's IPC entry is advertised (--device-ipc).
    bool device_ipc = true;
    /// Told of every heartbeat (and registration): answered, or not
    /// (UNAVAILABLE, no answer: the coordinator or its store is away). The
    /// executor's timers that wait on peers read it (peer_wait.h). Not
    /// owned; null: not told.
    CoordinatorReach* coordinator_reach = nullptr;
    /// Sent with every registration (host_probe.h); unset: none.
    v1::HostProbe probe;
  };

  /// `transport` may be null (then only local plans can run); none are owned.
  /// Heartbeats go over `heartbeat_channel` (its own connection, so that
  /// they never wait behind other calls), else over `channel`.
  CoordinatorSession(Options options, std::shared_ptr<grpc::Channel> channel, ShardStore* store,
                     TaskExecutor* executor, Transport* transport,
                     std::shared_ptr<grpc::Channel> heartbeat_channel = nullptr);
  ~CoordinatorSession();

  /// Starts the heartbeat thread; it registers first.
  void Start();
  /// Cancels running operations and joins every thread. Idempotent.
  void Stop();

  int64_t epoch() const { return epoch_.load(); }

  /// When a running checkpoint task here waits for the workers to publish
  /// `rank` of `generation` of `job_id`: its from_generation (whose layout
  /// the new one keeps; WorkerService accepts that publish although the
  /// generation is not the job's current one). Else 0.
  int64_t AcceptsPublish(const std::string& job_id, int64_t generation, int rank) const;

  /// A worker publishes `rank` of `generation` of `job_id`, which a
  /// checkpoint opens but no task here has taken yet: instead of leaving the
  /// worker to wait for the next heartbeat (a third of the lease), asks the
  /// coordinator for this host's assigned operations now (WaitForTasks, one
  /// call at a time however many workers ask: the others wait for its
  /// answer), starts them, and waits until a checkpoint task accepts the
  /// publish or `timeout_ms` passes. AcceptsPublish's answer then (0: not in
  /// time, or stopping). Any thread.
  int64_t AwaitPublishAccepted(const std::string& job_id, int64_t generation, int rank,
                               int timeout_ms);

 private:
  struct RunningOp {
    std::string job_id;
    int64_t to_generation = 0;
    std::set<int> published_ranks;  // a checkpoint's ranks the workers write here
    int64_t from_generation = 0;
    bool task_fetched = false;  // GetTask answered (the fields above are set); under mu_
    std::atomic<bool> cancel{false};
    std::atomic<bool> finished{false};
    /// The task was a prepare and the coordinator took its PREPARED report:
    /// the operation is held in prepared_, not finished_.
    std::atomic<bool> prepared{false};
    /// Its PREPARED report is out (set before it is sent): the long poll no
    /// longer names it known, so that its transfer phase wakes the poll.
    std::atomic<bool> reporting_prepared{false};
    std::thread thread;
  };
  /// A prepared operation held until its transfer phase is assigned.
  struct PreparedOp {
    std::string job_id;
    int64_t to_generation = 0;
    /// list_clock_ when the PREPARED report was acknowledged: a list of
    /// assigned operations fetched before (still showing the prepare's
    /// ASSIGNED or RUNNING row) does not run it again.
    uint64_t acked_at = 0;
  };

  void Loop();
  /// Drops (job, generation)'s buffers from the host and device stores.
  void DropGeneration(const std::string& job_id, int64_t generation);
  [[nodiscard]] absl::Status Register();
  /// `listed_at`: list_clock_ when the heartbeat was sent.
  void Apply(const v1::HeartbeatResponse& r, uint64_t listed_at);
  /// Starts every operation of `ids` (a heartbeat's or WaitForTasks'
  /// assigned_operations, fetched when list_clock_ was `listed_at`) that
  /// is not running or finished here: a new one, or a prepared one whose
  /// transfer phase is assigned. Reaps finished operations first.
  /// Returns how many it started.
  int StartAssigned(const google::protobuf::RepeatedPtrField<std::string>& ids, uint64_t listed_at);
  /// The long poll (WaitForTasks), open from registration on.
  void PollLoop();
  /// AwaitPublishAccepted's one WaitForTasks call (until `deadline` at
  /// most): starts what it lists. Returns how many operations it started.
  int PickUpNow(std::chrono::steady_clock::time_point deadline);
  /// AcceptsPublish with mu_ held.
  int64_t AcceptsPublishLocked(const std::string& job_id, int64_t generation, int rank) const;
  /// Forgets the prepared operations of `job_id` (of its generation
  /// `generation` only, when not 0): discarded or deleted. Holds mu_.
  void ForgetPreparedLocked(const std::string& job_id, int64_t generation);
  /// Ids of the jobs this host holds buffers of.
  std::vector<std::string> HeldJobs() const;
  /// Frees generations the coordinator says are neither current nor pending
  /// (their successor committed, or released while this agent was away).
  void Release(const google::protobuf::RepeatedPtrField<v1::GenerationRef>& generations);
  /// Cancels the job's running tasks and drops every buffer it has here.
  void DropDeletedJobs(const google::protobuf::RepeatedPtrField<std::string>& job_ids);
  /// Runs one assigned operation here, phase by phase (operation_run.cc).
  void RunOperation(const std::string& operation_id, RunningOp* op);
  friend class OperationRun;
  /// Sends one report, retrying while the coordinator is unreachable. Sets
  /// *abort when the coordinator answers abort = true.
  absl::Status Report(const v1::ReportProgressRequest& req, bool retry, bool* abort);
  void ReapFinished();
  /// Tells options_.coordinator_reach how a call sent at `sent_at` ended
  /// (every call to the coordinator: heartbeats, registration, the task
  /// poll, GetTask, progress reports).
  void NoteReach(const absl::Status& s, std::chrono::steady_clock::time_point sent_at);
  v1::Host DescribeHost() const;
  bool Sleep(int ms);  // false when stopping

  const Options options_;
  std::unique_ptr<v1::AgentService::Stub> stub_;
  std::unique_ptr<v1::AgentService::Stub> heartbeat_stub_;
  ShardStore* store_;
  TaskExecutor* executor_;
  Transport* transport_;

  std::atomic<int64_t> epoch_{0};
  std::atomic<int64_t> lease_ms_{3000};
  std::atomic<bool> stopping_{false};
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::map<std::string, std::unique_ptr<RunningOp>> ops_;  // by operation id
  std::set<std::string> finished_;                         // operations already run
  std::map<std::string, PreparedOp> prepared_;             // by operation id
  uint64_t list_clock_ = 0;                                // + 1 at each PREPARED acknowledged
  std::set<std::string> last_assigned_;                    // the latest assigned_operations
  grpc::ClientContext* poll_ctx_ = nullptr;                // the WaitForTasks in flight
  bool repoll_ = false;  // poll_ctx_ was cancelled to send a fresh known_operations
  bool poll_unimplemented_ = false;                        // the coordinator has no WaitForTasks
  bool pickup_in_flight_ = false;                          // a PickUpNow call is out
  grpc::ClientContext* pickup_ctx_ = nullptr;              // its WaitForTasks, while out
  std::thread loop_;
  std::thread poll_;
  bool started_ = false;
};

}  // namespace reshard::agent
