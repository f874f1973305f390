// End-to-end integrity of cross-host steps (issue 11 item 4; docs/security.md,
// "What the data plane trusts, and why"). With an operation's transfer
// secret, for every cross-host step:
//  - both ends compute, for every chunk, a Poly1305 tag of exactly the bytes
//    sent (the sender, over the source or staging buffer it hands to the
//    transport) or received (the receiver, over the buffer the transport
//    wrote), under a one-time key derived from the secret, the operation, the
//    step and the chunk; the step's digest is the SHA-256 of its chunk tags in
//    chunk order;
//  - once the sender has sent every chunk and checked every source item
//    against its sealed checksum, it sends the receiver the step's *seal*:
//    (step, bytes, digest) and HMAC-SHA256(secret, operation, sender,
//    receiver, step, bytes, digest), as message SealTag (transfer_tags.h);
//  - the receiver refuses (DATA_LOSS naming the job, item, step and source
//    host) before it reports DONE when a seal's MAC is wrong or its bytes or
//    digest differ from what it received.
// Nothing else crosses the network: the tags are computed at both ends.
// Thread contract: a StepSeals is used by one thread (the executor's);
// transport callbacks touch only state it shares with them.
#pragma once

#include <array>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "agent/executor/executor.h"
#include "agent/executor/host_steps.h"
#include "agent/executor/peer_wait.h"
#include "agent/transfer/transport.h"
#include "reshard/v1/agent.pb.h"

namespace reshard::agent {

using ChunkTag = std::array<uint8_t, 16>;

/// The one-time Poly1305 key (32 bytes) of chunk `chunk` of step `step`.
std::string ChunkKey(const std::string& secret, const std::string& operation_id, int64_t step,
                     int64_t chunk);
/// Poly1305 under `key` (32 bytes) of `bytes` bytes at `data`.
ChunkTag ChunkTagOf(const std::string& key, const void* data, size_t bytes);
/// The same tag, with `also(offset, block, n)` run on each block of
/// kFusedBlockBytes (item_hash.h) right after the MAC took it.
ChunkTag ChunkTagOf(const std::string& key, const void* data, size_t bytes,
                    const std::function<void(size_t offset, const uint8_t* block, size_t n)>& also);
/// SHA-256 (32 bytes) of `tags` in order.
std::string StepDigest(const std::vector<ChunkTag>& tags);

/// A seal message: step (8) | bytes (8) | digest (32) | MAC (32).
inline constexpr size_t kStepSealBytes = 80;
std::string MakeStepSeal(const std::string& secret, const std::string& operation_id,
                         const std::string& sender, const std::string& receiver, int64_t step,
                         int64_t bytes, const std::string& digest);

/// What a seal that checks says.
struct SealContents {
  int64_t bytes = 0;
  std::string digest;
};
/// Checks `message`, received by `receiver` as the seal of step `step` from
/// `sender`: DATA_LOSS when it is malformed, names another step, or its MAC
/// is not this operation's for that pair and step (forged or altered).
[[nodiscard]] absl::StatusOr<SealContents> CheckStepSeal(const std::string& secret,
                                                         const std::string& operation_id,
                                                         const std::string& sender,
                                                         const std::string& receiver, int64_t step,
                                                         const std::string& message);

/// The seals of one task's cross-host steps.
class StepSeals {
 public:
  struct Step {
    int64_t index = 0;  // the plan step's index
    bool is_send = false;
    std::string peer;    // the other end's host
    int64_t chunks = 0;  // data chunks (StepChunks::count)
    std::string what;    // the step's item, for messages: `item 3 ("w")`
  };
  /// `tag_key`: the task's transfer tag key (TaskTagKey, transfer_tags.h).
  StepSeals(Transport* transport, std::string secret, std::string operation_id, std::string job_id,
            std::string host_id, uint32_t tag_key, std::vector<Step> steps);
  ~StepSeals();

  /// Posts the receive of the seal of every received step. Before any data
  /// of theirs can arrive is fine; once is required before Finish.
  void PostReceives();
  /// Records the tag of chunk `chunk` of steps[s] over the `bytes` bytes at
  /// `data`: the bytes sent (once handed to the transport) or received.
  void AddChunk(size_t s, int64_t chunk, const void* data, size_t bytes);
  /// AddChunk in one pass with the caller's own: `also(offset, block, n)`
  /// runs on every block of kFusedBlockBytes (item_hash.h) right after the
  /// tag took it, while it is in cache.
  void AddChunk(size_t s, int64_t chunk, const void* data, size_t bytes,
                const std::function<void(size_t offset, const uint8_t* block, size_t n)>& also);
  /// Sends the seal of every sent step. Call once every chunk of them was
  /// added and sent, and their sources checked against their sealed checksums.
  void SendSeals();
  /// Waits until every seal was sent and received (or `cancelled()`, polled:
  /// CANCELLED; or `timeout`, not counting time the coordinator did not
  /// answer (peer_wait.h): DEADLINE_EXCEEDED naming the step and host whose
  /// seal is missing and the wait), then checks every received step: DATA_LOSS naming the job,
  /// item, step and source host when its seal does not check or the bytes
  /// received differ from the bytes sent. Every chunk must have been added.
  [[nodiscard]] absl::Status Finish(const std::function<bool()>& cancelled, PeerWaitBudget timeout);

 private:
  struct Shared;
  Transport* transport_;
  std::string secret_, operation_id_, job_id_, host_id_;
  uint32_t tag_key_;
  std::vector<Step> steps_;
  std::vector<std::vector<ChunkTag>> tags_;  // per step, per chunk
  std::vector<std::vector<bool>> added_;
  std::vector<int64_t> bytes_;  // per step: bytes added
  std::shared_ptr<Shared> shared_;
  bool received_posted_ = false;
  bool sent_ = false;
};

/// The seals of a run's cross-host steps `remotes` (remotes[i] cut into
/// `chunk_counts[i]` data chunks) over `transport`, from the task's transfer
/// secret, context and tag key, with their receives posted; nullptr without
/// a transfer secret. The one seal plan of TaskRun and the device
/// communicator route.
std::unique_ptr<StepSeals> PlanStepSeals(Transport* transport, const v1::HostTask& task,
                                         const std::string& host_id,
                                         const std::vector<RemoteStep>& remotes,
                                         const std::vector<int64_t>& chunk_counts);

/// The end of a run's step seals, the one seal-finishing path of TaskRun
/// (Verify) and the device communicator route: `waiting("step seals")`,
/// SendSeals, then Finish within options.seal_timeout_ms (not counting
/// time options.coordinator_reach saw no answer).
[[nodiscard]] absl::Status FinishStepSeals(
    StepSeals& seals, const TaskExecutor::Options& options, const std::function<bool()>& cancelled,
    const std::function<void(const std::string& what)>& waiting);

}  // namespace reshard::agent
