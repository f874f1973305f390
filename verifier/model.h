// The verifier's element-level model of a job in two layouts: for every item
// and every old and new rank, the global element id at each position of the
// rank's local buffer. Written from docs/partitioning.md alone; it shares no
// code with the planner. Pure; thread-safe (no shared state).
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "reshard/v1/ptc.pb.h"

namespace reshard::verifier {

/// Id stored at a padding position of a buffer.
inline constexpr int64_t kPadding = -1;

/// The model refuses inputs with more elements than this (buffers of both
/// layouts plus the element ids of every item): it is a tool for small shapes.
inline constexpr int64_t kMaxModelElements = 50'000'000;

/// One layout: its parallel config and where each rank sits.
struct RankGrid {
  int tp = 1, pp = 1, dp = 1, world = 1;
  int cp = 1, vpp = 1, ep = 1, expert_tp = 1;  // 0 in the config already resolved
  int edp = 1;                                 // tp * cp * dp / (expert_tp * ep)
  int dp_shard = 1;                            // dp ranks per HSDP shard group (0 resolved: dp)
  v1::RankOrder order = v1::RANK_ORDER_TP_DP_PP;
  /// pp * vpp + 1 entries; chunk c owns layers [chunk_begin[c], chunk_begin[c+1])
  /// and is held by stage c % pp.
  std::vector<int64_t> chunk_begin;
  std::vector<int> host;    // per rank: index into Model::hosts
  std::vector<int> device;  // per rank
};

/// One item (tensor or blob) of the plan.
struct ModelItem {
  std::string name;
  bool is_blob = false;
  bool per_rank_blob = false;
  bool regenerable = false;  // blobs only
  int element_bytes = 1;
  std::vector<int64_t> shape;  // tensors: global shape; blobs: {size_bytes}
  int64_t num_ids = 0;         // element ids are 0 .. num_ids - 1
  /// Per old rank: the element id at each buffer position (kPadding for
  /// padding); empty when the rank holds nothing of the item.
  std::vector<std::vector<int64_t>> old_buffers;
  /// Per new rank: what its buffer must hold after the plan ran.
  std::vector<std::vector<int64_t>> new_buffers;
  /// Surviving old ranks holding element id e:
  /// holder_ranks[holder_begin[e] .. holder_begin[e + 1]).
  std::vector<int64_t> holder_begin;
  std::vector<int> holder_ranks;
};

struct Model {
  std::vector<std::string> hosts;  // every host of either placement, or lost
  RankGrid from, to;
  std::vector<bool> old_lost;   // per old rank: named lost or on a lost host
  std::vector<int> lost_ranks;  // the lost old ranks, ascending
  /// Per new rank: the surviving old rank on the same (host, device), or -1.
  std::vector<int> same_device_old;
  std::vector<ModelItem> items;  // tensors in order, then blobs in order
  /// (new rank, item) of every regenerable blob whose value has no surviving
  /// holder, ascending by rank then item: TransferPlan.regenerate. Their new
  /// buffers are all padding (zero-filled).
  std::vector<std::pair<int, int>> regenerate;
};

/// Validates the inputs (InvalidArgument naming the field and value) and
/// builds the model. InvalidArgument as well when the shapes are too large.
[[nodiscard]] absl::StatusOr<Model> BuildModel(const v1::Ptc& ptc, const v1::Layout& from,
                                               const v1::Layout& to,
                                               const std::vector<std::string>& lost_hosts,
                                               const std::vector<int>& lost_ranks);

/// Whether surviving old rank `rank` holds element `id` of `item`.
bool HolderIs(const ModelItem& item, int64_t id, int rank);

/// Whether some surviving old rank on host `host` holds element `id`.
bool HeldOnHost(const Model& model, const ModelItem& item, int64_t id, int host);

/// Human-readable name of element `id` of `item` ("[2, 5]", "byte 3 of old
/// rank 1's value", "padding").
std::string DescribeElement(const ModelItem& item, int64_t id);

}  // namespace reshard::verifier
