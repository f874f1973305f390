// The seam under TaskRun through which a run's cross-host chunks move, in the
// shape of NIXL's backend engine: a mover states what it moves
// (capabilities), prepares a run (Prepare: the task's peer hosts become
// reachable), posts transfers that complete asynchronously (Post), reports
// their completions (Poll) and cancels a run's transfers (Cancel). TaskRun
// conducts SetUp / Prove / Move / Verify / Seal for every route and asks
// MoverFor which mover moves a step's memory kinds; it never calls a
// transport to move a chunk itself. UcxHostMover moves host memory over a
// Transport (UCX); the device routes' movers (DeviceCommMover: a device communicator, NCCL;
// DeviceIpcMover: device IPC handles between agents of one machine;
// device_cross_host.h) move device memory, one transfer per run holding
// every cross-host step (MoverTransfer::steps).
// Thread contract: Post, Poll and Cancel from the run's thread; completions
// arrive from the transport's threads and are handed over under a lock (a
// device mover progresses its transfer inside Poll, on the run's thread).
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "agent/device/memory_kind.h"
#include "agent/executor/executor.h"
#include "agent/executor/host_steps.h"
#include "agent/executor/run_resources.h"
#include "agent/shard_store/device_buffer.h"
#include "agent/transfer/transport.h"
#include "reshard/v1/agent.pb.h"

namespace reshard::agent {

/// Connects every peer host of `task` (but `host_id`) over `transport`. An
/// endpoint can fail to come up for a moment (e.g. while one to the same peer
/// from an aborted attempt is being torn down): a few tries within about a
/// second, then the error naming the host.
[[nodiscard]] absl::Status ConnectTaskPeers(Transport* transport, const std::string& host_id,
                                            const v1::HostTask& task,
                                            const std::function<bool()>& cancelled);

/// What a mover moves (NIXL: getSupportedMems, supportsRemote, supportsNotif).
struct MoverCapabilities {
  std::string name;                      // "ucx", "nccl", "fake-nccl", "device-ipc"
  std::vector<MemoryKind> memory_kinds;  // at both ends
  bool remote = false;                   // between hosts
  bool notifications = false;            // a receive completes when its bytes are in
};

/// One transfer: a send of `bytes` at `data` to host `peer`, or a receive of
/// exactly `bytes` into `data` (from any peer), as message `tag`. `hold`
/// keeps what the transfer touches alive until its completion is reported
/// (a late completion after a cancel stays safe).
struct MoverTransfer {
  bool is_send = false;
  std::string peer;  // sends only
  uint64_t tag = 0;
  void* data = nullptr;
  size_t bytes = 0;
  std::shared_ptr<void> hold;
  // A device mover's one transfer of a run: every cross-host step of
  // `steps` between this host's buffers, the new ones `made` (in
  // steps->new_ranks order); `landed(bytes)` counts the bytes written here,
  // called on the run's thread. `tag` is the run's tag base; the fields
  // above it stay unset.
  const HostSteps* steps = nullptr;
  const std::vector<DeviceRankBufferPtr>* made = nullptr;
  std::function<void(int64_t bytes)> landed;
};

/// A completion: the id a transfer was posted under and how it ended.
using MoverCompletion = std::pair<uint64_t, absl::Status>;

class Mover {
 public:
  virtual ~Mover() = default;
  virtual MoverCapabilities capabilities() const = 0;
  /// Before any transfer of the run: makes every peer host of `task` (but
  /// `host_id`) reachable; the error names the host.
  [[nodiscard]] virtual absl::Status Prepare(const std::string& host_id, const v1::HostTask& task,
                                             const std::function<bool()>& cancelled) = 0;
  /// Posts `t` as transfer `id`; Poll reports its completion exactly once.
  virtual void Post(uint64_t id, MoverTransfer t) = 0;
  /// Moves the completions reported since the last call to `out`, first
  /// waiting up to `wait` when there is none.
  virtual void Poll(std::chrono::steady_clock::duration wait, std::deque<MoverCompletion>* out) = 0;
  /// Fails with Cancelled every posted transfer whose tag agrees with `tag`
  /// on the bits of `mask` (a run's transfers); Poll still reports them.
  virtual void Cancel(uint64_t tag, uint64_t mask) = 0;
};

/// Host memory between hosts over `transport` (UCX tag send / receive).
class UcxHostMover : public Mover {
 public:
  explicit UcxHostMover(Transport* transport) : transport_(transport) {}
  MoverCapabilities capabilities() const override;
  [[nodiscard]] absl::Status Prepare(const std::string& host_id, const v1::HostTask& task,
                                     const std::function<bool()>& cancelled) override;
  void Post(uint64_t id, MoverTransfer t) override;
  void Poll(std::chrono::steady_clock::duration wait, std::deque<MoverCompletion>* out) override;
  void Cancel(uint64_t tag, uint64_t mask) override;

 private:
  Transport* const transport_;
  // Shared with the transport's callbacks, so that a late one is safe.
  std::shared_ptr<Completions> completions_ = std::make_shared<Completions>();
};

/// The mover that moves a cross-host step from `src` memory to `dst` memory
/// among `movers`: the first whose capabilities are remote and list both
/// kinds; nullptr when none does.
Mover* MoverFor(const std::vector<Mover*>& movers, MemoryKind src, MemoryKind dst);

/// The Prove phase of every route (TaskRun::Prove, host and device routes
/// alike): `mover` (null for a run without a transport, which has no
/// cross-host step) reaches the task's peers (Prepare); then,
/// with a transfer secret and cross-host steps `remotes`, every sender proves
/// itself to every receiver over `transport` before any receive of its data
/// is posted (peer_proof.h), `waiting("transfer proofs (...)")` told first.
/// The error names the host (Prepare) or is the proofs' (peer_proof.h).
[[nodiscard]] absl::Status PreparePeersAndProve(
    Mover* mover, Transport* transport, const TaskExecutor::Options& options,
    const std::string& host_id, const v1::HostTask& task, const std::vector<RemoteStep>& remotes,
    const std::function<bool()>& cancelled,
    const std::function<void(const std::string& what)>& waiting);

}  // namespace reshard::agent
