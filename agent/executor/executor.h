// Executes one host's slice of a plan (v1::HostTask): creates the new
// generation's rank buffers of this host's new ranks, applies zero fills,
// local copies, sends and receives, then checksums every new shard from the
// bytes written. See docs/agent.md, "Executing a HostTask".
// Thread-safe: several tasks may run at once.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "agent/executor/step_chunks.h"
#include "agent/shard_store/shard_store.h"
#include "agent/transfer/transport.h"
#include "reshard/v1/agent.pb.h"

namespace reshard::agent {

class CoordinatorReach;
class DeviceBufferStore;
class DeviceCommFactory;
class LocalCopier;
class PrecopyRecords;

class TaskExecutor {
 public:
  struct Options {
    int copy_threads = 4;
    /// Sends + receives handed to the transport and not yet completed.
    int64_t max_inflight_bytes = int64_t{256} << 20;
    /// The same for one peer and direction (see TransferLanes): chunks to and
    /// from different peers interleave, each peer with its own window.
    int64_t peer_window_bytes = int64_t{64} << 20;
    /// Cross-host steps travel in chunks of about this many bytes (see
    /// StepChunks). Every agent of an operation must use the same value: the
    /// receiver derives the chunks alike, and a mismatch fails the first
    /// cross-host step (a message of the wrong length).
    int64_t chunk_bytes = int64_t{8} << 20;
    /// Local steps are copied in pieces of about this many bytes, so that
    /// completions (unpacks, new transfers) are handled between them.
    int64_t local_chunk_bytes = int64_t{64} << 20;
    /// How long a receiver waits for the transfer proofs of its senders
    /// (peer_proof.h) before it fails the task (DEADLINE_EXCEEDED naming
    /// them), not counting time `coordinator_reach` saw no answer.
    int64_t proof_timeout_ms = 60000;
    /// How long a receiver waits, once every chunk has landed, for the seals
    /// of its steps (step_seal.h) before it fails the task
    /// (DEADLINE_EXCEEDED naming the step and source host), likewise.
    int64_t seal_timeout_ms = 60000;
    /// The agent's view of its coordinator's answers (peer_wait.h); it
    /// outlives the executor. Null: the timers count all time.
    const CoordinatorReach* coordinator_reach = nullptr;
    /// Why the agent has no device communicator (MakeDeviceCommFactory's
    /// why_not), for the reason a cross-host task is host-staged.
    std::string device_comm_why_not;
    /// Whether this agent advertises its device IPC entry (--device-ipc):
    /// the device IPC route (device_ipc_steps.h) needs it on every host.
    bool device_ipc = true;
  };

  /// How Execute runs a task (device_route.h's routes), for the operation's
  /// report: `route` is RouteName's ("host", "device-direct", "device-comm
  /// nccl", "host-staged", ...), `route_reason` why a fallback was taken
  /// (host-staged: DeviceRoute::why), empty otherwise.
  struct ExecuteInfo {
    std::string route;
    std::string route_reason;
  };

  /// `transport` may be null when every step of every task is local. The
  /// byte sizes in `options` must be positive (checked: bad configuration).
  /// With `devices` (the agent's device memory; it outlives the executor)
  /// tasks that involve device memory take the device path (device_route.h:
  /// which buffers live on a device, device-direct or host-staged runs).
  /// With `comm` too (the agent's device communicator factory, advertised as
  /// AdvertisedCommName in its Host.transports; it outlives the executor),
  /// cross-host tasks whose hosts all advertise it move device memory over
  /// it (device_comm_steps.h).
  TaskExecutor(ShardStore* store, Transport* transport, Options options,
               DeviceBufferStore* devices = nullptr, DeviceCommFactory* comm = nullptr);
  ~TaskExecutor();

  /// Runs `task` on host `host_id`. `progress(done, total)` (bytes written on
  /// this host) is called at least every 200 ms; `cancelled()` is polled and
  /// stops the task (Cancelled). On any failure the new buffers are dropped,
  /// the old generation is untouched, and the status says why (NotFound for a
  /// missing old shard, ResourceExhausted before any byte moved when the new
  /// buffers do not fit, Unavailable for an unreachable peer, DataLoss for a
  /// source that no longer matches its sealed checksum or, with a transfer
  /// secret, bytes received that differ from the bytes sent...). On success
  /// returns one checksum per (item, new rank on this host) with its bytes.
  /// Two-phase operations (task_phase.h): a task with `prepare` leaves its
  /// new buffers unsealed in the store and returns instead the sealed
  /// checksum of every old shard (item, rank of from_generation) it read,
  /// with its bytes; a task with `prepared` opens those buffers
  /// (FailedPrecondition naming job, generation and rank when one is
  /// missing, sealed or of other sizes; nothing is changed then), applies
  /// only its steps (no zero fills) and seals them like a plain task, once
  /// every region its prepare wrote and it did not write again reads back as
  /// the prepare wrote it (precopy_check.h): DataLoss naming job, generation,
  /// rank, item and step otherwise (FailedPrecondition when this executor
  /// holds no record of the prepare), and the buffers are dropped.
  /// `waiting(what)`, if set, is called with each progress report when what
  /// the task waits on changes: the earliest unfinished cross-host step
  /// ("step 17 (receive from host \"h1\")"), "local copies", or "" (checksums).
  /// With a device store, new buffers may land in device memory and sources
  /// may be device buffers (device_route.h); a task that cannot run on the
  /// devices directly calls `waiting("host-staged: <why>")` once first.
  /// `routed(info)`, if set, is called once, before any byte moves, with the
  /// route the task takes (on this thread). `timings`, if set, gets the
  /// seconds of each phase of the run (docs/agent.md, "Executing a
  /// HostTask"; a host-staged run's are its host part's).
  [[nodiscard]] absl::StatusOr<std::vector<v1::ShardChecksum>> Execute(
      const std::string& host_id, const v1::HostTask& task,
      const std::function<void(int64_t done, int64_t total)>& progress,
      const std::function<bool()>& cancelled,
      const std::function<void(const std::string& what)>& waiting = nullptr,
      const std::function<void(const ExecuteInfo& info)>& routed = nullptr,
      v1::TaskTimings* timings = nullptr);

 private:
  ShardStore* store_;
  Transport* transport_;
  DeviceBufferStore* devices_;  // null: host memory only
  DeviceCommFactory* comm_;     // null: cross-host steps move host memory
  Options options_;
  std::unique_ptr<LocalCopier> copier_;
  /// What each prepare wrote, until its transfer phase checked it.
  std::unique_ptr<PrecopyRecords> precopies_;
};

}  // namespace reshard::agent
