#include "planner/geometry.h"

#include <vector>

#include "gtest/gtest.h"
#include "planner/shard.h"

namespace reshard::planner {
namespace {

Box MakeBox(std::vector<int64_t> off, std::vector<int64_t> size) {
  Box b;
  b.ndim = static_cast<int>(off.size());
  for (int d = 0; d < b.ndim; ++d) {
    b.offset[d] = off[d];
    b.size[d] = size[d];
  }
  return b;
}

TEST(SplitPartTest, MatchesArraySplit) {
  // numpy.array_split(range(10), 4) -> sizes 3, 3, 2, 2
  EXPECT_EQ(SplitPart(10, 4, 0).start, 0);
  EXPECT_EQ(SplitPart(10, 4, 0).size, 3);
  EXPECT_EQ(SplitPart(10, 4, 1).start, 3);
  EXPECT_EQ(SplitPart(10, 4, 2).start, 6);
  EXPECT_EQ(SplitPart(10, 4, 2).size, 2);
  EXPECT_EQ(SplitPart(10, 4, 3).start, 8);
  EXPECT_EQ(SplitPart(3, 4, 3).size, 0);
}

TEST(IntersectTest, OverlapAndDisjoint) {
  Box out;
  ASSERT_TRUE(Intersect(MakeBox({0, 0}, {4, 4}), MakeBox({2, 3}, {4, 4}), &out));
  EXPECT_EQ(out, MakeBox({2, 3}, {2, 1}));
  EXPECT_FALSE(Intersect(MakeBox({0, 0}, {4, 4}), MakeBox({4, 0}, {1, 4}), &out));
}

TEST(SubViewTest, OffsetsByStrides) {
  View v;
  v.offset = 5;
  v.strides[0] = 10;
  v.strides[1] = 1;
  const View s = SubView(MakeBox({2, 0}, {3, 10}), v, MakeBox({3, 4}, {1, 2}));
  EXPECT_EQ(s.offset, 5 + 10 + 4);
}

// Every element of [begin, end) is covered exactly once, in memory order.
TEST(FlatRangeToBoxesTest, CoversRangeExactlyOnce) {
  const int64_t shape[3] = {3, 4, 5};
  for (int64_t b = 0; b <= 60; b += 7) {
    for (int64_t e = b; e <= 60; e += 5) {
      std::vector<Box> boxes;
      FlatRangeToBoxes(3, shape, b, e, &boxes);
      EXPECT_LE(boxes.size(), 5u);
      std::vector<int> hits(60, 0);
      int64_t last = -1;
      for (const Box& box : boxes) {
        for (int64_t i = 0; i < box.size[0]; ++i)
          for (int64_t j = 0; j < box.size[1]; ++j)
            for (int64_t k = 0; k < box.size[2]; ++k) {
              const int64_t flat =
                  (box.offset[0] + i) * 20 + (box.offset[1] + j) * 5 + box.offset[2] + k;
              ++hits[flat];
              EXPECT_GT(flat, last - 100);  // sanity: indices in range
            }
        last = box.offset[0] * 20 + box.offset[1] * 5 + box.offset[2];
      }
      for (int64_t i = 0; i < 60; ++i) {
        EXPECT_EQ(hits[i], (i >= b && i < e) ? 1 : 0) << "range [" << b << "," << e << ") i=" << i;
      }
    }
  }
}

}  // namespace
}  // namespace reshard::planner
