#include "planner/validate.h"

#include <algorithm>
#include <cstdint>
#include <set>
#include <string>
#include <tuple>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "planner/bucket.h"
#include "planner/geometry.h"
#include "planner/layout.h"
#include "planner/overlap.h"
#include "planner/shard.h"

namespace reshard::planner {
namespace {

// Upper bound on ranks in one layout: far beyond any cluster, small enough
// that rank arithmetic cannot overflow.
constexpr int64_t kMaxWorld = 1 << 20;

absl::Status TensorError(const v1::TensorSpec& t, absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat("tensor \"", t.name(), "\": ", what));
}

std::string ShapeString(const v1::TensorSpec& t) {
  return absl::StrCat("[", absl::StrJoin(t.shape(), ", "), "]");
}

absl::Status ValidateNewFields(const v1::TensorSpec& t, const v1::Ptc& ptc);

absl::Status ValidateTensor(const v1::TensorSpec& t, const v1::Ptc& ptc) {
  const int num_layers = ptc.num_layers();
  int64_t elements = 1;
  if (ElementBytes(t.dtype()) == 0) {
    return TensorError(
        t, absl::StrCat("dtype ", static_cast<int>(t.dtype()), " is not a known DType"));
  }
  const int ndim = t.shape_size();
  if (ndim == 0) return TensorError(t, "shape is empty (use [1] for a scalar)");
  if (ndim > kMaxDims) {
    return TensorError(t, absl::StrCat("shape ", ShapeString(t), " has ", ndim,
                                       " dimensions; at most ", kMaxDims, " are supported"));
  }
  int64_t bytes = ElementBytes(t.dtype());
  for (int d = 0; d < ndim; ++d) {
    if (t.shape(d) <= 0) {
      return TensorError(t, absl::StrCat("shape[", d, "] is ", t.shape(d), " in ", ShapeString(t),
                                         "; dimensions must be positive"));
    }
    if (__builtin_mul_overflow(bytes, t.shape(d), &bytes) ||
        __builtin_mul_overflow(elements, t.shape(d), &elements)) {
      return TensorError(t,
                         absl::StrCat("shape ", ShapeString(t), " overflows a 64-bit byte size"));
    }
  }
  if (elements > kMaxTensorElements) {
    return TensorError(t, absl::StrCat("shape ", ShapeString(t), " has ", elements,
                                       " elements; the limit is ", kMaxTensorElements));
  }
  if (bytes > kMaxTensorBytes) {
    return TensorError(t, absl::StrCat("shape ", ShapeString(t), " is ", bytes,
                                       " bytes; the limit is ", kMaxTensorBytes, " per tensor"));
  }
  const v1::PartitionSpec& ps = t.partition();
  const v1::TensorParallel& tp = ps.tp();
  switch (tp.mode()) {
    case v1::TP_REPLICATED:
      if (tp.blocks_size() > 0) {
        return TensorError(t, "partition.tp.blocks given but partition.tp.mode is TP_REPLICATED");
      }
      break;
    case v1::TP_SPLIT: {
      if (tp.axis() < 0 || tp.axis() >= ndim) {
        return TensorError(t, absl::StrCat("partition.tp.axis ", tp.axis(),
                                           " out of range for a rank-", ndim, " tensor"));
      }
      if (tp.blocks_size() > kMaxTpBlocks) {
        return TensorError(t, absl::StrCat("partition.tp.blocks has ", tp.blocks_size(),
                                           " entries; the limit is ", kMaxTpBlocks));
      }
      if (tp.blocks_size() > 0) {
        int64_t sum = 0;
        for (int j = 0; j < tp.blocks_size(); ++j) {
          if (tp.blocks(j) <= 0) {
            return TensorError(t, absl::StrCat("partition.tp.blocks[", j, "] is ", tp.blocks(j),
                                               "; blocks must be positive"));
          }
          if (__builtin_add_overflow(sum, tp.blocks(j), &sum)) sum = INT64_MAX;
        }
        if (sum != t.shape(tp.axis())) {
          return TensorError(
              t,
              absl::StrCat("partition.tp.blocks [", absl::StrJoin(tp.blocks(), ", "), "] sum to ",
                           sum, " but shape[", tp.axis(), "] is ", t.shape(tp.axis())));
        }
      }
      break;
    }
    default:
      return TensorError(t, absl::StrCat("partition.tp.mode ", static_cast<int>(tp.mode()),
                                         " is not a known TpMode"));
  }
  const v1::Pipeline& pl = ps.pipeline();
  switch (pl.mode()) {
    case v1::PIPELINE_LAYER:
      if (pl.layer() < 0 || pl.layer() >= num_layers) {
        return TensorError(t, absl::StrCat("partition.pipeline.layer ", pl.layer(),
                                           " is beyond the layer count ", num_layers));
      }
      break;
    case v1::PIPELINE_FIRST_STAGE:
    case v1::PIPELINE_LAST_STAGE:
    case v1::PIPELINE_EVERY_STAGE:
    case v1::PIPELINE_FIRST_AND_LAST_STAGE:
      break;
    case v1::PIPELINE_LAYERS:
      if (pl.layers_size() == 0) {
        return TensorError(t, "partition.pipeline.layers is empty; PIPELINE_LAYERS needs a layer");
      }
      for (int j = 0; j < pl.layers_size(); ++j) {
        if (pl.layers(j) < 0 || pl.layers(j) >= num_layers) {
          return TensorError(t, absl::StrCat("partition.pipeline.layers[", j, "] ", pl.layers(j),
                                             " is outside [0, ", num_layers, ")"));
        }
      }
      break;
    case v1::PIPELINE_UNSPECIFIED:
      return TensorError(t,
                         "partition.pipeline.mode is unspecified (PIPELINE_LAYER, "
                         "PIPELINE_FIRST_STAGE, PIPELINE_LAST_STAGE, PIPELINE_EVERY_STAGE, "
                         "PIPELINE_FIRST_AND_LAST_STAGE or PIPELINE_LAYERS)");
    default:
      return TensorError(t, absl::StrCat("partition.pipeline.mode ", static_cast<int>(pl.mode()),
                                         " is not a known PipelineMode"));
  }
  const v1::DataParallel& dp = ps.dp();
  switch (dp.mode()) {
    case v1::DP_REPLICATED:
    case v1::DP_FLAT:
      break;
    case v1::DP_SPLIT:
    case v1::DP_CHUNK:
      if (dp.axis() < 0 || dp.axis() >= ndim) {
        return TensorError(t, absl::StrCat("partition.dp.axis ", dp.axis(),
                                           " out of range for a rank-", ndim, " tensor"));
      }
      break;
    case v1::DP_BUCKET:
      break;
    default:
      return TensorError(t, absl::StrCat("partition.dp.mode ", static_cast<int>(dp.mode()),
                                         " is not a known DpMode"));
  }
  return ValidateNewFields(t, ptc);
}

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
  sc.dp = static_cast<int>(expert ? stage / (int64_t{ExpertTpOf(c)} * EpOf(c)) : stage / c.tp());
  const char* dp_name = expert ? "the expert data-parallel size " : "dp * cp ";
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
            t, absl::StrCat(what, ".config.dp ", sc.dp, " exceeds the ",
                            piece.local_shape[dp.axis()], " elements on partition.dp.axis ",
                            dp.axis(), " of tp rank ", i, "'s piece, leaving a dp rank empty",
                            " (set partition.allow_empty to permit)"));
      }
      const int64_t extent = dp.mode() == v1::DP_CHUNK ? piece.local_shape[dp.axis()] : n;
      if (dp.mode() == v1::DP_FLAT || dp.mode() == v1::DP_CHUNK) {
        const int64_t chunk = (extent + sc.dp - 1) / sc.dp;
        if (chunk * (sc.dp - 1) >= extent) {
          return TensorError(t, absl::StrCat(what, ".config.dp ", sc.dp, " leaves a dp rank ",
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

absl::Status CheckLength(absl::string_view field, absl::string_view value, int64_t limit) {
  if (static_cast<int64_t>(value.size()) <= limit) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(field, " \"", value.substr(0, 64), "...\" is ",
                                                 value.size(), " bytes; the limit is ", limit,
                                                 " bytes"));
}

int ElementBytes(v1::DType dtype) {
  switch (dtype) {
    case v1::DTYPE_FLOAT64:
    case v1::DTYPE_INT64:
      return 8;
    case v1::DTYPE_FLOAT32:
    case v1::DTYPE_INT32:
      return 4;
    case v1::DTYPE_FLOAT16:
    case v1::DTYPE_BFLOAT16:
    case v1::DTYPE_INT16:
      return 2;
    case v1::DTYPE_FLOAT8_E4M3:
    case v1::DTYPE_FLOAT8_E5M2:
    case v1::DTYPE_INT8:
    case v1::DTYPE_UINT8:
    case v1::DTYPE_BOOL:
      return 1;
    default:
      return 0;
  }
}

absl::Status ValidatePtc(const v1::Ptc& ptc) {
  if (ptc.num_layers() < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("ptc.num_layers is ", ptc.num_layers(), "; it must be >= 0"));
  }
  if (ptc.num_layers() > kMaxLayers) {
    return absl::InvalidArgumentError(
        absl::StrCat("ptc.num_layers is ", ptc.num_layers(), "; the limit is ", kMaxLayers));
  }
  if (ptc.tensors_size() == 0 && ptc.blobs_size() == 0) {
    return absl::InvalidArgumentError("ptc has no tensors and no blobs");
  }
  if (ptc.tensors_size() > kMaxTensors) {
    return absl::InvalidArgumentError(
        absl::StrCat("ptc has ", ptc.tensors_size(), " tensors; the limit is ", kMaxTensors));
  }
  if (ptc.blobs_size() > kMaxBlobs) {
    return absl::InvalidArgumentError(
        absl::StrCat("ptc has ", ptc.blobs_size(), " blobs; the limit is ", kMaxBlobs));
  }
  if (ptc.buckets_size() > kMaxTensors) {
    return absl::InvalidArgumentError(
        absl::StrCat("ptc has ", ptc.buckets_size(), " buckets; the limit is ", kMaxTensors));
  }
  absl::flat_hash_set<std::string> names;
  int64_t total = 0;
  for (int i = 0; i < ptc.tensors_size(); ++i) {
    const v1::TensorSpec& t = ptc.tensors(i);
    if (t.name().empty()) {
      return absl::InvalidArgumentError(absl::StrCat("ptc.tensors[", i, "]: name is empty"));
    }
    if (absl::Status s =
            CheckLength(absl::StrCat("ptc.tensors[", i, "].name"), t.name(), kMaxItemNameBytes);
        !s.ok()) {
      return s;
    }
    if (!names.insert(t.name()).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("tensor \"", t.name(), "\": duplicate name (ptc.tensors[", i, "])"));
    }
    if (absl::Status s = ValidateTensor(t, ptc); !s.ok()) return s;
    int64_t bytes = ElementBytes(t.dtype());
    for (int64_t d : t.shape()) bytes *= d;  // checked above
    total += bytes;                          // both at most 2^50 here
    if (total > kMaxJobBytes) {
      return TensorError(t, absl::StrCat("the PTC's total reaches ", total,
                                         " bytes here; the limit is ", kMaxJobBytes, " per job"));
    }
  }
  for (int i = 0; i < ptc.blobs_size(); ++i) {
    const v1::BlobSpec& b = ptc.blobs(i);
    if (b.name().empty()) {
      return absl::InvalidArgumentError(absl::StrCat("ptc.blobs[", i, "]: name is empty"));
    }
    if (absl::Status s =
            CheckLength(absl::StrCat("ptc.blobs[", i, "].name"), b.name(), kMaxItemNameBytes);
        !s.ok()) {
      return s;
    }
    if (!names.insert(b.name()).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("blob \"", b.name(), "\": duplicate name (ptc.blobs[", i, "])"));
    }
    if (b.size_bytes() <= 0) {
      return absl::InvalidArgumentError(absl::StrCat("blob \"", b.name(), "\": size_bytes ",
                                                     b.size_bytes(), " must be positive"));
    }
    if (b.size_bytes() > kMaxBlobBytes) {
      return absl::InvalidArgumentError(absl::StrCat("blob \"", b.name(), "\": size_bytes ",
                                                     b.size_bytes(), " exceeds the limit of ",
                                                     kMaxBlobBytes, " bytes per blob"));
    }
    total += b.size_bytes();  // both at most 2^50 here
    if (total > kMaxJobBytes) {
      return absl::InvalidArgumentError(
          absl::StrCat("blob \"", b.name(), "\": the PTC's total reaches ", total,
                       " bytes here; the limit is ", kMaxJobBytes, " per job"));
    }
    if (b.scope() != v1::BLOB_REPLICATED && b.scope() != v1::BLOB_PER_RANK) {
      return absl::InvalidArgumentError(absl::StrCat("blob \"", b.name(), "\": scope ",
                                                     static_cast<int>(b.scope()),
                                                     " is not a known BlobScope"));
    }
  }
  return ValidateBuckets(ptc);
}

