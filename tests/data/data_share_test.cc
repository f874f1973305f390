// The C++ share function (common/data/data_share.h) against the shared test
// vectors of tests/data/share_vectors.json, written by the Python
// implementation (tests/data/gen_share_vectors.py): both must agree bit for
// bit. Plus the properties the vectors cannot show alone.
#include "common/data/data_share.h"

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "tests/data/vectors.h"

namespace reshard::data {
namespace {

using test_vectors::List;
using test_vectors::ListValue;
using test_vectors::Struct;
using test_vectors::U64;
using test_vectors::Value;

#ifndef RESHARD_SHARE_VECTORS
#error "RESHARD_SHARE_VECTORS must name tests/data/share_vectors.json"
#endif

const Struct& Vectors() {
  static const Struct* root = new Struct(test_vectors::Load(RESHARD_SHARE_VECTORS));
  return *root;
}

std::vector<uint64_t> U64s(const ListValue& list) {
  std::vector<uint64_t> out;
  for (const Value& v : list.values()) out.push_back(U64(v));
  return out;
}
Order OrderOf(const Struct& s) {
  Order order;
  order.seed = U64(s, "seed");
  order.shuffle = *ParseShuffle(s.fields().at("shuffle").string_value());
  order.block_size = U64(s, "block_size");
  return order;
}

TEST(DataShareVectorsTest, SplitMix64) {
  const ListValue& cases = List(Vectors(), "splitmix64");
  ASSERT_GT(cases.values_size(), 0);
  for (const Value& c : cases.values()) {
    EXPECT_EQ(SplitMix64(U64(c.struct_value(), "x")), U64(c.struct_value(), "out"));
  }
}

TEST(DataShareVectorsTest, Permutations) {
  const ListValue& cases = List(Vectors(), "permutations");
  ASSERT_GT(cases.values_size(), 0);
  for (const Value& c : cases.values()) {
    const Struct& s = c.struct_value();
    const uint64_t n = U64(s, "n");
    const Permutation perm(n, U64(s, "key"));
    SCOPED_TRACE(testing::Message() << "n " << n);
    if (s.fields().contains("forward")) {
      const std::vector<uint64_t> want = U64s(List(s, "forward"));
      ASSERT_EQ(want.size(), n);
      for (uint64_t i = 0; i < n; ++i) {
        EXPECT_EQ(perm.Forward(i), want[i]) << "i " << i;
        EXPECT_EQ(perm.Inverse(want[i]), i);
      }
    } else {
      const std::vector<uint64_t> at = U64s(List(s, "at")), want = U64s(List(s, "values"));
      for (size_t k = 0; k < at.size(); ++k) {
        EXPECT_EQ(perm.Forward(at[k]), want[k]) << "i " << at[k];
        EXPECT_EQ(perm.Inverse(want[k]), at[k]);
      }
    }
  }
}

TEST(DataShareVectorsTest, Orders) {
  const ListValue& cases = List(Vectors(), "orders");
  ASSERT_GT(cases.values_size(), 300);
  for (const Value& c : cases.values()) {
    const Struct& s = c.struct_value();
    const uint64_t n = U64(s, "num_samples"), epoch = U64(s, "epoch");
    const Order order = OrderOf(s);
    ASSERT_TRUE(ValidateOrder(n, order).ok());
    const EpochOrder epoch_order(n, order, epoch);
    SCOPED_TRACE(testing::Message()
                 << "n " << n << " shuffle " << ShuffleName(order.shuffle) << " block "
                 << order.block_size << " seed " << order.seed << " epoch " << epoch);
    if (s.fields().contains("samples")) {
      const std::vector<uint64_t> want = U64s(List(s, "samples"));
      ASSERT_EQ(want.size(), n);
      for (uint64_t i = 0; i < n; ++i) {
        EXPECT_EQ(epoch_order.Sample(i), want[i]) << "position " << i;
        EXPECT_EQ(SampleAt(n, order, epoch * n + i), want[i]);
      }
    } else {
      const std::vector<uint64_t> at = U64s(List(s, "at")), want = U64s(List(s, "values"));
      for (size_t k = 0; k < at.size(); ++k) {
        EXPECT_EQ(epoch_order.Sample(at[k]), want[k]) << "position " << at[k];
      }
    }
  }
}

TEST(DataShareVectorsTest, Shares) {
  const ListValue& cases = List(Vectors(), "shares");
  ASSERT_GT(cases.values_size(), 0);
  for (const Value& c : cases.values()) {
    const Struct& s = c.struct_value();
    const uint64_t n = U64(s, "num_samples"), cursor = U64(s, "cursor");
    const uint64_t batch = U64(s, "global_batch"), micro = U64(s, "micro_batch_size");
    const int dp = static_cast<int>(U64(s, "dp"));
    const Order order = OrderOf(s);
    SCOPED_TRACE(testing::Message() << "n " << n << " cursor " << cursor << " batch " << batch
                                    << " dp " << dp << " micro " << micro);
    absl::StatusOr<std::vector<uint64_t>> counts = ShareCounts(batch, dp);
    ASSERT_TRUE(counts.ok());
    EXPECT_EQ(*counts, U64s(List(s, "counts")));
    for (const Value& r : List(s, "ranks").values()) {
      const Struct& want = r.struct_value();
      const int rank = static_cast<int>(U64(want, "rank"));
      absl::StatusOr<RankShare> share = Share(n, cursor, batch, dp, rank, micro);
      ASSERT_TRUE(share.ok()) << share.status();
      EXPECT_EQ(share->range.begin, U64(want, "begin"));
      EXPECT_EQ(share->range.end, U64(want, "end"));
      EXPECT_EQ(share->count(), U64(want, "count"));
      std::vector<Segment> segments;
      for (const Value& v : List(want, "segments").values()) {
        const std::vector<uint64_t> t = U64s(v.list_value());
        segments.push_back({t[0], t[1], t[2]});
      }
      EXPECT_EQ(share->segments, segments) << "rank " << rank;
      std::vector<StreamRange> micros;
      for (const Value& v : List(want, "micro_batches").values()) {
        const std::vector<uint64_t> t = U64s(v.list_value());
        micros.push_back({t[0], t[1]});
      }
      EXPECT_EQ(share->micro_batches, micros) << "rank " << rank;
      std::vector<uint64_t> samples;
      for (uint64_t i = share->range.begin; i < share->range.end; ++i) {
        samples.push_back(SampleAt(n, order, i));
      }
      EXPECT_EQ(samples, U64s(List(want, "samples"))) << "rank " << rank;
    }
  }
}

TEST(DataShareVectorsTest, LayoutFingerprints) {
  const ListValue& cases = List(Vectors(), "layout_fingerprints");
  ASSERT_GT(cases.values_size(), 0);
  for (const Value& c : cases.values()) {
    const Struct& s = c.struct_value();
    EXPECT_EQ(LayoutFingerprint(s.fields().at("id").string_value(), U64(s, "num_samples"),
                                s.fields().at("fingerprint").string_value(), OrderOf(s),
                                U64(s, "global_batch")),
              s.fields().at("layout_fingerprint").string_value());
  }
}

TEST(DataShareTest, EveryShuffleIsAPermutationOfTheEpoch) {
  for (uint64_t n : {1, 2, 3, 31, 64, 65, 257}) {
    for (Order order : {Order{9, Shuffle::kNone, 0}, Order{9, Shuffle::kFull, 0},
                        Order{9, Shuffle::kBlock, 1}, Order{9, Shuffle::kBlock, 5},
                        Order{9, Shuffle::kBlock, 64}, Order{9, Shuffle::kBlock, 300}}) {
      for (uint64_t epoch : {0, 1, 2}) {
        const EpochOrder epoch_order(n, order, epoch);
        std::vector<uint64_t> seen(n, 0);
        for (uint64_t i = 0; i < n; ++i) {
          const uint64_t s = epoch_order.Sample(i);
          ASSERT_LT(s, n);
          ++seen[s];
        }
        EXPECT_EQ(std::count(seen.begin(), seen.end(), 1), static_cast<int64_t>(n))
            << "n " << n << " shuffle " << ShuffleName(order.shuffle) << " block "
            << order.block_size << " epoch " << epoch;
      }
    }
  }
}

TEST(DataShareTest, SharesTileTheGlobalBatchAndDifferByAtMostOne) {
  for (uint64_t batch : {1, 2, 7, 8, 13, 100}) {
    for (int dp = 1; dp <= 9; ++dp) {
      uint64_t at = 41, low = UINT64_MAX, high = 0;
      for (int rank = 0; rank < dp; ++rank) {
        absl::StatusOr<RankShare> share = Share(10, 41, batch, dp, rank, 3);
        ASSERT_TRUE(share.ok());
        EXPECT_EQ(share->range.begin, at);
        at = share->range.end;
        low = std::min(low, share->count());
        high = std::max(high, share->count());
        uint64_t micro_at = share->range.begin;
        for (const StreamRange& m : share->micro_batches) {
          EXPECT_EQ(m.begin, micro_at);
          EXPECT_LE(m.count(), 3u);
          EXPECT_GE(m.count(), share->micro_batches.front().count() - 1);
          micro_at = m.end;
        }
        EXPECT_EQ(micro_at, share->range.end);
      }
      EXPECT_EQ(at, 41 + batch);
      EXPECT_LE(high - low, 1u);
    }
  }
}

TEST(DataShareTest, BadArgumentsNameTheField) {
  EXPECT_EQ(Share(0, 0, 8, 2, 0, 0).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Share(10, 0, 0, 2, 0, 0).status().message(),
            "global_batch: 0 must be >= 1 (and cursor + global_batch < 2^63)");
  EXPECT_EQ(Share(10, 0, 8, 0, 0, 0).status().message(), "dp: 0 must be >= 1");
  EXPECT_EQ(Share(10, 0, 8, 2, 2, 0).status().message(), "rank: 2 out of range [0, 2)");
  EXPECT_EQ(Share(10, uint64_t{1} << 63, 8, 2, 0, 0).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ValidateOrder(10, {0, Shuffle::kBlock, 0}).message(),
            "order.block_size: 0 must be >= 1 for shuffle \"block\"");
  EXPECT_EQ(ValidateOrder(10, {0, Shuffle::kFull, 4}).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ParseShuffle("random").status().message(),
            "order.shuffle: \"random\" is not one of none, full, block");
}

}  // namespace
}  // namespace reshard::data
