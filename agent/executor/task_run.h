// One run of TaskExecutor::Execute (executor.h) as named phases over the
// state they share (docs/agent.md, "Executing a HostTask"); the one
// conductor of every route, host memory and device memory alike
// (device_route.h):
//  - SetUp: check the task, sort out this host's part (host_steps.h; on a
//    device route its sources found in host or device memory,
//    device_buffers.h), lease the sealed host sources, make (or, for a
//    prepared phase, open) the new buffers (on a device route: on their
//    devices, all or none), pick the mover of the cross-host steps by their
//    memory kinds (MoverFor, mover.h), derive the transfer tag key and
//    context (transfer_tags.h);
//  - Prove: the mover reaches the task's peer hosts (the run owns its
//    connections; mover.h) and the run exchanges the transfer proofs
//    (peer_proof.h) before any receive of a peer's data is posted;
//  - Move: zero fills, local copies and cross-host chunks (step_chunks.h,
//    transfer_lanes.h; posted to and polled from the mover), every item
//    hashed as its bytes pass where they are contiguous (item_hash.h) and
//    checked once its last access is over (item_checks.h). On a device route the local copies run
//    through the device API (CopyLocalsOnDevices), no item is read on the host, and the cross-host
//    steps go to the route's mover as one transfer;
//  - Verify: the sources still as sealed, the step seals (step_seal.h), the
//    pre-copy of a prepared phase (precopy_check.h);
//  - Seal: seal every new shard from the bytes written (on a device route
//    through the device store, then staged to host memory where the
//    placement keeps the new buffers), or, for a prepare,
//    record what it wrote and report what it read (task_phase.h).
// A phase that fails drops the new buffers it may have made (Fail) and
// returns why; the next phase never runs. Move and its parts are in
// task_run_move.cc, the rest in task_run.cc. One object per Execute; not
// thread-safe (completions reach the run through the mover's Poll).
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "agent/executor/device_route.h"
#include "agent/executor/executor.h"
#include "agent/executor/host_steps.h"
#include "agent/executor/item_checks.h"
#include "agent/executor/item_hash.h"
#include "agent/executor/mover.h"
#include "agent/executor/precopy_check.h"
#include "agent/executor/run_resources.h"
#include "agent/executor/step_chunks.h"
#include "agent/executor/step_seal.h"
#include "agent/executor/task_phase.h"
#include "agent/executor/transfer_lanes.h"
#include "agent/executor/transfer_tags.h"
#include "agent/shard_store/shard_store.h"
#include "agent/transfer/local_copy.h"
#include "agent/transfer/transport.h"
#include "reshard/v1/agent.pb.h"

namespace reshard::agent {

class TaskRun {
 public:
  /// What the executor lends every run; all outlive the run.
  struct Executor {
    ShardStore* store = nullptr;
    Transport* transport = nullptr;  // null when every step is local
    const TaskExecutor::Options* options = nullptr;
    LocalCopier* copier = nullptr;
    PrecopyRecords* precopies = nullptr;
    /// A device route (kDevice, kDeviceComm, kDeviceIpc; device_route.h):
    /// the agent's device store and the task's route. Both null: the host
    /// route (host memory only, or a host-staged run's host part).
    DeviceBufferStore* devices = nullptr;
    const DeviceRoute* route = nullptr;
    /// Movers besides the run's own UcxHostMover over `transport` (a device
    /// route's: DeviceCommMover, DeviceIpcMover); MoverFor picks among them.
    std::vector<Mover*> movers = {};
    /// Where Run writes each phase's seconds (null: nowhere).
    v1::TaskTimings* timings = nullptr;
  };

  /// The arguments of TaskExecutor::Execute; `task` and the callbacks
  /// outlive the run.
  TaskRun(Executor executor, const std::string& host_id, const v1::HostTask& task,
          const std::function<void(int64_t done, int64_t total)>& progress,
          const std::function<bool()>& cancelled,
          const std::function<void(const std::string& what)>& waiting);
  ~TaskRun();
  TaskRun(const TaskRun&) = delete;
  TaskRun& operator=(const TaskRun&) = delete;

  /// The phases in order; what TaskExecutor::Execute returns. Call once.
  [[nodiscard]] absl::StatusOr<std::vector<v1::ShardChecksum>> Run();

 private:
  // The phases (see the file comment).
  [[nodiscard]] absl::Status SetUp();
  [[nodiscard]] absl::Status Prove();
  [[nodiscard]] absl::Status Move();
  [[nodiscard]] absl::Status Verify();
  [[nodiscard]] absl::StatusOr<std::vector<v1::ShardChecksum>> Seal();

