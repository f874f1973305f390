// ItemHashCursor: whatever order, overlaps and gaps the ranges land in, the
// checksum is the one-shot Checksum of the item; a range at the cursor is
// hashed from the bytes the caller hands over (hot), the rest from the
// buffer (cold). The fused pass of a chunk tag and a hash.
#include "agent/executor/item_hash.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "agent/executor/step_seal.h"
#include "agent/shard_store/shard_store.h"

namespace reshard::agent {
namespace {

std::vector<uint8_t> RandomBytes(std::mt19937_64& rng, size_t n) {
  std::vector<uint8_t> v(n);
  for (uint8_t& b : v) b = static_cast<uint8_t>(rng());
  return v;
}

struct Range {
  size_t offset, bytes;
};

// Ranges covering [0, n) in random pieces, some of them twice or
// overlapping their neighbours, some left out (gaps), in random order.
std::vector<Range> RandomRanges(std::mt19937_64& rng, size_t n) {
  std::vector<Range> out;
  size_t at = 0;
  while (at < n) {
    const size_t most = std::max<size_t>(1, n / 4);
    const size_t len = std::min(n - at, 1 + static_cast<size_t>(rng() % most));
    const int what = static_cast<int>(rng() % 10);
    if (what == 0) {
      // a gap: left to Finish
    } else if (what == 1) {
      out.push_back({at, len});
      out.push_back({at, len});  // the same range twice (a source read twice)
    } else if (what == 2 && at > 0) {
      const size_t back = 1 + rng() % at;
      out.push_back({at - back, len + back});  // overlaps what came before
    } else {
      out.push_back({at, len});
    }
    at += len;
  }
  if (rng() % 4 == 0) out.push_back({n, 7});        // beyond the item: ignored
  if (n > 0 && rng() % 4 == 0) out.push_back({n - 1, 50});  // runs past the end: clipped
  std::shuffle(out.begin(), out.end(), rng);
  return out;
}

TEST(ItemHashCursorTest, AnyLandingOrderGivesTheOneShotChecksum) {
  std::mt19937_64 rng(2025);
  const std::vector<size_t> sizes = {0, 1, 2, 3, 63, 64, 65, 239, 240, 241, 1000, 4096, 100003,
                                     kFusedBlockBytes + 17};
  for (int round = 0; round < 400; ++round) {
    const size_t n = round < static_cast<int>(sizes.size()) * 10 ? sizes[round % sizes.size()]
                                                                 : rng() % 20000;
    const std::vector<uint8_t> item = RandomBytes(rng, n);
    const std::vector<Range> ranges = RandomRanges(rng, n);
    ItemHashCursor cursor(item.data(), n);
    for (const Range& r : ranges) {
      if (r.offset >= n) {
        cursor.Landed(r.offset, r.bytes, item.data());  // never read: beyond the item
        continue;
      }
      const size_t len = std::min(r.bytes, n - r.offset);
      // Half of the time the caller hands an equal copy (a block it has hot).
      if (rng() % 2 == 0) {
        std::vector<uint8_t> copy(item.begin() + r.offset, item.begin() + r.offset + len);
        cursor.Landed(r.offset, r.bytes, copy.data());
        std::fill(copy.begin(), copy.end(), 0xee);  // not read after Landed
      } else {
        cursor.Landed(r.offset, r.bytes, item.data() + r.offset);
      }
    }
    ASSERT_EQ(cursor.Finish(), Checksum(item.data(), n))
        << "round " << round << ", " << n << " bytes, " << ranges.size() << " ranges";
    EXPECT_EQ(cursor.cursor(), n);
  }
}

TEST(ItemHashCursorTest, InOrderRangesAreHashedHotAndNothingIsLeftForFinish) {
  std::mt19937_64 rng(7);
  const std::vector<uint8_t> item = RandomBytes(rng, 10000);
  ItemHashCursor cursor(item.data(), item.size());
  for (size_t at = 0; at < item.size(); at += 999) {
    cursor.Landed(at, std::min<size_t>(999, item.size() - at), item.data() + at);
    EXPECT_EQ(cursor.cursor(), std::min<size_t>(at + 999, item.size()));
  }
  EXPECT_EQ(cursor.Finish(), Checksum(item.data(), item.size()));
  EXPECT_EQ(cursor.cold_bytes(), 0u);
}

TEST(ItemHashCursorTest, RangesBeyondTheCursorWaitAndAreHashedFromTheBufferOnceContiguous) {
  std::mt19937_64 rng(8);
  const std::vector<uint8_t> item = RandomBytes(rng, 9000);
  ItemHashCursor cursor(item.data(), item.size());
  cursor.Landed(6000, 3000, item.data() + 6000);
  cursor.Landed(3000, 3000, item.data() + 3000);
  EXPECT_EQ(cursor.cursor(), 0u);  // nothing contiguous with the start yet
  cursor.Landed(0, 3000, item.data());
  EXPECT_EQ(cursor.cursor(), 9000u);     // the two waiting ranges followed
  EXPECT_EQ(cursor.cold_bytes(), 6000u);  // from the buffer
  EXPECT_EQ(cursor.Finish(), Checksum(item.data(), item.size()));
}

TEST(ItemHashCursorTest, NothingLandedIsHashedWholeByFinish) {
  std::mt19937_64 rng(9);
  const std::vector<uint8_t> item = RandomBytes(rng, 5000);
  ItemHashCursor cursor(item.data(), item.size());
  cursor.Landed(100, 200, item.data() + 100);  // waits; Finish reads the buffer
  EXPECT_EQ(cursor.Finish(), Checksum(item.data(), item.size()));
  EXPECT_EQ(cursor.cold_bytes(), 5000u);
  ItemHashCursor empty(nullptr, 0);
  empty.Landed(0, 10, item.data());
  EXPECT_EQ(empty.Finish(), Checksum(nullptr, 0));
}

// A range at the cursor is hashed from the bytes handed over, at once: a
// later change of the buffer there does not alter the checksum (what was
// read is what is checked), while one in a range still waiting does.
TEST(ItemHashCursorTest, ARangeAtTheCursorIsHashedWhenItLands) {
  std::mt19937_64 rng(10);
  std::vector<uint8_t> item = RandomBytes(rng, 4000);
  const std::vector<uint8_t> as_landed = item;
  ItemHashCursor cursor(item.data(), item.size());
  cursor.Landed(0, 1000, item.data());
  cursor.Landed(2000, 1000, item.data() + 2000);
  item[10] ^= 1;    // hashed already
  item[2010] ^= 1;  // waiting: read from the buffer later
  std::vector<uint8_t> expected = as_landed;
  expected[2010] ^= 1;
  EXPECT_EQ(cursor.Finish(), Checksum(expected.data(), expected.size()));
}

TEST(FusedPassTest, ChunkTagWithABlockPassIsTheTagAndSeesEveryByteOnceInOrder) {
  std::mt19937_64 rng(11);
  const std::string key(32, 'k');
  for (size_t n : {size_t{0}, size_t{1}, kFusedBlockBytes - 1, kFusedBlockBytes,
                   3 * kFusedBlockBytes + 5}) {
    const std::vector<uint8_t> data = RandomBytes(rng, n);
    ItemHashCursor cursor(data.data(), n);
    size_t seen = 0;
    const ChunkTag fused = ChunkTagOf(key, data.data(), n,
                                      [&](size_t offset, const uint8_t* block, size_t len) {
                                        EXPECT_EQ(offset, seen);
                                        EXPECT_EQ(block, data.data() + offset);
                                        EXPECT_LE(len, kFusedBlockBytes);
                                        seen += len;
                                        cursor.Landed(offset, len, block);
                                      });
    EXPECT_EQ(seen, n);
    EXPECT_EQ(fused, ChunkTagOf(key, data.data(), n)) << n << " bytes";
    EXPECT_EQ(cursor.cold_bytes(), 0u);
    EXPECT_EQ(cursor.Finish(), Checksum(data.data(), n));
  }
}

}  // namespace
}  // namespace reshard::agent
