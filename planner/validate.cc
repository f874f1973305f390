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
#include "planner/validate_internal.h"

namespace reshard::planner {
namespace {

using internal::kMaxWorld;
using internal::ShapeString;
using internal::TensorError;

// The dtype and shape: known, at most kMaxDims positive dimensions, within
// the per-tensor limits.
absl::Status CheckShape(const v1::TensorSpec& t) {
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
  return absl::OkStatus();
}

absl::Status CheckTensorParallel(const v1::TensorSpec& t) {
  const int ndim = t.shape_size();
  const v1::TensorParallel& tp = t.partition().tp();
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
  return absl::OkStatus();
}

absl::Status CheckPipeline(const v1::TensorSpec& t, int num_layers) {
  const v1::Pipeline& pl = t.partition().pipeline();
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
  return absl::OkStatus();
}

absl::Status CheckDataParallel(const v1::TensorSpec& t) {
  const int ndim = t.shape_size();
  const v1::PartitionSpec& ps = t.partition();
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
  if (dp.over() != v1::DP_OVER_DP_CP && dp.over() != v1::DP_OVER_DP) {
    return TensorError(t, absl::StrCat("partition.dp.over ", static_cast<int>(dp.over()),
                                       " is not a known DpOver"));
  }
  if (dp.over() == v1::DP_OVER_DP && (ps.has_expert() || dp.mode() == v1::DP_BUCKET)) {
    return TensorError(t, absl::StrCat("partition.dp.over DP_OVER_DP is not allowed ",
                                       ps.has_expert() ? "for an expert tensor"
                                                       : "for a DP_BUCKET member",
                                       " (it splits over dp x cp: DP_OVER_DP_CP)"));
  }
  return absl::OkStatus();
}

absl::Status ValidateTensor(const v1::TensorSpec& t, const v1::Ptc& ptc) {
  if (absl::Status s = CheckShape(t); !s.ok()) return s;
  if (absl::Status s = CheckTensorParallel(t); !s.ok()) return s;
  if (absl::Status s = CheckPipeline(t, ptc.num_layers()); !s.ok()) return s;
  if (absl::Status s = CheckDataParallel(t); !s.ok()) return s;
  return internal::ValidateNewFields(t, ptc);
}

}  // namespace

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
  return internal::ValidateBuckets(ptc);
}

namespace {

// The parallel degrees and rank order of a layout's config.
absl::Status CheckConfig(const v1::ParallelConfig& c, absl::string_view what) {
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
  if (c.dp_shard() < 0 || c.dp_shard() > c.dp() ||
      (c.dp_shard() > 0 && c.dp() % c.dp_shard() != 0)) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ".config.dp_shard is ", c.dp_shard(), "; it must divide dp ", c.dp(),
                     " (0 means dp: no HSDP replicas)"));
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
  return absl::OkStatus();
}

// Where each pipeline stage (or virtual chunk) starts: every stage owns at
// least one of the PTC's `layers` layers.
absl::Status CheckStageStarts(const v1::ParallelConfig& c, int layers, absl::string_view what) {
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
  return absl::OkStatus();
}

// The placement: one distinct, named (host, device) slot per rank.
absl::Status CheckPlacement(const v1::Placement& p, const v1::ParallelConfig& c,
                            absl::string_view what) {
  const int64_t world = int64_t{c.tp()} * c.pp() * c.dp() * CpOf(c);
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
  return absl::OkStatus();
}

}  // namespace

absl::Status ValidateLayout(const v1::Ptc& ptc, const v1::Layout& layout, absl::string_view what) {
  const v1::ParallelConfig& c = layout.config();
  if (absl::Status s = CheckConfig(c, what); !s.ok()) return s;
  if (absl::Status s = CheckStageStarts(c, ptc.num_layers(), what); !s.ok()) return s;
  if (absl::Status s = CheckPlacement(layout.placement(), c, what); !s.ok()) return s;
  absl::flat_hash_set<std::string> checked;  // tensors of one rule are checked once
  for (int i = 0; i < ptc.tensors_size(); ++i) {
    const v1::TensorSpec& t = ptc.tensors(i);
    if (!checked.insert(absl::StrCat(TemplateKey(t, i), "|", t.partition().allow_empty())).second) {
      continue;
    }
    if (absl::Status s = internal::CheckTensorUnderLayout(t, c, what); !s.ok()) return s;
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
