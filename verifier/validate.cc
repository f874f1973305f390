// Input validation of the tensors and bucket groups (docs/partitioning.md),
// where no layout is involved.
#include <algorithm>
#include <map>
#include <set>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "verifier/tensors.h"

namespace reshard::verifier {
namespace {

bool IsExpert(const v1::TensorSpec& t) { return t.partition().has_expert(); }
int64_t Unit(const v1::TensorSpec& t) {
  return std::max<int64_t>(1, t.partition().tp().granularity());
}

absl::Status Invalid(const v1::TensorSpec& t, const std::string& what) {
  return absl::InvalidArgumentError(absl::StrCat("tensor \"", t.name(), "\": ", what));
}

absl::Status CheckAxis(const v1::TensorSpec& t, const char* field, int axis) {
  if (axis >= 0 && axis < t.shape_size()) return absl::OkStatus();
  return Invalid(
      t, absl::StrCat(field, " ", axis, " out of range for a rank-", t.shape_size(), " tensor"));
}

absl::Status CheckTp(const v1::TensorSpec& t) {
  const auto& tp = t.partition().tp();
  if (tp.mode() == v1::TP_REPLICATED) return absl::OkStatus();
  if (tp.mode() != v1::TP_SPLIT) return Invalid(t, absl::StrCat("unknown tp mode ", tp.mode()));
  if (absl::Status s = CheckAxis(t, "tp axis", tp.axis()); !s.ok()) return s;
  if (tp.granularity() < 0 || tp.granularity() > kCap) {
    return Invalid(t, absl::StrCat("tp granularity ", tp.granularity()));
  }
  int64_t sum = 0;
  for (int64_t b : tp.blocks()) {
    if (b < 0 || b > kCap) return Invalid(t, absl::StrCat("tp block ", b));
    sum += b;
  }
  if (tp.blocks_size() > 0 && sum != t.shape(tp.axis())) {
    return Invalid(t, absl::StrCat("tp blocks sum to ", sum, ", shape[", tp.axis(), "] is ",
                                   t.shape(tp.axis())));
  }
  const std::vector<int64_t> blocks =
      tp.blocks_size() > 0 ? std::vector<int64_t>(tp.blocks().begin(), tp.blocks().end())
                           : std::vector<int64_t>{t.shape(tp.axis())};
  for (int64_t b : blocks) {
    if (b % Unit(t) != 0) {
      return Invalid(
          t, absl::StrCat("tp block ", b, " is not a multiple of granularity ", tp.granularity()));
    }
  }
  return absl::OkStatus();
}

absl::Status CheckPaddingAndExpert(const v1::TensorSpec& t) {
  const auto& p = t.partition();
  if (p.has_padding()) {
    if (absl::Status s = CheckAxis(t, "padding axis", p.padding().axis()); !s.ok()) return s;
    if (p.padding().multiple() < 1 || p.padding().multiple() > kCap) {
      return Invalid(t, absl::StrCat("padding multiple ", p.padding().multiple()));
    }
    if (p.tp().blocks_size() > 0 || p.tp().granularity() > 1) {
      return Invalid(t,
                     absl::StrCat("padding with tp blocks [", absl::StrJoin(p.tp().blocks(), ", "),
                                  "] and granularity ", p.tp().granularity()));
    }
  }
  if (p.has_expert()) {
    if (absl::Status s = CheckAxis(t, "expert axis", p.expert().axis()); !s.ok()) return s;
    if (p.tp().mode() == v1::TP_SPLIT && p.tp().axis() == p.expert().axis()) {
      return Invalid(t, absl::StrCat("tp axis ", p.tp().axis(), " is the expert axis"));
    }
    if (p.has_padding() && p.padding().axis() == p.expert().axis()) {
      return Invalid(t, absl::StrCat("padding axis ", p.padding().axis(), " is the expert axis"));
    }
  }
  return absl::OkStatus();
}

absl::Status CheckPipeline(const v1::TensorSpec& t, int num_layers) {
  const auto& p = t.partition().pipeline();
  switch (p.mode()) {
    case v1::PIPELINE_LAYER:
      if (p.layer() < 0 || p.layer() >= num_layers) {
        return Invalid(t, absl::StrCat("layer ", p.layer(), " outside [0, ", num_layers, ")"));
      }
      return absl::OkStatus();
    case v1::PIPELINE_LAYERS:
      if (p.layers_size() == 0) return Invalid(t, "PIPELINE_LAYERS with no layers");
      for (int layer : p.layers()) {
        if (layer < 0 || layer >= num_layers) {
          return Invalid(t, absl::StrCat("layers has ", layer, " outside [0, ", num_layers, ")"));
        }
      }
      return absl::OkStatus();
    case v1::PIPELINE_FIRST_STAGE:
    case v1::PIPELINE_LAST_STAGE:
    case v1::PIPELINE_EVERY_STAGE:
    case v1::PIPELINE_FIRST_AND_LAST_STAGE:
      return absl::OkStatus();
    default:
      return Invalid(t, absl::StrCat("pipeline mode ", p.mode(), " not allowed"));
  }
}

absl::Status CheckDp(const v1::Ptc& ptc, const v1::TensorSpec& t) {
  const auto& dp = t.partition().dp();
  if (dp.over() != v1::DP_OVER_DP_CP && dp.over() != v1::DP_OVER_DP) {
    return Invalid(t, absl::StrCat("unknown dp over ", dp.over()));
  }
  if (dp.over() == v1::DP_OVER_DP && (IsExpert(t) || dp.mode() == v1::DP_BUCKET)) {
    return Invalid(t, "dp over DP_OVER_DP on an expert tensor or a bucket member");
  }
  switch (dp.mode()) {
    case v1::DP_REPLICATED:
    case v1::DP_FLAT:
      return absl::OkStatus();
    case v1::DP_SPLIT:
    case v1::DP_CHUNK:
      return CheckAxis(t, "dp axis", dp.axis());
    case v1::DP_BUCKET:
      if (FindGroup(ptc, dp.bucket()) == nullptr) {
        return Invalid(t, absl::StrCat("dp bucket \"", dp.bucket(), "\" is not in Ptc.buckets"));
      }
      return absl::OkStatus();
    default:
      return Invalid(t, absl::StrCat("unknown dp mode ", dp.mode()));
  }
}

absl::Status CheckGroups(const v1::Ptc& ptc) {
  std::map<std::string, int> expert_members, dense_members;
  for (const auto& t : ptc.tensors()) {
    if (t.partition().dp().mode() != v1::DP_BUCKET) continue;
    ++(IsExpert(t) ? expert_members : dense_members)[t.partition().dp().bucket()];
  }
  std::set<std::string> names;
  for (const auto& b : ptc.buckets()) {
    const std::string who = absl::StrCat("bucket group \"", b.name(), "\"");
    if (b.name().empty() || !names.insert(b.name()).second) {
      return absl::InvalidArgumentError(absl::StrCat(who, ": name empty or repeated"));
    }
    for (auto [field, v] : {std::make_pair("param_align", b.param_align()),
                            std::make_pair("bucket_elements", b.bucket_elements()),
                            std::make_pair("pad_multiple", b.pad_multiple())}) {
      if (v < 0 || v > kCap) {
        return absl::InvalidArgumentError(absl::StrCat(who, ": ", field, " is ", v));
      }
    }
    if (expert_members[b.name()] > 0 && dense_members[b.name()] > 0) {
      return absl::InvalidArgumentError(absl::StrCat(who, ": has ", dense_members[b.name()],
                                                     " dense and ", expert_members[b.name()],
                                                     " expert members"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

int DTypeBytes(int dtype) {
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

absl::Status CheckPtcTensors(const v1::Ptc& ptc) {
  // A job holds some state: an empty PTC has nothing to lay out.
  if (ptc.tensors_size() == 0 && ptc.blobs_size() == 0) {
    return absl::InvalidArgumentError("the PTC holds no tensor and no blob");
  }
  for (const auto& t : ptc.tensors()) {
    if (DTypeBytes(t.dtype()) == 0) return Invalid(t, absl::StrCat("unknown dtype ", t.dtype()));
    for (int d = 0; d < t.shape_size(); ++d) {
      if (t.shape(d) < 0 || t.shape(d) > kCap) {
        return Invalid(t, absl::StrCat("shape[", d, "] is ", t.shape(d)));
      }
    }
    for (absl::Status s : {CheckTp(t), CheckPaddingAndExpert(t), CheckPipeline(t, ptc.num_layers()),
                           CheckDp(ptc, t)}) {
      if (!s.ok()) return s;
    }
  }
  return CheckGroups(ptc);
}

}  // namespace reshard::verifier
