// A parallel layout resolved for planning: rank <-> (tp, cp, dp, pp)
// coordinates, expert coordinates, rank -> (host, device), layer -> chunk ->
// stage (docs/partitioning.md, "Ranks" and "Stages"). Immutable after
// Resolve(); thread-compatible. Inputs must have passed validation
// (validate.h).
#pragma once

#include <cstdint>
#include <string>
#include <unordered_map>
#include <utility>
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

/// A rank's coordinates. `cp` is last so that {tp, dp, pp} still reads as
/// before for layouts without context parallelism.
struct RankCoord {
  int tp = 0;
  int dp = 0;
  int pp = 0;
  int cp = 0;
};

/// A rank's mixture-of-experts coordinates inside its stage.
struct ExpertCoord {
  int etp = 0;
  int ep = 0;
  int edp = 0;
};

class ResolvedLayout {
 public:
  /// `layout` must be valid for a PTC with `num_layers` layers.
  static ResolvedLayout Resolve(const v1::Layout& layout, int num_layers, HostTable* hosts);

  int tp() const { return tp_; }
  int pp() const { return pp_; }
  int dp() const { return dp_; }
  int cp() const { return cp_; }
  int vpp() const { return vpp_; }
  int ep() const { return ep_; }
  int expert_tp() const { return expert_tp_; }
  /// Data-parallel ranks per HSDP shard group (`dp_shard`, or dp when 0).
  int dp_shard() const { return dp_shard_; }
  /// Expert-data-parallel size: tp * cp * dp / (expert_tp * ep).
  int edp() const { return stage_size() / (expert_tp_ * ep_); }
  /// Ranks per stage: tp * cp * dp.
  int stage_size() const { return tp_ * cp_ * dp_; }
  int world() const { return stage_size() * pp_; }
  int Rank(RankCoord c) const {
    const int inner = c.tp + tp_ * c.cp;  // tp_i + tp * cp_i
    const int tc = tp_ * cp_;
    if (order_ == v1::RANK_ORDER_TP_PP_DP) return inner + tc * (c.pp + pp_ * c.dp);
    return inner + tc * (c.dp + dp_ * c.pp);
  }
  RankCoord Coord(int rank) const;
  /// Position of a rank inside its stage: tp_i + tp * (cp_i + cp * dp_i).
  int PositionInStage(RankCoord c) const { return c.tp + tp_ * (c.cp + cp_ * c.dp); }
  /// The coordinates of the rank at `position` (PositionInStage) of `stage`.
  RankCoord CoordAt(int position, int stage) const {
    RankCoord c;
    c.tp = position % tp_;
    c.cp = (position / tp_) % cp_;
    c.dp = position / (tp_ * cp_);
    c.pp = stage;
    return c;
  }
  /// Rank(CoordAt(position, stage)), from a table (planning asks it for
  /// every endpoint of every region).
  int RankAt(int position, int stage) const { return rank_at_[stage * stage_size() + position]; }
  /// Data-parallel group index g = cp_i + cp * dp_i (group size dp * cp).
  int GroupIndex(RankCoord c) const { return c.cp + cp_ * c.dp; }
  /// The shard group a dense tensor with `over` splits over (size S, the
  /// rank's index s; docs/partitioning.md, "Data-parallel groups").
  std::pair<int, int> ShardGroup(v1::DpOver over, RankCoord c) const {
    if (over == v1::DP_OVER_DP) return {dp_shard_, c.dp % dp_shard_};
    return {dp_shard_ * cp_, c.cp + cp_ * (c.dp % dp_shard_)};
  }
  ExpertCoord Expert(RankCoord c) const;
  int host(int rank) const { return host_[rank]; }
  int device(int rank) const { return device_[rank]; }
  /// The stage that owns `layer`.
  int StageOfLayer(int layer) const;
  /// The chunk (0 .. pp * vpp - 1) that owns `layer`.
  int ChunkOfLayer(int layer) const { return chunk_of_layer_[layer]; }
  int num_chunks() const { return pp_ * vpp_; }
  /// Stages holding a tensor with this pipeline rule, ascending.
  void StagesHolding(const v1::Pipeline& p, std::vector<int>* stages) const;
  /// The chunk of a tensor with rule `p` on `stage` (which must hold it).
  int ChunkOf(const v1::Pipeline& p, int stage) const;

 private:
  int tp_ = 1, pp_ = 1, dp_ = 1, cp_ = 1, vpp_ = 1, ep_ = 1, expert_tp_ = 1, dp_shard_ = 1;
  v1::RankOrder order_ = v1::RANK_ORDER_TP_DP_PP;
  std::vector<int> chunk_of_layer_;
  std::vector<int> host_;
  std::vector<int> device_;
  std::vector<int> rank_at_;  // stage * stage_size() + position -> rank
};

/// Expands a Placement (either form) to one slot per rank.
std::vector<v1::DeviceSlot> ExpandPlacement(const v1::Placement& p);

/// First layer of each chunk (pp * vpp of them; one per stage when vpp is 1):
/// `stage_starts` or the even split.
std::vector<int> StageStarts(const v1::ParallelConfig& c, int num_layers);

/// `cp`, `vpp`, `ep` with 0 read as 1; `expert_tp` with 0 read as `tp`.
int CpOf(const v1::ParallelConfig& c);
int VppOf(const v1::ParallelConfig& c);
int EpOf(const v1::ParallelConfig& c);
int ExpertTpOf(const v1::ParallelConfig& c);
/// `dp_shard` with 0 read as `dp` (HSDP shard group size in dp ranks).
int DpShardOf(const v1::ParallelConfig& c);

/// tp * cp * dp * pp: the number of ranks (docs/partitioning.md, "Ranks").
/// The one world-size rule; the coordinator, the agent and the CLI use it.
int64_t WorldSize(const v1::ParallelConfig& c);

}  // namespace reshard::planner
