// How a copy step is cut into chunks (their transfer tags: transfer_tags.h).
// Sender and receiver derive the same chunks from the step alone (its shape,
// element size and the chunk size), so they agree without exchanging
// anything. See docs/agent.md, "Executing a HostTask". Pure; thread-safe.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "agent/executor/transfer_tags.h"
#include "google/protobuf/repeated_field.h"

namespace reshard::agent {

/// A step's shape or a region's strides (repeated int64 in the plan) as the
/// vector StepChunks, the copiers and the device routes take.
inline std::vector<int64_t> ToVector(const google::protobuf::RepeatedField<int64_t>& f) {
  return std::vector<int64_t>(f.begin(), f.end());
}

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
