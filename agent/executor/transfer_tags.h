// The transfer tags of an operation's agent-to-agent messages, all in one
// place (docs/agent.md, "Transfer tags"; docs/security.md, "Agent-to-agent
// transfers"). A tag (64 bits) is
//     operation key (24) | step index (24) | chunk (16)
// and both ends derive every tag from the task alone:
//  - the key: of the task's transfer context (TransferContext: the operation
//    id, or "<id> (prepare)" for the first phase of a two-phase operation),
//    HMAC'd with the operation's transfer secret (TransferTagKey) so that an
//    outsider cannot guess it, or folded from the id without a secret
//    (OperationTagKey); a prepare's key never equals its transfer's
//    (TaskTagKey), and no key is all ones (the transports' reserved tag);
//  - data chunks (step_chunks.h): (plan step index, chunk), chunk below
//    kMaxDataChunksPerStep;
//  - peer proofs (peer_proof.h): ProofTag, step kProofStepIndex (never a
//    plan step's), chunk 0;
//  - device communicator id (device_comm_bootstrap.h): DeviceCommTag,
//    step kProofStepIndex, chunk 1; device IPC handles and "done" messages
//    (device_ipc_steps.h): step kProofStepIndex, chunks from 2
//    (DeviceIpcChunk: 2 + 2 * the sending host's index, + 1 for "done");
//  - step seals (step_seal.h): SealTag, (plan step index, kSealChunk).
// A task's messages are cancelled together: CancelTags(TagBase(key),
// kTagKeyMask). Pure; thread-safe.
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "reshard/v1/agent.pb.h"

namespace reshard::agent {

inline constexpr int kTagKeyBits = 24;
inline constexpr int kTagStepBits = 24;
inline constexpr int kTagChunkBits = 16;
/// Steps and chunks per step a tag can name.
inline constexpr int64_t kMaxTaggedSteps = int64_t{1} << kTagStepBits;
inline constexpr int64_t kMaxChunksPerStep = int64_t{1} << kTagChunkBits;
/// The step index of the peer proofs, never a plan step's.
inline constexpr int64_t kProofStepIndex = kMaxTaggedSteps - 1;
/// The chunk of a step's seal, never a data chunk's: a step has at most
/// kMaxDataChunksPerStep data chunks.
inline constexpr int64_t kSealChunk = kMaxChunksPerStep - 1;
inline constexpr int64_t kMaxDataChunksPerStep = kMaxChunksPerStep - 1;
/// The mask selecting the operation key of a tag.
inline constexpr uint64_t kTagKeyMask = ((uint64_t{1} << kTagKeyBits) - 1)
                                        << (kTagStepBits + kTagChunkBits);

/// The operation key of every transfer tag of `operation_id` without a
/// transfer secret: FNV-1a (32-bit) of the id folded to kTagKeyBits.
uint32_t OperationTagKey(const std::string& operation_id);

/// The tag key of an operation (or context) with transfer secret `secret`;
/// without a secret (empty), OperationTagKey.
uint32_t TransferTagKey(const std::string& secret, const std::string& operation_id);

/// What the task's transfer tags, peer proofs, chunk keys and step seals
/// derive from, in place of the operation id: the id itself for a plain task
/// and the prepared phase (unchanged, so agents of one operation agree), and
/// "<id> (prepare)" for the prepare. Every MAC input is length-prefixed, so
/// the two phases' proofs and seals never match each other's.
std::string TransferContext(const v1::HostTask& task);

/// The transfer tag key of `task` (TransferTagKey of its context), never the
/// key of the same operation's other phase: a prepare whose key would equal
/// the transfer's takes the next one (still never the reserved all-ones key).
uint32_t TaskTagKey(const v1::HostTask& task);

/// The tag of chunk `chunk` of step `step_index` of the operation with key
/// `key`; InvalidArgument when the step index or the chunk does not fit.
[[nodiscard]] absl::StatusOr<uint64_t> TransferTag(uint32_t key, int64_t step_index, int64_t chunk);

/// The tag of the peer proofs of the operation with key `key`.
uint64_t ProofTag(uint32_t key);

/// The tag of the seal of step `step_index`; InvalidArgument as TransferTag.
[[nodiscard]] absl::StatusOr<uint64_t> SealTag(uint32_t key, int64_t step_index);

/// The lowest tag of key `key`: with kTagKeyMask, every tag of the key.
uint64_t TagBase(uint32_t key);

/// The step index and the chunk a tag names.
inline int64_t StepOfTag(uint64_t tag) {
  return static_cast<int64_t>((tag >> kTagChunkBits) & (kMaxTaggedSteps - 1));
}
inline int64_t ChunkOfTag(uint64_t tag) {
  return static_cast<int64_t>(tag & (kMaxChunksPerStep - 1));
}

}  // namespace reshard::agent