absl::Status ValidateLayout(const v1::Ptc& ptc, const v1::Layout& layout, absl::string_view what) {
  const v1::ParallelConfig& c = layout.config();
  for (auto [name, value] :
       {std::pair<const char*, int>{"tp", c.tp()}, {"pp", c.pp()}, {"dp", c.dp()}}) {
    if (value < 1) {
      return absl::InvalidArgumentError(
          absl::StrCat(what, ".config.", name, " is ", value, "; it must be >= 1"));
    }
  }
  for (auto [name, value] : {std::pair<const char*, int>{"cp", c.cp()},
                             {"vpp", c.vpp()},
                             {"ep", c.ep()},
                             {"expert_tp", c.expert_tp()}}) {
    if (value < 0 || value > kMaxWorld) {
      return absl::InvalidArgumentError(absl::StrCat(what, ".config.", name, " is ", value,
                                                     "; it must be >= 0 (0 means the default)"));
    }
  }
  const int64_t world = int64_t{c.tp()} * c.pp() * c.dp() * CpOf(c);
  if (world > kMaxWorld) {
    return absl::InvalidArgumentError(absl::StrCat(what, ".config: tp*cp*dp*pp = ", world,
                                                   " exceeds the limit of ", kMaxWorld, " ranks"));
  }
  const int64_t stage_size = int64_t{c.tp()} * CpOf(c) * c.dp();
  const int64_t expert_size = int64_t{ExpertTpOf(c)} * EpOf(c);
  if (stage_size % expert_size != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, ".config: tp*cp*dp = ", stage_size,
        " is not a multiple of expert_tp*ep = ", ExpertTpOf(c), "*", EpOf(c), " = ", expert_size));
  }
  if (c.order() != v1::RANK_ORDER_TP_DP_PP && c.order() != v1::RANK_ORDER_TP_PP_DP) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, ".config.order ", static_cast<int>(c.order()), " is not a known RankOrder"));
  }
  const int layers = ptc.num_layers();
  const int64_t chunks = int64_t{c.pp()} * VppOf(c);
  if (c.stage_starts_size() > 0) {
    if (c.stage_starts_size() != chunks) {
      return absl::InvalidArgumentError(
          VppOf(c) > 1
              ? absl::StrCat(what, ".config.stage_starts has ", c.stage_starts_size(),
                             " entries but pp*vpp is ", c.pp(), "*", VppOf(c), " = ", chunks)
              : absl::StrCat(what, ".config.stage_starts has ", c.stage_starts_size(),
                             " entries but pp is ", c.pp()));
    }
    if (c.stage_starts(0) != 0) {
      return absl::InvalidArgumentError(absl::StrCat(what, ".config.stage_starts[0] is ",
                                                     c.stage_starts(0),
                                                     "; the first stage must start at layer 0"));
    }
    for (int s = 1; s < chunks; ++s) {
      if (c.stage_starts(s) <= c.stage_starts(s - 1) || c.stage_starts(s) >= layers) {
        return absl::InvalidArgumentError(
            absl::StrCat(what, ".config.stage_starts[", s, "] is ", c.stage_starts(s),
                         "; stage starts must increase strictly and stay below num_layers ", layers,
                         " so that every stage owns at least one layer"));
      }
    }
  } else if (c.pp() > 1 && c.pp() > layers) {
    return absl::InvalidArgumentError(absl::StrCat(what, ".config.pp ", c.pp(),
                                                   " exceeds num_layers ", layers,
                                                   ": some stage would own no layer"));
  }
  const v1::Placement& p = layout.placement();
  if (p.ranks_size() > 0 && (p.hosts_size() > 0 || p.devices_per_host() != 0)) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ".placement: give either ranks or hosts + devices_per_host, not both"));
  }
  if (p.ranks_size() == 0) {
    if (p.devices_per_host() < 1) {
      return absl::InvalidArgumentError(absl::StrCat(what, ".placement.devices_per_host is ",
                                                     p.devices_per_host(),
                                                     "; it must be >= 1 (or give ranks)"));
    }
    if (int64_t{p.hosts_size()} * p.devices_per_host() != world) {
      return absl::InvalidArgumentError(
          absl::StrCat(what, ".placement has ", p.hosts_size(), " hosts x ", p.devices_per_host(),
                       " devices = ", int64_t{p.hosts_size()} * p.devices_per_host(), " slots but ",
                       CpOf(c) > 1 ? "tp*cp*dp*pp" : "tp*pp*dp", " = ", world));
    }
  } else if (p.ranks_size() != world) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, ".placement has ", p.ranks_size(), " ranks but ",
        CpOf(c) > 1 ? absl::StrCat("tp*cp*dp*pp = ", c.tp(), "*", CpOf(c), "*", c.dp(), "*", c.pp())
                    : absl::StrCat("tp*pp*dp = ", c.tp(), "*", c.pp(), "*", c.dp()),
        " = ", world));
  }
  const std::vector<v1::DeviceSlot> slots = ExpandPlacement(p);
  absl::flat_hash_map<std::pair<std::string, int>, int> seen;
  for (size_t r = 0; r < slots.size(); ++r) {
    if (slots[r].host().empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat(what, ".placement: rank ", r, " has an empty host name"));
    }
    if (absl::Status s = CheckLength(absl::StrCat(what, ".placement: rank ", r, " host"),
                                     slots[r].host(), kMaxIdBytes);
        !s.ok()) {
      return s;
    }
    if (slots[r].device() < 0) {
      return absl::InvalidArgumentError(absl::StrCat(what, ".placement: rank ", r, " device ",
                                                     slots[r].device(), " is negative"));
    }
    auto [it, inserted] =
        seen.emplace(std::make_pair(slots[r].host(), slots[r].device()), static_cast<int>(r));
    if (!inserted) {
      return absl::InvalidArgumentError(absl::StrCat(what, ".placement: ranks ", it->second,
                                                     " and ", r, " share host \"", slots[r].host(),
                                                     "\" device ", slots[r].device()));
    }
  }
  absl::flat_hash_set<std::string> checked;  // tensors of one rule are checked once
  for (int i = 0; i < ptc.tensors_size(); ++i) {
    const v1::TensorSpec& t = ptc.tensors(i);
    if (!checked.insert(absl::StrCat(TemplateKey(t, i), "|", t.partition().allow_empty())).second) {
      continue;
    }
    if (absl::Status s = CheckHeldShape(t, c, what); !s.ok()) return s;
    if (absl::Status s = CheckUnits(t, c, what); !s.ok()) return s;
    if (absl::Status s = CheckNoEmptyRank(t, c, what); !s.ok()) return s;
  }
  return absl::OkStatus();
}

