// How a copy step is cut into chunks, and the transfer tag of each chunk.
// Sender and receiver derive the same chunks from the step alone (its shape,
// element size and the chunk size), so they agree without exchanging
// anything. See docs/agent.md, "Executing a HostTask". Pure; thread-safe.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace reshard::agent {

/// Tag layout (64 bits): operation key (24) | step index (24) | chunk (16).
inline constexpr int kTagKeyBits = 24;
inline constexpr int kTagStepBits = 24;
inline constexpr int kTagChunkBits = 16;
/// Steps and chunks per step a tag can name.
inline constexpr int64_t kMaxTaggedSteps = int64_t{1} << kTagStepBits;
inline constexpr int64_t kMaxChunksPerStep = int64_t{1} << kTagChunkBits;
/// The step index of the peer proofs (peer_proof.h), never a plan step's.
inline constexpr int64_t kProofStepIndex = kMaxTaggedSteps - 1;
/// The chunk of a step's seal (step_seal.h), never a data chunk's: a step
/// has at most kMaxDataChunksPerStep data chunks.
inline constexpr int64_t kSealChunk = kMaxChunksPerStep - 1;
inline constexpr int64_t kMaxDataChunksPerStep = kMaxChunksPerStep - 1;
/// The mask selecting the operation key of a tag.
inline constexpr uint64_t kTagKeyMask = ((uint64_t{1} << kTagKeyBits) - 1)
                                        << (kTagStepBits + kTagChunkBits);

/// The operation key of every transfer tag of `operation_id`: FNV-1a (32-bit)
/// of the id folded to kTagKeyBits. Source and destination compute it alike.
uint32_t OperationTagKey(const std::string& operation_id);

/// The tag of chunk `chunk` of step `step_index` of the operation with key
/// `key`; InvalidArgument when the step index or the chunk does not fit.
[[nodiscard]] absl::StatusOr<uint64_t> TransferTag(uint32_t key, int64_t step_index, int64_t chunk);

/// The chunks of a step of `shape` with elements of `element_bytes`: boxes of
/// about `chunk_bytes` each (one box when the step fits; at most
/// `chunk_bytes` plus one slab of the cut dimension), cut along
/// the outermost dimension whose one-index slab fits `chunk_bytes` (or the
/// innermost), the dimensions outside it taken one index at a time. Pieces of
/// the cut dimension are numpy array_split parts, so chunks are balanced and
/// need not align with rows. When that would make more than
/// kMaxDataChunksPerStep chunks the cut moves outward and chunks grow.
class StepChunks {
 public:
  StepChunks(const std::vector<int64_t>& shape, int element_bytes, int64_t chunk_bytes);

  /// 0 when the step has no element.
  int64_t count() const { return count_; }
  /// Chunk `c` (0 <= c < count()): its first multi-index in the step and its
  /// shape (same rank as the step's).
  void Get(int64_t c, std::vector<int64_t>* start, std::vector<int64_t>* shape) const;
  /// Bytes of chunk `c`.
  int64_t Bytes(int64_t c) const;

 private:
  std::vector<int64_t> shape_;
  int element_bytes_ = 0;
  int cut_ = 0;         // the cut dimension (0 when rank 0)
  int64_t outer_ = 1;   // prod(shape[0, cut))
  int64_t pieces_ = 1;  // parts of shape[cut]
  int64_t inner_ = 1;   // elements of prod(shape(cut, rank))
  int64_t count_ = 0;
};

/// `offset + sum_k start[k] * strides[k]`: where a chunk starts in a region.
int64_t ChunkOffset(int64_t offset, const std::vector<int64_t>& strides,
                    const std::vector<int64_t>& start);

}  // namespace reshard::agent
