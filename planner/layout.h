// A parallel layout resolved for planning: rank <-> (tp, dp, pp) coordinates,
// rank -> (host, device), layer -> stage. Immutable after Resolve();
// thread-compatible. Inputs must have passed validation (validate.h).
#pragma once

#include <string>
#include <unordered_map>
#include <vector>

#include "absl/status/statusor.h"
#include "reshard/v1/ptc.pb.h"

namespace reshard::planner {

/// Interns host names to dense indices shared by the old and new layouts.
class HostTable {
 public:
  int Intern(const std::string& name);
  /// -1 when the host is unknown.
  int Find(const std::string& name) const;
  const std::string& Name(int index) const { return names_[index]; }
  int size() const { return static_cast<int>(names_.size()); }

 private:
  std::unordered_map<std::string, int> index_;
  std::vector<std::string> names_;
};

struct RankCoord {
  int tp = 0;
  int dp = 0;
  int pp = 0;
};

class ResolvedLayout {
 public:
  /// `layout` must be valid for a PTC with `num_layers` layers.
  static ResolvedLayout Resolve(const v1::Layout& layout, int num_layers, HostTable* hosts);

  int tp() const { return tp_; }
  int pp() const { return pp_; }
  int dp() const { return dp_; }
  int world() const { return tp_ * pp_ * dp_; }
  int Rank(RankCoord c) const;
  RankCoord Coord(int rank) const;
  int host(int rank) const { return host_[rank]; }
  int device(int rank) const { return device_[rank]; }
  /// The stage that owns `layer`.
  int StageOfLayer(int layer) const;
  /// Stages holding a tensor with this pipeline rule, ascending.
  void StagesHolding(const v1::Pipeline& p, std::vector<int>* stages) const;

 private:
  int tp_ = 1, pp_ = 1, dp_ = 1;
  v1::RankOrder order_ = v1::RANK_ORDER_TP_DP_PP;
  std::vector<int> stage_of_layer_;
  std::vector<int> host_;
  std::vector<int> device_;
};

/// Expands a Placement (either form) to one slot per rank.
std::vector<v1::DeviceSlot> ExpandPlacement(const v1::Placement& p);

/// First layer of each stage: `stage_starts` or the even split.
std::vector<int> StageStarts(const v1::ParallelConfig& c, int num_layers);

}  // namespace reshard::planner
