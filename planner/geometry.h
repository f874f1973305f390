// N-d boxes and strided views: the geometry the planner works in.
// Plain value types, no allocation; thread-compatible.
#pragma once

#include <cstdint>

namespace reshard::planner {

/// Tensors have at most this many dimensions (validation enforces it).
inline constexpr int kMaxDims = 6;

/// A box of a tensor: offset[d] .. offset[d] + size[d] on each dimension.
struct Box {
  int ndim = 0;
  int64_t offset[kMaxDims] = {};
  int64_t size[kMaxDims] = {};

  int64_t Elements() const {
    int64_t n = 1;
    for (int d = 0; d < ndim; ++d) n *= size[d];
    return n;
  }
  bool Empty() const {
    for (int d = 0; d < ndim; ++d) {
      if (size[d] <= 0) return true;
    }
    return false;
  }
  bool operator==(const Box& o) const {
    if (ndim != o.ndim) return false;
    for (int d = 0; d < ndim; ++d) {
      if (offset[d] != o.offset[d] || size[d] != o.size[d]) return false;
    }
    return true;
  }
};

/// Intersection of two boxes of the same rank; false when it is empty.
inline bool Intersect(const Box& a, const Box& b, Box* out) {
  out->ndim = a.ndim;
  for (int d = 0; d < a.ndim; ++d) {
    const int64_t lo = a.offset[d] > b.offset[d] ? a.offset[d] : b.offset[d];
    const int64_t ae = a.offset[d] + a.size[d];
    const int64_t be = b.offset[d] + b.size[d];
    const int64_t hi = ae < be ? ae : be;
    if (hi <= lo) return false;
    out->offset[d] = lo;
    out->size[d] = hi - lo;
  }
  return true;
}

/// Where a box lives in a rank's flat local buffer: element
/// (i_0, .., i_{n-1}) of the box is at offset + sum_d i_d * strides[d].
struct View {
  int64_t offset = 0;
  int64_t strides[kMaxDims] = {};
};

/// The view of sub-box `sub` of a box `box` whose view is `v`.
inline View SubView(const Box& box, const View& v, const Box& sub) {
  View out = v;
  for (int d = 0; d < box.ndim; ++d) out.offset += (sub.offset[d] - box.offset[d]) * v.strides[d];
  return out;
}

/// Row-major strides of a dense tensor of `shape`.
inline void RowMajorStrides(int ndim, const int64_t* shape, int64_t* strides) {
  int64_t s = 1;
  for (int d = ndim - 1; d >= 0; --d) {
    strides[d] = s;
    s *= shape[d];
  }
}

/// array_split(n, k)[i]: the first n % k parts are one larger.
struct Part {
  int64_t start = 0;
  int64_t size = 0;
};
inline Part SplitPart(int64_t n, int64_t k, int64_t i) {
  const int64_t base = n / k, rem = n % k;
  return Part{i * base + (i < rem ? i : rem), base + (i < rem ? 1 : 0)};
}

}  // namespace reshard::planner
