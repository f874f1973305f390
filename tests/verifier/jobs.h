// Builders for the jobs and layouts of the verifier's tests.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "reshard/v1/plan.pb.h"
#include "reshard/v1/ptc.pb.h"

namespace reshard::verifier::testing {

/// Appends a tensor held by every stage, tp- and dp-replicated.
inline v1::TensorSpec* AddTensor(v1::Ptc* ptc, const std::string& name, std::vector<int64_t> shape,
                                 v1::DType dtype = v1::DTYPE_FLOAT32) {
  v1::TensorSpec* t = ptc->add_tensors();
  t->set_name(name);
  t->set_dtype(dtype);
  for (int64_t d : shape) t->add_shape(d);
  t->mutable_partition()->mutable_pipeline()->set_mode(v1::PIPELINE_EVERY_STAGE);
  return t;
}

inline void SetTpSplit(v1::TensorSpec* t, int axis, std::vector<int64_t> blocks = {}) {
  auto* tp = t->mutable_partition()->mutable_tp();
  tp->set_mode(v1::TP_SPLIT);
  tp->set_axis(axis);
  for (int64_t b : blocks) tp->add_blocks(b);
}

inline void SetPipeline(v1::TensorSpec* t, v1::PipelineMode mode, int layer = 0) {
  t->mutable_partition()->mutable_pipeline()->set_mode(mode);
  t->mutable_partition()->mutable_pipeline()->set_layer(layer);
}

inline void SetDp(v1::TensorSpec* t, v1::DpMode mode, int axis = 0) {
  t->mutable_partition()->mutable_dp()->set_mode(mode);
  t->mutable_partition()->mutable_dp()->set_axis(axis);
}

inline void AddBlob(v1::Ptc* ptc, const std::string& name, int64_t size, v1::BlobScope scope) {
  v1::BlobSpec* b = ptc->add_blobs();
  b->set_name(name);
  b->set_size_bytes(size);
  b->set_scope(scope);
}

/// (tp, pp, dp) with the compact placement `hosts` x `devices_per_host`.
inline v1::Layout Layout(int tp, int pp, int dp, std::vector<std::string> hosts,
                         int devices_per_host, std::vector<int> stage_starts = {},
                         v1::RankOrder order = v1::RANK_ORDER_TP_DP_PP) {
  v1::Layout l;
  l.mutable_config()->set_tp(tp);
  l.mutable_config()->set_pp(pp);
  l.mutable_config()->set_dp(dp);
  l.mutable_config()->set_order(order);
  for (int s : stage_starts) l.mutable_config()->add_stage_starts(s);
  for (auto& h : hosts) l.mutable_placement()->add_hosts(std::move(h));
  l.mutable_placement()->set_devices_per_host(devices_per_host);
  return l;
}

/// Host and device of `rank` in `layout` (either placement form).
inline std::pair<std::string, int> SlotOf(const v1::Layout& layout, int rank) {
  const auto& p = layout.placement();
  if (p.ranks_size() > 0) return {p.ranks(rank).host(), p.ranks(rank).device()};
  return {p.hosts(rank / p.devices_per_host()), rank % p.devices_per_host()};
}

/// Total bytes of the copies of a plan (each destination counted).
inline int64_t CopiedBytes(const v1::TransferPlan& plan) {
  int64_t n = 0;
  for (const auto& s : plan.steps()) n += s.bytes() * s.dsts_size();
  return n;
}

// ---- The kinds of issue 13 (docs/partitioning.md) ----

/// Unit granularity of a tp split (heads, query groups).
inline void SetGranularity(v1::TensorSpec* t, int64_t unit) {
  t->mutable_partition()->mutable_tp()->set_granularity(unit);
}

/// Axis padding: held extent rounded up to multiple (x tp when times_tp).
inline void SetPadding(v1::TensorSpec* t, int axis, int64_t multiple, bool times_tp) {
  auto* p = t->mutable_partition()->mutable_padding();
  p->set_axis(axis);
  p->set_multiple(multiple);
  p->set_times_tp(times_tp);
}

/// An expert tensor, experts stacked on `axis`.
inline void SetExpert(v1::TensorSpec* t, int axis) {
  t->mutable_partition()->mutable_expert()->set_axis(axis);
}

/// PIPELINE_LAYERS with `layers`.
inline void SetLayers(v1::TensorSpec* t, std::vector<int> layers) {
  auto* p = t->mutable_partition()->mutable_pipeline();
  p->set_mode(v1::PIPELINE_LAYERS);
  for (int l : layers) p->add_layers(l);
}

/// DP_BUCKET in the group `bucket`.
inline void SetBucket(v1::TensorSpec* t, const std::string& bucket) {
  t->mutable_partition()->mutable_dp()->set_mode(v1::DP_BUCKET);
  t->mutable_partition()->mutable_dp()->set_bucket(bucket);
}

inline v1::BucketGroup* AddGroup(v1::Ptc* ptc, const std::string& name, int64_t param_align,
                                 int64_t bucket_elements, int64_t pad_multiple,
                                 bool reverse_order = false) {
  v1::BucketGroup* g = ptc->add_buckets();
  g->set_name(name);
  g->set_param_align(param_align);
  g->set_bucket_elements(bucket_elements);
  g->set_pad_multiple(pad_multiple);
  g->set_reverse_order(reverse_order);
  return g;
}

/// The new parallel sizes of a layout (0 keeps the default).
struct Extra {
  int cp = 0, vpp = 0, ep = 0, expert_tp = 0;
};

inline v1::Layout With(v1::Layout l, Extra e) {
  l.mutable_config()->set_cp(e.cp);
  l.mutable_config()->set_vpp(e.vpp);
  l.mutable_config()->set_ep(e.ep);
  l.mutable_config()->set_expert_tp(e.expert_tp);
  return l;
}

}  // namespace reshard::verifier::testing
