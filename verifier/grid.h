// The verifier's reading of a layout's ranks: coordinates (tp, cp, dp, pp and
// the expert coordinates), pipeline chunks and stages, and placement, as
// docs/partitioning.md ("Ranks", "Placement", "Stages") defines them.
// Internal to verifier/.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "reshard/v1/ptc.pb.h"
#include "verifier/model.h"

namespace reshard::verifier {

/// numpy array_split(n, k)[i].
inline int64_t PartStart(int64_t n, int64_t k, int64_t i) {
  return i * (n / k) + (i < n % k ? i : n % k);
}
inline int64_t PartSize(int64_t n, int64_t k, int64_t i) { return n / k + (i < n % k ? 1 : 0); }

/// A rank's coordinates, dense and expert.
struct Coords {
  int tp_i = 0, cp_i = 0, dp_i = 0, pp_i = 0;
  int etp_i = 0, ep_i = 0, edp_i = 0;
};

Coords CoordsOf(const RankGrid& g, int r);

/// Validates the parallel config and placement of `layout`; hosts seen for
/// the first time are appended to `hosts`. InvalidArgument names `what`.
absl::StatusOr<RankGrid> ParseGrid(const v1::Layout& layout, int num_layers,
                                   const std::string& what, std::vector<std::string>* hosts,
                                   std::map<std::string, int>* host_index);

/// Whether `stage` holds tensor `t` (its pipeline rule).
bool StageHolds(const v1::TensorSpec& t, const RankGrid& g, int stage);

/// The chunk of `t` on a stage that holds it ("chunk" in Stages).
int ChunkOf(const v1::TensorSpec& t, const RankGrid& g, int stage);

}  // namespace reshard::verifier
