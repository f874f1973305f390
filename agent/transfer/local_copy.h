// Strided N-d copies inside one host's memory: one source region to one or
// more destination regions, packing to and unpacking from contiguous staging
// buffers. Contiguous runs become memcpy; large copies are split along the
// outer dimension over a small thread pool. Thread-safe: several threads may
// call one LocalCopier at once (their copies share the pool).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

namespace reshard::agent {

/// A strided region in a buffer: element i (a multi-index) lives at
/// base + (offset + sum_k i_k * strides[k]) * element_bytes.
struct StridedView {
  const uint8_t* base = nullptr;
  int64_t offset = 0;            // elements
  std::vector<int64_t> strides;  // elements, one per dimension
};

/// A writable strided region.
struct MutableStridedView {
  uint8_t* base = nullptr;
  int64_t offset = 0;
  std::vector<int64_t> strides;
};

/// Row-major strides of a contiguous array of `shape`.
std::vector<int64_t> ContiguousStrides(const std::vector<int64_t>& shape);

/// Whether a region of `shape` with `strides` covers one contiguous run in
/// row-major order (dimensions of size 1 ignored).
bool IsContiguous(const std::vector<int64_t>& shape, const std::vector<int64_t>& strides);

class LocalCopier {
 public:
  /// `threads` <= 1: every copy runs on the calling thread.
  explicit LocalCopier(int threads);
  ~LocalCopier();
  LocalCopier(const LocalCopier&) = delete;
  LocalCopier& operator=(const LocalCopier&) = delete;

  int threads() const { return threads_; }

  /// For every multi-index i of `shape` and every d in `dsts`:
  /// dst_d[i] = src[i]. Element sizes of any width; regions must not overlap.
  void Copy(const StridedView& src, const std::vector<MutableStridedView>& dsts,
            const std::vector<int64_t>& shape, int element_bytes);

  /// Strided `src` -> contiguous `out` (prod(shape) * element_bytes bytes).
  void Pack(const StridedView& src, const std::vector<int64_t>& shape, int element_bytes,
            uint8_t* out);

  /// Contiguous `in` -> every strided destination.
  void Unpack(const uint8_t* in, const std::vector<MutableStridedView>& dsts,
              const std::vector<int64_t>& shape, int element_bytes);

  /// Copies below this many bytes per destination stay on the calling thread.
  static constexpr int64_t kParallelThresholdBytes = int64_t{4} << 20;
  /// Copies of at least this many bytes per destination write their
  /// contiguous runs (of 1 KiB or more) with streaming stores that bypass the
  /// cache: beyond the cache's size that saves a third of the memory traffic.
  static constexpr int64_t kNonTemporalThresholdBytes = int64_t{8} << 20;

 private:
  class Pool;
  int threads_;
  std::unique_ptr<Pool> pool_;
};

}  // namespace reshard::agent