absl::Status ValidateJobSpec(const v1::JobSpec& spec) {
  if (spec.name().empty()) return absl::InvalidArgumentError("job name is empty");
  if (absl::Status s = CheckLength("job name", spec.name(), kMaxIdBytes); !s.ok()) return s;
  if (absl::Status s = CheckLength("tenant", spec.tenant(), kMaxIdBytes); !s.ok()) return s;
  if (absl::Status s = ValidatePtc(spec.ptc()); !s.ok()) return s;
  return ValidateLayout(spec.ptc(), spec.layout(), "layout");
}

absl::StatusOr<std::vector<HostBytes>> BytesPerHost(const v1::Ptc& ptc, const v1::Layout& layout) {
  HostTable table;
  const ResolvedLayout rl = ResolvedLayout::Resolve(layout, ptc.num_layers(), &table);
  std::vector<int64_t> per_host(table.size(), 0);
  std::vector<int64_t> per_rank(rl.world(), 0);
  const auto add = [&](int rank, int64_t bytes) -> bool {
    return !__builtin_add_overflow(per_rank[rank], bytes, &per_rank[rank]);
  };
  const Buckets buckets(ptc, rl);
  std::vector<int> stages;
  std::vector<int64_t> position_bytes;  // [stage_size]: the same on every stage
  absl::flat_hash_map<std::tuple<int, int, int>, int64_t> derived;
  for (int ti = 0; ti < ptc.tensors_size(); ++ti) {
    const v1::TensorSpec& t = ptc.tensors(ti);
    rl.StagesHolding(t.partition().pipeline(), &stages);
    const v1::DpMode mode = t.partition().dp().mode();
    const int64_t ebytes = ElementBytes(t.dtype());
    if (mode != v1::DP_BUCKET) {
      derived.clear();
      position_bytes.assign(rl.stage_size(), 0);
      for (int l = 0; l < rl.stage_size(); ++l) {
        const ShardCoord c = CoordOfRank(t, rl, rl.CoordAt(l, 0));
        const bool by_dp = mode != v1::DP_REPLICATED && c.dp > 1;
        auto [it, inserted] =
            derived.try_emplace(std::make_tuple(c.tp_index, c.ep_index, by_dp ? c.dp_index : 0));
        if (inserted) it->second = DeriveCoordShard(t, c).local_elements * ebytes;
        position_bytes[l] = it->second;
      }
    }
    for (int stage : stages) {
      for (int l = 0; l < rl.stage_size(); ++l) {
        int64_t bytes = 0;
        if (mode == v1::DP_BUCKET) {
          ShardCoord c = CoordOfRank(t, rl, rl.CoordAt(l, stage));
          buckets.Range(ti, stage, &c);
          bytes = (c.flat_end - c.flat_begin) * ebytes;
        } else {
          bytes = position_bytes[l];
        }
        const int rank = rl.RankAt(l, stage);
        if (!add(rank, bytes)) {
          return absl::InvalidArgumentError(absl::StrCat(
              "rank ", rank, "'s bytes overflow 64 bits at tensor \"", t.name(), "\""));
        }
      }
    }
  }
  for (int rank = 0; rank < rl.world(); ++rank) {
    for (const v1::BlobSpec& b : ptc.blobs()) {
      if (!add(rank, b.size_bytes())) {
        return absl::InvalidArgumentError(
            absl::StrCat("rank ", rank, "'s bytes overflow 64 bits at blob \"", b.name(), "\""));
      }
    }
    int64_t& host = per_host[rl.host(rank)];
    if (__builtin_add_overflow(host, per_rank[rank], &host)) {
      return absl::InvalidArgumentError(absl::StrCat("host \"", table.Name(rl.host(rank)),
                                                     "\": its ranks' bytes overflow 64 bits"));
    }
  }
  std::vector<HostBytes> out;
  out.reserve(per_host.size());
  for (int h = 0; h < table.size(); ++h) out.push_back(HostBytes{table.Name(h), per_host[h]});
  return out;
}

}  // namespace reshard::planner
