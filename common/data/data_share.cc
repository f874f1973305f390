#include "common/data/data_share.h"

#include <openssl/sha.h>

#include <algorithm>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"

namespace reshard::data {
namespace {

constexpr uint64_t kGolden = 0x9E3779B97F4A7C15ULL;
constexpr uint64_t kMaxInt63 = (uint64_t{1} << 63) - 1;

int BitLength(uint64_t x) {
  int bits = 0;
  while (x != 0) {
    ++bits;
    x >>= 1;
  }
  return bits;
}

}  // namespace

uint64_t SplitMix64(uint64_t x) {
  uint64_t z = x + kGolden;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31);
}

Permutation::Permutation(uint64_t n, uint64_t key) : n_(n) {
  int bits = std::max(2, BitLength(n == 0 ? 0 : n - 1));
  bits += bits & 1;
  half_ = bits / 2;
  mask_ = (uint64_t{1} << half_) - 1;
  for (int r = 0; r < 6; ++r) keys_[r] = SplitMix64(key + static_cast<uint64_t>(r) * kGolden);
}

uint64_t Permutation::Encrypt(uint64_t x) const {
  uint64_t left = x >> half_, right = x & mask_;
  for (uint64_t k : keys_) {
    const uint64_t next = left ^ (SplitMix64(k ^ right) & mask_);
    left = right;
    right = next;
  }
  return (left << half_) | right;
}

uint64_t Permutation::Decrypt(uint64_t y) const {
  uint64_t left = y >> half_, right = y & mask_;
  for (int r = 5; r >= 0; --r) {
    const uint64_t prev_left = right ^ (SplitMix64(keys_[r] ^ left) & mask_);
    right = left;
    left = prev_left;
  }
  return (left << half_) | right;
}

uint64_t Permutation::Forward(uint64_t i) const {
  if (n_ <= 1) return 0;
  uint64_t y = Encrypt(i);
  while (y >= n_) y = Encrypt(y);
  return y;
}

uint64_t Permutation::Inverse(uint64_t j) const {
  if (n_ <= 1) return 0;
  uint64_t x = Decrypt(j);
  while (x >= n_) x = Decrypt(x);
  return x;
}

absl::string_view ShuffleName(Shuffle shuffle) {
  switch (shuffle) {
    case Shuffle::kNone:
      return "none";
    case Shuffle::kFull:
      return "full";
    case Shuffle::kBlock:
      return "block";
  }
  return "?";
}

absl::StatusOr<Shuffle> ParseShuffle(absl::string_view name) {
  if (name == "none") return Shuffle::kNone;
  if (name == "full") return Shuffle::kFull;
  if (name == "block") return Shuffle::kBlock;
  return absl::InvalidArgumentError(
      absl::StrCat("order.shuffle: \"", name, "\" is not one of none, full, block"));
}

absl::Status ValidateOrder(uint64_t num_samples, const Order& order) {
  if (num_samples < 1 || num_samples > kMaxInt63) {
    return absl::InvalidArgumentError(
        absl::StrCat("num_samples: ", num_samples, " must be in [1, 2^63)"));
  }
  if (order.shuffle == Shuffle::kBlock && (order.block_size < 1 || order.block_size > kMaxInt63)) {
    return absl::InvalidArgumentError(absl::StrCat("order.block_size: ", order.block_size,
                                                   " must be >= 1 for shuffle \"block\""));
  }
  if (order.shuffle != Shuffle::kBlock && order.block_size != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("order.block_size: ", order.block_size,
                     " is only meaningful for shuffle \"block\" (shuffle is \"",
                     ShuffleName(order.shuffle), "\"); leave it 0"));
  }
  return absl::OkStatus();
}

uint64_t EpochKey(uint64_t seed, uint64_t epoch) { return SplitMix64(SplitMix64(seed) ^ epoch); }

EpochOrder::EpochOrder(uint64_t num_samples, const Order& order, uint64_t epoch)
    : num_samples_(num_samples),
      order_(order),
      key_(EpochKey(order.seed, epoch)),
      perm_(order.shuffle == Shuffle::kBlock
                ? (num_samples + order.block_size - 1) / order.block_size
                : num_samples,
            order.shuffle == Shuffle::kBlock ? SplitMix64(key_) : key_) {
  if (order_.shuffle == Shuffle::kBlock) {
    blocks_ = (num_samples + order.block_size - 1) / order.block_size;
    tail_ = num_samples - (blocks_ - 1) * order.block_size;
    tail_pos_ = perm_.Inverse(blocks_ - 1);
  }
}

uint64_t EpochOrder::Sample(uint64_t position) const {
  switch (order_.shuffle) {
    case Shuffle::kNone:
      return position;
    case Shuffle::kFull:
      return perm_.Forward(position);
    case Shuffle::kBlock:
      break;
  }
  const uint64_t s = order_.block_size, q = tail_pos_;
  uint64_t p, o;
  if (position < q * s) {
    p = position / s;
    o = position % s;
  } else if (position < q * s + tail_) {
    p = q;
    o = position - q * s;
  } else {
    const uint64_t rest = position - q * s - tail_;
    p = q + 1 + rest / s;
    o = rest % s;
  }
  const uint64_t block = perm_.Forward(p);
  const uint64_t size = block == blocks_ - 1 ? tail_ : s;
  const Permutation inner(size, SplitMix64(key_ + (block + 1) * kGolden));
  return block * s + inner.Forward(o);
}

