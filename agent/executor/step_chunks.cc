#include "agent/executor/step_chunks.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/log.h"

namespace reshard::agent {

StepChunks::StepChunks(const std::vector<int64_t>& shape, int element_bytes, int64_t chunk_bytes)
    : shape_(shape), element_bytes_(element_bytes) {
  RESHARD_CHECK(element_bytes > 0);
  const int n = static_cast<int>(shape.size());
  int64_t elements = 1;
  for (int64_t s : shape) elements *= std::max<int64_t>(s, 0);
  if (elements == 0) return;  // count_ 0
  count_ = 1;
  if (n == 0 || elements * element_bytes <= chunk_bytes || chunk_bytes <= 0) {
    inner_ = elements / (n == 0 ? 1 : shape[0]);
    return;
  }
  // slab[k]: bytes of one index along dimension k.
  std::vector<int64_t> slab(n);
  int64_t acc = element_bytes;
  for (int k = n; k-- > 0;) {
    slab[k] = acc;
    acc *= shape[k];
  }
  int first_fit = n - 1;
  for (int k = 0; k < n; ++k) {
    if (slab[k] <= chunk_bytes) {
      first_fit = k;
      break;
    }
  }
  for (int k = first_fit; k >= 0; --k) {
    int64_t outer = 1;
    bool fits = true;
    for (int j = 0; j < k && fits; ++j) {
      outer *= shape[j];
      fits = outer <= kMaxDataChunksPerStep;
    }
    if (!fits) continue;
    // Pieces of ~chunk_bytes; slab * shape <= the step's bytes, no overflow.
    int64_t pieces = (slab[k] * shape[k] + chunk_bytes - 1) / chunk_bytes;
    pieces = std::clamp<int64_t>(pieces, 1, shape[k]);
    pieces = std::min(pieces, kMaxDataChunksPerStep / outer);
    cut_ = k;
    outer_ = outer;
    pieces_ = pieces;
    inner_ = slab[k] / element_bytes;
    count_ = outer * pieces;
    return;
  }
  RESHARD_CHECK(false);  // k == 0 always fits
}

void StepChunks::Get(int64_t c, std::vector<int64_t>* start, std::vector<int64_t>* shape) const {
  RESHARD_CHECK(c >= 0 && c < count_);
  const int n = static_cast<int>(shape_.size());
  start->assign(n, 0);
  *shape = shape_;
  if (n == 0) return;
  int64_t o = c / pieces_;
  const int64_t p = c % pieces_;
  for (int j = cut_; j-- > 0;) {
    (*start)[j] = o % shape_[j];
    (*shape)[j] = 1;
    o /= shape_[j];
  }
  const int64_t len = shape_[cut_], q = len / pieces_, r = len % pieces_;
  (*start)[cut_] = p * q + std::min(p, r);
  (*shape)[cut_] = q + (p < r ? 1 : 0);
}

int64_t StepChunks::Bytes(int64_t c) const {
  RESHARD_CHECK(c >= 0 && c < count_);
  if (shape_.empty()) return element_bytes_;
  const int64_t p = c % pieces_;
  const int64_t len = shape_[cut_], q = len / pieces_, r = len % pieces_;
  return (q + (p < r ? 1 : 0)) * inner_ * element_bytes_;
}

int64_t ChunkOffset(int64_t offset, const std::vector<int64_t>& strides,
                    const std::vector<int64_t>& start) {
  for (size_t k = 0; k < start.size(); ++k) offset += start[k] * strides[k];
  return offset;
}

}  // namespace reshard::agent
