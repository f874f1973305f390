// The phases of a two-phase (stop-free) operation as the executor sees them
// (docs/coordinator.md, "Agents prepare"; docs/agent.md, "Two phases"):
//  - kPrepare (HostTask.prepare): the plan slice runs as usual into new
//    buffers of to_generation, which stay unsealed in the shard store; the
//    result is the sealed checksum of every old shard this host read;
//  - kPrepared (HostTask.prepared): the buffers the prepare left are opened
//    (not made), only the slice's steps are applied (no zero fills: the
//    prepare did them), every region the prepare wrote and the slice does
//    not write again is read back against the prepare's record
//    (precopy_check.h: DATA_LOSS when it changed), then every new shard is
//    sealed from its bytes;
//  - kTransfer: a plain task.
// The prepare derives its transfer tags, peer proofs and step seals from a
// context of its own (TransferContext, TaskTagKey: transfer_tags.h), so
// nothing it sends can be taken for the transfer's.
// Pure apart from the shard store reads of OpenPreparedBuffers; thread-safe.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "agent/executor/host_steps.h"
#include "agent/shard_store/shard_store.h"
#include "reshard/v1/agent.pb.h"

namespace reshard::agent {

enum class TaskPhase { kTransfer, kPrepare, kPrepared };

/// The phase of `task`; InvalidArgument when it sets both `prepare` and
/// `prepared`, or either with `publish_by_workers`.
[[nodiscard]] absl::StatusOr<TaskPhase> PhaseOf(const v1::HostTask& task);

/// The prepared phase: opens the unsealed buffers of `task.to_generation()`
/// for this host's new ranks (`hs.new_ranks`). FailedPrecondition naming
/// job, generation and rank when one is missing, sealed, or laid out for
/// other item sizes than `hs.new_item_bytes`. Changes nothing.
[[nodiscard]] absl::StatusOr<std::vector<RankBufferPtr>> OpenPreparedBuffers(
    ShardStore* store, const v1::HostTask& task, const HostSteps& hs);

/// The prepared phase applies no zero fills (the prepare did them): clears
/// `hs->fills` and takes their bytes out of `hs->total_bytes`.
void LeaveFillsToThePrepare(const v1::TransferPlan& plan, HostSteps* hs);

/// The prepare's result: the sealed checksum and bytes of every old shard
/// (item, rank of from_generation) that a step of `hs` reads on this host
/// (local copies and sends), one per shard, ordered by (rank, item).
std::vector<v1::ShardChecksum> SourceChecksums(const HostSteps& hs);

}  // namespace reshard::agent