uint64_t SampleAt(uint64_t num_samples, const Order& order, uint64_t stream_index) {
  return EpochOrder(num_samples, order, stream_index / num_samples)
      .Sample(stream_index % num_samples);
}

absl::StatusOr<std::vector<uint64_t>> ShareCounts(uint64_t global_batch, int dp) {
  if (global_batch < 1 || global_batch > kMaxInt63) {
    return absl::InvalidArgumentError(
        absl::StrCat("global_batch: ", global_batch, " must be in [1, 2^63)"));
  }
  if (dp < 1) return absl::InvalidArgumentError(absl::StrCat("dp: ", dp, " must be >= 1"));
  const uint64_t q = global_batch / dp, r = global_batch % dp;
  std::vector<uint64_t> counts(dp);
  for (int i = 0; i < dp; ++i) counts[i] = q + (static_cast<uint64_t>(i) < r ? 1 : 0);
  return counts;
}

std::vector<Segment> SplitEpochs(uint64_t begin, uint64_t end, uint64_t num_samples) {
  std::vector<Segment> out;
  while (begin < end) {
    const uint64_t epoch = begin / num_samples, position = begin % num_samples;
    const uint64_t stop = std::min(end, (epoch + 1) * num_samples);
    out.push_back({epoch, position, position + (stop - begin)});
    begin = stop;
  }
  return out;
}

std::vector<StreamRange> MicroBatches(uint64_t begin, uint64_t end, uint64_t micro_batch_size) {
  std::vector<StreamRange> out;
  const uint64_t count = end - begin;
  if (count == 0) return out;
  const uint64_t k = micro_batch_size == 0 ? 1 : (count + micro_batch_size - 1) / micro_batch_size;
  const uint64_t q = count / k, r = count % k;
  uint64_t at = begin;
  for (uint64_t j = 0; j < k; ++j) {
    const uint64_t size = q + (j < r ? 1 : 0);
    out.push_back({at, at + size});
    at += size;
  }
  return out;
}

absl::StatusOr<RankShare> Share(uint64_t num_samples, uint64_t cursor, uint64_t global_batch,
                                int dp, int rank, uint64_t micro_batch_size) {
  if (num_samples < 1 || num_samples > kMaxInt63) {
    return absl::InvalidArgumentError(
        absl::StrCat("num_samples: ", num_samples, " must be in [1, 2^63)"));
  }
  if (cursor > kMaxInt63) {
    return absl::InvalidArgumentError(absl::StrCat("cursor: ", cursor, " must be in [0, 2^63)"));
  }
  if (global_batch < 1 || global_batch > kMaxInt63 - cursor) {
    return absl::InvalidArgumentError(absl::StrCat(
        "global_batch: ", global_batch, " must be >= 1 (and cursor + global_batch < 2^63)"));
  }
  if (dp < 1) return absl::InvalidArgumentError(absl::StrCat("dp: ", dp, " must be >= 1"));
  if (rank < 0 || rank >= dp) {
    return absl::InvalidArgumentError(absl::StrCat("rank: ", rank, " out of range [0, ", dp, ")"));
  }
  const uint64_t q = global_batch / dp, r = global_batch % dp;
  const uint64_t ur = static_cast<uint64_t>(rank);
  RankShare share;
  share.rank = rank;
  share.dp = dp;
  share.global_batch = global_batch;
  share.range.begin = cursor + ur * q + std::min(ur, r);
  share.range.end = share.range.begin + q + (ur < r ? 1 : 0);
  share.segments = SplitEpochs(share.range.begin, share.range.end, num_samples);
  share.micro_batches = MicroBatches(share.range.begin, share.range.end, micro_batch_size);
  return share;
}

std::string LayoutFingerprint(absl::string_view dataset_id, uint64_t num_samples,
                              absl::string_view dataset_fingerprint, const Order& order,
                              uint64_t global_batch) {
  const std::string text =
      absl::StrCat("reshard-data-v1\nid=", dataset_id, "\nnum_samples=", num_samples,
                   "\nfingerprint=", dataset_fingerprint, "\nseed=", order.seed,
                   "\nshuffle=", ShuffleName(order.shuffle), "\nblock_size=", order.block_size,
                   "\nglobal_batch=", global_batch, "\n");
  unsigned char digest[SHA256_DIGEST_LENGTH];
  SHA256(reinterpret_cast<const unsigned char*>(text.data()), text.size(), digest);
  return absl::StrCat("sha256:", absl::BytesToHexString(absl::string_view(
                                     reinterpret_cast<const char*>(digest), SHA256_DIGEST_LENGTH)));
}

}  // namespace reshard::data
