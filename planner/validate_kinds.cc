#include <algorithm>
#include <cstdint>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "planner/layout.h"
#include "planner/shard.h"
#include "planner/validate.h"
#include "planner/validate_internal.h"

namespace reshard::planner::internal {
namespace {

// A block of fewer units than tp ranks must divide them (units and
// replication).
absl::Status CheckUnits(const v1::TensorSpec& t, const v1::ParallelConfig& c,
                        absl::string_view what) {
  const v1::TensorParallel& tp = t.partition().tp();
  if (tp.mode() != v1::TP_SPLIT || tp.granularity() == 0) return absl::OkStatus();
  const bool expert = t.partition().has_expert();
  const int size = expert ? ExpertTpOf(c) : c.tp();
  const int64_t u = std::max<int64_t>(tp.granularity(), 1);
  std::vector<int64_t> blocks(tp.blocks().begin(), tp.blocks().end());
  if (blocks.empty()) blocks.push_back(HeldShape(t, size)[tp.axis()]);
  for (size_t j = 0; j < blocks.size(); ++j) {
    const int64_t n = blocks[j] / u;
    if (n < size && size % n != 0) {
      return TensorError(
          t, absl::StrCat("partition.tp.blocks[", j, "] has ", n, " units of ", u, ", fewer than ",
                          what, expert ? ".config.expert_tp " : ".config.tp ", size,
                          " and not dividing it (t % n_j must be 0 to replicate units)"));
    }
  }
  return absl::OkStatus();
}

// The held shape of a padded tensor stays within the element limit.
absl::Status CheckHeldShape(const v1::TensorSpec& t, const v1::ParallelConfig& c,
                            absl::string_view what) {
  if (!t.partition().has_padding()) return absl::OkStatus();
  const int size = t.partition().has_expert() ? ExpertTpOf(c) : c.tp();
  const v1::AxisPadding& p = t.partition().padding();
  const int64_t m = p.multiple() * (p.times_tp() ? size : 1);  // <= 2^60
  int64_t held = t.shape(p.axis());
  int64_t elements = 1;
  const bool overflow = __builtin_add_overflow(held, m - 1, &held);
  held = overflow ? INT64_MAX : held / m * m;
  for (int d = 0; d < t.shape_size(); ++d) {
    if (__builtin_mul_overflow(elements, d == p.axis() ? held : t.shape(d), &elements)) {
      elements = INT64_MAX;
      break;
    }
  }
  if (overflow || elements > kMaxTensorElements) {
    return TensorError(t, absl::StrCat("partition.padding.multiple ", p.multiple(), " at ", what,
                                       ".config.tp ", size, " pads shape ", ShapeString(t),
                                       " beyond the limit of ", kMaxTensorElements, " elements"));
  }
  return absl::OkStatus();
}

// A holding rank left without elements, when the tensor forbids it.
absl::Status CheckNoEmptyRank(const v1::TensorSpec& t, const v1::ParallelConfig& c,
                              absl::string_view what) {
  const v1::DataParallel& dp = t.partition().dp();
  if (t.partition().allow_empty() || dp.mode() == v1::DP_BUCKET) return absl::OkStatus();
  const bool expert = t.partition().has_expert();
  ShardCoord sc;
  sc.tp = expert ? ExpertTpOf(c) : c.tp();
  sc.ep = expert ? EpOf(c) : 1;
  const int64_t stage = int64_t{c.tp()} * CpOf(c) * c.dp();
  // Dense tensors split over their shard group (docs/partitioning.md,
  // "Data-parallel groups"): dp_shard (x cp unless DP_OVER_DP).
  const bool dp_only = dp.over() == v1::DP_OVER_DP;
  sc.dp = static_cast<int>(expert ? stage / (int64_t{ExpertTpOf(c)} * EpOf(c))
                                  : int64_t{DpShardOf(c)} * (dp_only ? 1 : CpOf(c)));
  const bool hsdp = !expert && (dp_only || c.dp_shard() > 0);
  const std::string dp_name =
      expert ? "the expert data-parallel size "
             : (hsdp ? absl::StrCat("the shard group (dp_shard ", DpShardOf(c),
                                    dp_only ? ", partition.dp.over DP_OVER_DP) of "
                                            : absl::StrCat(" x cp ", CpOf(c), ") of "))
                     : std::string("dp * cp "));
  // Where the size comes from: `what.config.dp N` as before HSDP, else the
  // shard group.
  const std::string dp_field =
      hsdp ? absl::StrCat(what, ": ", dp_name) : absl::StrCat(what, ".config.dp ");
  for (sc.ep_index = 0; sc.ep_index < sc.ep; ++sc.ep_index) {
    for (sc.tp_index = 0; sc.tp_index < sc.tp; ++sc.tp_index) {
      const int i = sc.tp_index;
      const TpPiece piece = DeriveTpPiece(t, sc);
      int64_t n = 1;
      for (int64_t x : piece.local_shape) n *= x;
      if (n == 0 || piece.slabs.empty()) {
        if (expert) {
          return TensorError(t, absl::StrCat(what, ".config.ep ", sc.ep, " x expert_tp ", sc.tp,
                                             " leaves expert rank ", sc.ep_index, " tp rank ", i,
                                             " without elements of shape ", ShapeString(t),
                                             " (set partition.allow_empty to permit)"));
        }
        return TensorError(t, absl::StrCat(what, ".config.tp ", c.tp(), " leaves tp rank ", i,
                                           " without elements of shape ", ShapeString(t),
                                           " (set partition.allow_empty to permit)"));
      }
      if (sc.dp == 1 || dp.mode() == v1::DP_REPLICATED || dp.mode() == v1::DP_BUCKET) continue;
      if (t.partition().has_padding()) {
        // Exact: a data-parallel shard may hold padding only.
        for (sc.dp_index = 0; sc.dp_index < sc.dp; ++sc.dp_index) {
          if (DeriveCoordShard(t, sc).pieces.empty()) {
            return TensorError(t, absl::StrCat(what, ": ", dp_name, sc.dp, " leaves dp rank ",
                                               sc.dp_index, " of tp rank ", i,
                                               " with padding only (set partition.allow_empty "
                                               "to permit)"));
          }
        }
        sc.dp_index = 0;
        continue;
      }
      if (dp.mode() == v1::DP_SPLIT && piece.local_shape[dp.axis()] < sc.dp) {
        return TensorError(
            t, absl::StrCat(dp_field, sc.dp, " exceeds the ",
                            piece.local_shape[dp.axis()], " elements on partition.dp.axis ",
                            dp.axis(), " of tp rank ", i, "'s piece, leaving a dp rank empty",
                            " (set partition.allow_empty to permit)"));
      }
      const int64_t extent = dp.mode() == v1::DP_CHUNK ? piece.local_shape[dp.axis()] : n;
      if (dp.mode() == v1::DP_FLAT || dp.mode() == v1::DP_CHUNK) {
        const int64_t chunk = (extent + sc.dp - 1) / sc.dp;
        if (chunk * (sc.dp - 1) >= extent) {
          return TensorError(t, absl::StrCat(dp_field, sc.dp, " leaves a dp rank ",
                                             "without elements of tp rank ", i, "'s ", extent,
                                             dp.mode() == v1::DP_CHUNK ? "-long axis" : "-element",
                                             " piece (set partition.allow_empty to permit)"));
        }
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace

// Granularity, padding, experts and buckets (docs/partitioning.md).
absl::Status ValidateNewFields(const v1::TensorSpec& t, const v1::Ptc& ptc) {
  const int ndim = t.shape_size();
  const v1::PartitionSpec& ps = t.partition();
  const v1::TensorParallel& tp = ps.tp();
  if (tp.granularity() < 0) {
    return TensorError(
        t, absl::StrCat("partition.tp.granularity ", tp.granularity(), " must be >= 0"));
  }
  if (tp.mode() == v1::TP_SPLIT && tp.granularity() > 1) {
    const int64_t u = tp.granularity();
    if (tp.blocks_size() == 0 && t.shape(tp.axis()) % u != 0) {
      return TensorError(t, absl::StrCat("shape[", tp.axis(), "] ", t.shape(tp.axis()),
                                         " is not a multiple of partition.tp.granularity ", u));
    }
    for (int j = 0; j < tp.blocks_size(); ++j) {
      if (tp.blocks(j) % u != 0) {
        return TensorError(t, absl::StrCat("partition.tp.blocks[", j, "] ", tp.blocks(j),
                                           " is not a multiple of partition.tp.granularity ", u));
      }
    }
  }
  if (ps.has_padding()) {
    const v1::AxisPadding& p = ps.padding();
    if (p.axis() < 0 || p.axis() >= ndim) {
      return TensorError(t, absl::StrCat("partition.padding.axis ", p.axis(),
                                         " out of range for a rank-", ndim, " tensor"));
    }
    if (p.multiple() < 1) {
      return TensorError(
          t, absl::StrCat("partition.padding.multiple ", p.multiple(), " must be >= 1"));
    }
    if (p.multiple() > kMaxTensorElements) {
      return TensorError(t, absl::StrCat("partition.padding.multiple ", p.multiple(),
                                         " exceeds the limit of ", kMaxTensorElements));
    }
    if (tp.blocks_size() > 0) {
      return TensorError(
          t, absl::StrCat("partition.padding is set with partition.tp.blocks [",
                          absl::StrJoin(tp.blocks(), ", "), "]; padding needs empty blocks"));
    }
    if (tp.granularity() > 1) {
      return TensorError(t, absl::StrCat("partition.padding is set with partition.tp.granularity ",
                                         tp.granularity(), "; padding needs granularity <= 1"));
    }
  }
  if (ps.has_expert()) {
    const int axis = ps.expert().axis();
    if (axis < 0 || axis >= ndim) {
      return TensorError(t, absl::StrCat("partition.expert.axis ", axis,
                                         " out of range for a rank-", ndim, " tensor"));
    }
    if (ps.has_padding() && ps.padding().axis() == axis) {
      return TensorError(t, absl::StrCat("partition.padding.axis ", axis,
                                         " equals partition.expert.axis; an expert tensor pads "
                                         "another axis"));
    }
    if (tp.mode() == v1::TP_SPLIT && tp.axis() == axis) {
      return TensorError(t, absl::StrCat("partition.expert.axis ", axis,
                                         " equals partition.tp.axis; experts and tensor-parallel "
                                         "pieces must be cut on different axes"));
    }
  }
  if (ps.dp().mode() == v1::DP_BUCKET) {
    const std::string& name = ps.dp().bucket();
    const v1::BucketGroup* group = nullptr;
    for (const v1::BucketGroup& g : ptc.buckets()) {
      if (g.name() == name) group = &g;
    }
    if (group == nullptr) {
      return TensorError(
          t, absl::StrCat("partition.dp.bucket \"", name, "\" names no group of ptc.buckets"));
    }
  } else if (!ps.dp().bucket().empty()) {
    return TensorError(t, absl::StrCat("partition.dp.bucket \"", ps.dp().bucket(),
                                       "\" given but partition.dp.mode is not DP_BUCKET"));
  }
  return absl::OkStatus();
}

// Bucket groups: names, sizes, and members all dense or all expert.
absl::Status ValidateBuckets(const v1::Ptc& ptc) {
  absl::flat_hash_map<std::string, int> expert_member;  // group -> first member (-1: none)
  for (int i = 0; i < ptc.buckets_size(); ++i) {
    const v1::BucketGroup& g = ptc.buckets(i);
    const std::string field = absl::StrCat("ptc.buckets[", i, "]");
    if (g.name().empty()) return absl::InvalidArgumentError(field + ": name is empty");
    if (absl::Status s = CheckLength(field + ".name", g.name(), kMaxItemNameBytes); !s.ok()) {
      return s;
    }
    if (!expert_member.emplace(g.name(), -1).second) {
      return absl::InvalidArgumentError(
          absl::StrCat(field, " \"", g.name(), "\": duplicate bucket group name"));
    }
    // With these bounds no bucket position can overflow: at most 2^20
    // buckets padded to lcm(group size, pad_multiple) <= 2^40 each.
    for (auto [name, value, limit] :
         {std::tuple<const char*, int64_t, int64_t>{"param_align", g.param_align(), kMaxWorld},
          {"bucket_elements", g.bucket_elements(), kMaxTensorElements},
          {"pad_multiple", g.pad_multiple(), kMaxWorld}}) {
      if (value < 0 || value > limit) {
        return absl::InvalidArgumentError(absl::StrCat(field, " \"", g.name(), "\": ", name, " ",
                                                       value, " must be in [0, ", limit, "]"));
      }
    }
  }
  for (int i = 0; i < ptc.tensors_size(); ++i) {
    const v1::TensorSpec& t = ptc.tensors(i);
    if (t.partition().dp().mode() != v1::DP_BUCKET) continue;
    int& first = expert_member.at(t.partition().dp().bucket());
    if (first < 0) {
      first = i;
      continue;
    }
    const v1::TensorSpec& f = ptc.tensors(first);
    if (f.partition().has_expert() != t.partition().has_expert()) {
      return TensorError(
          t, absl::StrCat("partition.expert is ", t.partition().has_expert() ? "set" : "unset",
                          " but bucket group \"", t.partition().dp().bucket(), "\" already has ",
                          f.partition().has_expert() ? "expert" : "dense", " member \"", f.name(),
                          "\"; members are all dense or all expert"));
    }
  }
  return absl::OkStatus();
}

absl::Status CheckTensorUnderLayout(const v1::TensorSpec& t, const v1::ParallelConfig& c,
                                    absl::string_view what) {
  if (absl::Status s = CheckHeldShape(t, c, what); !s.ok()) return s;
  if (absl::Status s = CheckUnits(t, c, what); !s.ok()) return s;
  return CheckNoEmptyRank(t, c, what);
}

}  // namespace reshard::planner::internal