  // SetUp's parts.
  [[nodiscard]] absl::Status PickMover();
  [[nodiscard]] absl::Status MakeNewBuffers();

  // Move's parts.
  [[nodiscard]] absl::Status MoveOnDevices();
  void PlanChunks();
  void StartItemChecks();
  void CheckItem(const ItemChecks::Key& key);
  // The hash cursor of an item (item_hash.h); null for one nobody feeds.
  ItemHashCursor* CursorOf(int kind, int rank, int item);
  // The step seals' tag of one chunk (with a transfer secret) and the
  // checksums of the items that hold its bytes contiguously, `feeds`:
  // (cursor, byte offset in its item), in one pass.
  void FoldChunk(size_t remote, int64_t chunk, const uint8_t* data, size_t bytes,
                 const std::vector<std::pair<ItemHashCursor*, size_t>>& feeds);
  void ApplyZeroFills();
  void Issue(const TransferLanes::Chunk& c);
  [[nodiscard]] absl::Status HandleCompletions();
  void CopyNextLocalPiece();
  void CopyAndHash(const v1::CopyStep& step, const StridedView& src,
                   const std::vector<MutableStridedView>& dsts, const std::vector<int64_t>& shape);
  bool LocalsLeft() const { return next_local_ < hs_.locals.size(); }
  void Report(bool force);

  // Views of a step restricted to a chunk at `start`.
  std::vector<MutableStridedView> DstViews(const v1::CopyStep& step,
                                           const std::vector<int64_t>& start);
  StridedView SrcView(const v1::CopyStep& step, const std::vector<int64_t>& start);
  int ElementBytes(int item) const;
  RankBuffer* NewBuf(int rank);

  /// Cancels what is in flight, drops the new buffers, logs; returns `s`.
  absl::Status Fail(absl::Status s);

  // The executor's and the caller's.
  Executor ex_;
  const std::string& host_id_;
  const v1::HostTask& task_;
  const std::function<void(int64_t, int64_t)>& progress_;
  const std::function<bool()>& cancelled_;
  const std::function<void(const std::string&)>& waiting_;

  // A device route: the new buffers live in device memory
  // (new_device_bufs_), the sources in either memory.
  const bool on_devices_;

  // SetUp.
  TaskPhase phase_ = TaskPhase::kTransfer;
  HostSteps hs_;
  std::vector<SourceLease> leases_;
  std::shared_ptr<void> refill_pause_;
  std::vector<RankBufferKey> new_keys_;
  std::vector<RankBufferPtr> new_bufs_;               // the host route's
  std::vector<DeviceRankBufferPtr> new_device_bufs_;  // a device route's
  PrecopyRecords::RecordPtr precopy_;                 // the prepared phase's record of its prepare
  std::optional<Prefaulter> prefaulter_;
  uint32_t tag_key_ = 0;
  uint64_t tag_base_ = 0;

  // The mover of the cross-host steps: host memory over the transport, or a
  // device route's; null when none moves their memory kinds.
  std::unique_ptr<Mover> ucx_mover_;
  Mover* mover_ = nullptr;

  // Move.
  std::unordered_map<uint64_t, InFlight> inflight_;  // by sequence number
  std::unique_ptr<StepSeals> seals_;                 // with a transfer secret
  int64_t done_ = 0;
  std::chrono::steady_clock::time_point last_report_;
  std::string waiting_on_;
  bool transfer_started_ = false;  // Report describes what it waits on
  std::vector<StepChunks> remote_chunks_;
  std::optional<TransferLanes> lanes_;
  std::vector<std::vector<uint64_t>> new_sums_;               // per new rank, per item
  std::unordered_map<int, std::vector<uint64_t>> sealed_of_;  // old rank -> sealed checksums
  std::mutex source_mu_;
  std::map<std::pair<int, int>, absl::Status> source_errors_;  // (old rank, item) -> DataLoss
  // Every item's hash as its bytes pass (item_hash.h); before checks_,
  // whose thread finishes them, so that they outlive it.
  std::map<ItemChecks::Key, std::unique_ptr<ItemHashCursor>> cursors_;
  std::optional<ItemChecks> checks_;
  std::optional<StagingPool> pool_;
  uint64_t next_seq_ = 0;
  int64_t finished_ = 0;   // remote chunks completed
  size_t next_local_ = 0;  // the next local piece: (next_local_, next_local_chunk_)
  int64_t next_local_chunk_ = 0;
  std::unique_ptr<StepChunks> local_chunks_;
};

}  // namespace reshard::agent
