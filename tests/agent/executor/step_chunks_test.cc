// StepChunks and transfer tags: chunks tile a step exactly, stay near the
// chunk size, and tags are unique per (operation, step, chunk).
#include "agent/executor/step_chunks.h"

#include <gtest/gtest.h>

#include <set>

#include "agent/executor/transfer_tags.h"

namespace reshard::agent {
namespace {

// How often each element of `shape` is covered by the chunks, row-major.
std::vector<int> Coverage(const std::vector<int64_t>& shape, const StepChunks& chunks) {
  int64_t n = 1;
  for (int64_t s : shape) n *= s;
  std::vector<int> cover(n, 0);
  std::vector<int64_t> start, cshape;
  for (int64_t c = 0; c < chunks.count(); ++c) {
    chunks.Get(c, &start, &cshape);
    EXPECT_EQ(start.size(), shape.size());
    EXPECT_EQ(cshape.size(), shape.size());
    int64_t elements = 1;
    for (int64_t s : cshape) elements *= s;
    std::vector<int64_t> idx(shape.size(), 0);
    for (int64_t e = 0; e < elements; ++e) {
      int64_t flat = 0;
      for (size_t k = 0; k < shape.size(); ++k) {
        EXPECT_LT(start[k] + idx[k], shape[k]);
        flat = flat * shape[k] + start[k] + idx[k];
      }
      ++cover[flat];
      for (size_t k = shape.size(); k-- > 0;) {
        if (++idx[k] < cshape[k]) break;
        idx[k] = 0;
      }
    }
  }
  return cover;
}

void ExpectTiles(const std::vector<int64_t>& shape, int eb, int64_t chunk_bytes,
                 int64_t max_chunk_bytes) {
  StepChunks chunks(shape, eb, chunk_bytes);
  int64_t sum = 0;
  std::vector<int64_t> start, cshape;
  for (int64_t c = 0; c < chunks.count(); ++c) {
    chunks.Get(c, &start, &cshape);
    int64_t elements = 1;
    for (int64_t s : cshape) elements *= s;
    EXPECT_EQ(chunks.Bytes(c), elements * eb) << "chunk " << c;
    EXPECT_LE(chunks.Bytes(c), max_chunk_bytes) << "chunk " << c;
    EXPECT_GT(chunks.Bytes(c), 0) << "chunk " << c;
    sum += chunks.Bytes(c);
  }
  const std::vector<int> cover = Coverage(shape, chunks);
  for (size_t i = 0; i < cover.size(); ++i) ASSERT_EQ(cover[i], 1) << "element " << i;
  EXPECT_EQ(sum, static_cast<int64_t>(cover.size()) * eb);
}

TEST(StepChunksTest, SmallStepIsOneChunk) {
  StepChunks chunks({4, 8}, 4, 1 << 20);
  ASSERT_EQ(chunks.count(), 1);
  std::vector<int64_t> start, shape;
  chunks.Get(0, &start, &shape);
  EXPECT_EQ(start, (std::vector<int64_t>{0, 0}));
  EXPECT_EQ(shape, (std::vector<int64_t>{4, 8}));
  EXPECT_EQ(chunks.Bytes(0), 128);
}

TEST(StepChunksTest, EmptyStepHasNoChunk) { EXPECT_EQ(StepChunks({3, 0, 5}, 4, 64).count(), 0); }

TEST(StepChunksTest, RowsFitAChunkCutTheOuterDimensionEvenly) {
  // 10 rows of 4000 bytes, 10000-byte chunks: 4 chunks of 3, 3, 2, 2 rows.
  StepChunks chunks({10, 1000}, 4, 10000);
  ASSERT_EQ(chunks.count(), 4);
  std::vector<int64_t> start, shape;
  chunks.Get(1, &start, &shape);
  EXPECT_EQ(start, (std::vector<int64_t>{3, 0}));
  EXPECT_EQ(shape, (std::vector<int64_t>{3, 1000}));
  chunks.Get(3, &start, &shape);
  EXPECT_EQ(start, (std::vector<int64_t>{8, 0}));
  EXPECT_EQ(shape, (std::vector<int64_t>{2, 1000}));
  ExpectTiles({10, 1000}, 4, 10000, 12000);
}

TEST(StepChunksTest, RowsLargerThanAChunkAreCutInsideRows) {
  // Rows of 40000 bytes, 16 KiB chunks: 3 pieces per row, boundaries mid-row.
  StepChunks chunks({3, 10000}, 4, 16384);
  ASSERT_EQ(chunks.count(), 9);
  std::vector<int64_t> start, shape;
  chunks.Get(4, &start, &shape);
  EXPECT_EQ(start, (std::vector<int64_t>{1, 3334}));
  EXPECT_EQ(shape, (std::vector<int64_t>{1, 3333}));
  ExpectTiles({3, 10000}, 4, 16384, 16384);
}

TEST(StepChunksTest, TilesOddShapesExactly) {
  ExpectTiles({7, 5, 3}, 2, 31, 31);           // down to single elements and pairs
  ExpectTiles({1000003}, 1, 4096, 4096);       // one long run
  ExpectTiles({5, 1, 7, 11}, 8, 100, 100);     // size-1 dimension
  ExpectTiles({2, 3}, 16, 1, 16);              // chunk smaller than an element
  ExpectTiles({130, 17}, 4, 1000, 1000 + 68);  // balanced pieces: up to one row over
}

TEST(StepChunksTest, TooManyChunksMakesChunksLarger) {
  // 100000 rows of 100000 bytes with 1000-byte chunks would be 10^7 chunks.
  StepChunks chunks({100000, 100000}, 1, 1000);
  // The last chunk index is the step's seal's (kSealChunk), never data's.
  EXPECT_LE(chunks.count(), kMaxDataChunksPerStep);
  EXPECT_GT(chunks.count(), kMaxChunksPerStep / 2);
  int64_t sum = 0;
  for (int64_t c = 0; c < chunks.count(); ++c) sum += chunks.Bytes(c);
  EXPECT_EQ(sum, int64_t{100000} * 100000);
}

TEST(TransferTagTest, LayoutIsKeyStepChunk) {
  const uint32_t key = OperationTagKey("op-1");
  EXPECT_LT(key, uint32_t{1} << kTagKeyBits);
  EXPECT_EQ(key, OperationTagKey("op-1"));
  EXPECT_NE(key, OperationTagKey("op-2"));
  EXPECT_EQ(TransferTag(0xabcdef, 0x123456, 0x789a).value(), 0xabcdef123456789aull);
  const uint64_t t = TransferTag(key, 5, 7).value();
  EXPECT_EQ(t & kTagKeyMask, uint64_t{key} << 40);
  std::set<uint64_t> seen;
  for (int64_t step : {0, 1, 2, 65535, 65536, int(kMaxTaggedSteps - 1)}) {
    for (int64_t chunk : {0, 1, 255, 256, int(kMaxChunksPerStep - 1)}) {
      EXPECT_TRUE(seen.insert(TransferTag(key, step, chunk).value()).second)
          << step << " " << chunk;
    }
  }
}

TEST(TransferTagTest, OutOfRangeIsInvalidArgument) {
  EXPECT_TRUE(absl::IsInvalidArgument(TransferTag(1, kMaxTaggedSteps, 0).status()));
  EXPECT_TRUE(absl::IsInvalidArgument(TransferTag(1, -1, 0).status()));
  EXPECT_TRUE(absl::IsInvalidArgument(TransferTag(1, 0, kMaxChunksPerStep).status()));
  EXPECT_TRUE(TransferTag(1, kMaxTaggedSteps - 1, kMaxChunksPerStep - 1).ok());
}

// Proofs, seals and data chunks of one key never share a tag, and every one
// of them decodes to its step and chunk and carries the key.
TEST(TransferTagTest, ProofsSealsAndChunksAreDistinctTagsOfTheKey) {
  const uint32_t key = 0x123456;
  EXPECT_EQ(ProofTag(key), 0x123456ffffff0000ull);
  EXPECT_EQ(SealTag(key, 17).value(), 0x123456000011ffffull);
  EXPECT_EQ(TagBase(key), 0x1234560000000000ull);
  EXPECT_TRUE(absl::IsInvalidArgument(SealTag(key, kMaxTaggedSteps).status()));
  const uint64_t data = TransferTag(key, 17, kMaxDataChunksPerStep - 1).value();
  EXPECT_EQ(StepOfTag(data), 17);
  EXPECT_EQ(ChunkOfTag(data), kMaxDataChunksPerStep - 1);
  EXPECT_EQ(StepOfTag(ProofTag(key)), kProofStepIndex);
  EXPECT_EQ(ChunkOfTag(SealTag(key, 17).value()), kSealChunk);
  const std::set<uint64_t> tags{ProofTag(key), SealTag(key, 17).value(), data};
  EXPECT_EQ(tags.size(), 3u);
  for (uint64_t t : tags) EXPECT_EQ(t & kTagKeyMask, TagBase(key)) << std::hex << t;
}

}  // namespace
}  // namespace reshard::agent
