// The dataset share function of docs/data.md: the order of the global sample
// stream and what each data-parallel rank reads in a step. Pure: no I/O, no
// gRPC, no clock; every function is thread-safe. Computes bit for bit what
// client/python/reshard/data.py computes (tests/data/share_vectors.json).
#ifndef RESHARD_COMMON_DATA_DATA_SHARE_H_
#define RESHARD_COMMON_DATA_DATA_SHARE_H_

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace reshard::data {

/// SplitMix64's output function of state x + 0x9E3779B97F4A7C15.
uint64_t SplitMix64(uint64_t x);

/// A keyed bijection of [0, n): 6-round Feistel network over the smallest
/// even bit width 2h with 4^h >= n, with cycle walking (docs/data.md).
class Permutation {
 public:
  /// n >= 1.
  Permutation(uint64_t n, uint64_t key);
  /// i < n.
  uint64_t Forward(uint64_t i) const;
  /// j < n; Inverse(Forward(i)) == i.
  uint64_t Inverse(uint64_t j) const;

 private:
  uint64_t Encrypt(uint64_t x) const;
  uint64_t Decrypt(uint64_t y) const;

  uint64_t n_;
  int half_;
  uint64_t mask_;
  uint64_t keys_[6];
};

enum class Shuffle { kNone, kFull, kBlock };

/// "none", "full", "block".
absl::string_view ShuffleName(Shuffle shuffle);
absl::StatusOr<Shuffle> ParseShuffle(absl::string_view name);

struct Order {
  uint64_t seed = 0;
  Shuffle shuffle = Shuffle::kNone;
  uint64_t block_size = 0;  // >= 1 for kBlock, 0 otherwise
};

/// INVALID_ARGUMENT naming the field and value when (num_samples, order) is
/// not a valid order.
absl::Status ValidateOrder(uint64_t num_samples, const Order& order);

/// splitmix64(splitmix64(seed) ^ epoch).
uint64_t EpochKey(uint64_t seed, uint64_t epoch);

/// The order of one epoch: position -> sample id, O(1) per call. Requires
/// ValidateOrder(num_samples, order).ok().
class EpochOrder {
 public:
  EpochOrder(uint64_t num_samples, const Order& order, uint64_t epoch);
  /// position < num_samples.
  uint64_t Sample(uint64_t position) const;

 private:
  uint64_t num_samples_;
  Order order_;
  uint64_t key_;
  Permutation perm_;  // kFull: the samples; kBlock: the blocks
  uint64_t blocks_ = 1;
  uint64_t tail_ = 0;
  uint64_t tail_pos_ = 0;
};

/// The sample id at global stream index `stream_index` (epoch
/// stream_index / num_samples). Requires a valid order.
uint64_t SampleAt(uint64_t num_samples, const Order& order, uint64_t stream_index);

/// Positions [begin, end) of one epoch.
struct Segment {
  uint64_t epoch = 0;
  uint64_t begin = 0;
  uint64_t end = 0;
  bool operator==(const Segment& o) const {
    return epoch == o.epoch && begin == o.begin && end == o.end;
  }
};

/// A range [begin, end) of the global sample stream.
struct StreamRange {
  uint64_t begin = 0;
  uint64_t end = 0;
  uint64_t count() const { return end - begin; }
  bool operator==(const StreamRange& o) const { return begin == o.begin && end == o.end; }
};

/// What one data-parallel rank reads in one step.
struct RankShare {
  int rank = 0;
  int dp = 1;
  uint64_t global_batch = 1;
  StreamRange range;                       // count differs by <= 1 between ranks
  std::vector<Segment> segments;           // range cut at epoch boundaries
  std::vector<StreamRange> micro_batches;  // sizes differ by <= 1, each <= micro size
  uint64_t count() const { return range.count(); }
  /// count / global_batch: the weight of this rank's per-sample-mean loss.
  double weight() const { return static_cast<double>(count()) / global_batch; }
};

/// Samples per rank for one step: the first global_batch % dp get one more.
absl::StatusOr<std::vector<uint64_t>> ShareCounts(uint64_t global_batch, int dp);

/// [begin, end) cut where an epoch ends. num_samples >= 1.
std::vector<Segment> SplitEpochs(uint64_t begin, uint64_t end, uint64_t num_samples);

/// [begin, end) cut into ceil(count / micro_batch_size) ranges whose sizes
/// differ by at most one (the first larger); micro_batch_size 0: one range.
std::vector<StreamRange> MicroBatches(uint64_t begin, uint64_t end, uint64_t micro_batch_size);

/// The share of `rank` for the step starting at `cursor`. INVALID_ARGUMENT
/// naming the field for num_samples 0, cursor + global_batch >= 2^63,
/// global_batch 0, dp < 1, rank outside [0, dp).
absl::StatusOr<RankShare> Share(uint64_t num_samples, uint64_t cursor, uint64_t global_batch,
                                int dp, int rank, uint64_t micro_batch_size);

/// "sha256:<hex>" of the dataset id, num_samples, fingerprint, order and
/// global batch (docs/data.md, "Layout fingerprint").
std::string LayoutFingerprint(absl::string_view dataset_id, uint64_t num_samples,
                              absl::string_view dataset_fingerprint, const Order& order,
                              uint64_t global_batch);

}  // namespace reshard::data

#endif  // RESHARD_COMMON_DATA_DATA_SHARE_H_
