// What a CoordShard puts at each local position, for the planner's shard tests.
#pragma once

#include <cstdint>
#include <vector>

#include "gtest/gtest.h"
#include "planner/geometry.h"
#include "planner/shard.h"
#include "reshard/v1/ptc.pb.h"

namespace reshard::planner::testing {

// The global (logical) flat index held at each local position, -1 for
// padding; fails on a position written twice or covered by nothing.
inline std::vector<int64_t> LocalContent(const v1::TensorSpec& t, const CoordShard& s) {
  std::vector<int64_t> out(s.local_elements, -2);
  std::vector<int64_t> gstrides(t.shape_size());
  RowMajorStrides(t.shape_size(), t.shape().data(), gstrides.data());
  for (const Piece& p : s.pieces) {
    const int nd = p.global.ndim;
    std::vector<int64_t> idx(nd, 0);
    for (int64_t n = 0; n < p.global.Elements(); ++n) {
      int64_t g = 0, l = p.local.offset;
      for (int d = 0; d < nd; ++d) {
        EXPECT_LT(p.global.offset[d] + idx[d], t.shape(d)) << "a piece covers padding";
        g += (p.global.offset[d] + idx[d]) * gstrides[d];
        l += idx[d] * p.local.strides[d];
      }
      EXPECT_EQ(out.at(l), -2) << "local position " << l << " written twice";
      out.at(l) = g;
      for (int d = nd - 1; d >= 0; --d) {
        if (++idx[d] < p.global.size[d]) break;
        idx[d] = 0;
      }
    }
  }
  for (const auto& [offset, count] : s.padding) {
    for (int64_t i = offset; i < offset + count; ++i) {
      EXPECT_EQ(out.at(i), -2) << "position " << i << " is both a piece and padding";
      out.at(i) = -1;
    }
  }
  for (int64_t i = 0; i < s.local_elements; ++i) EXPECT_NE(out[i], -2) << "position " << i;
  return out;
}

}  // namespace reshard::planner::testing
