// Builders of tensors, blobs, layouts and hosts, shared by every test suite.
// Header-only and protobuf-only (no gtest, gRPC or planner), so any test
// target that links reshard_proto may include it. The canned job specs built
// from these are in tests/support/jobs.h.
//
// One style throughout: a builder that creates returns the message (Tensor,
// MakeLayout, MakeHost) or a pointer to the element it appended (AddTensor,
// AddGroup); a setter takes the message by pointer and changes only the
// fields it names (SetTpSplit, SetDp, Place).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "reshard/v1/agent.pb.h"
#include "reshard/v1/ptc.pb.h"

namespace reshard::test_support {

// ---- Tensors and blobs ----

/// A tensor held as `pipeline` says (`layer` is the layer of PIPELINE_LAYER),
/// tp- and dp-replicated.
inline v1::TensorSpec Tensor(const std::string& name, const std::vector<int64_t>& shape,
                             v1::DType dtype = v1::DTYPE_FLOAT32,
                             v1::PipelineMode pipeline = v1::PIPELINE_EVERY_STAGE, int layer = 0) {
  v1::TensorSpec t;
  t.set_name(name);
  t.set_dtype(dtype);
  for (int64_t d : shape) t.add_shape(d);
  t.mutable_partition()->mutable_pipeline()->set_mode(pipeline);
  t.mutable_partition()->mutable_pipeline()->set_layer(layer);
  return t;
}

/// Appends Tensor(name, shape, dtype, pipeline, layer) to `ptc`.
inline v1::TensorSpec* AddTensor(v1::Ptc* ptc, const std::string& name,
                                 const std::vector<int64_t>& shape,
                                 v1::DType dtype = v1::DTYPE_FLOAT32,
                                 v1::PipelineMode pipeline = v1::PIPELINE_EVERY_STAGE,
                                 int layer = 0) {
  v1::TensorSpec* t = ptc->add_tensors();
  *t = Tensor(name, shape, dtype, pipeline, layer);
  return t;
}

/// TP_SPLIT on `axis`; `blocks` are the fused blocks of that axis (QKV).
inline void SetTpSplit(v1::TensorSpec* t, int axis, const std::vector<int64_t>& blocks = {}) {
  v1::TensorParallel* tp = t->mutable_partition()->mutable_tp();
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

// ---- The partition kinds of issue 13 (docs/partitioning.md) ----

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
inline void SetLayers(v1::TensorSpec* t, const std::vector<int>& layers) {
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

// ---- Layouts ----

/// Compact placement: `hosts` x `per_host` devices.
inline v1::Placement HostsPlacement(const std::vector<std::string>& hosts, int per_host) {
  v1::Placement p;
  for (const std::string& h : hosts) p.add_hosts(h);
  p.set_devices_per_host(per_host);
  return p;
}

inline v1::ParallelConfig Config(int tp, int pp, int dp) {
  v1::ParallelConfig c;
  c.set_tp(tp);
  c.set_pp(pp);
  c.set_dp(dp);
  return c;
}

/// tp x pp x dp in `order` (stages start at `stage_starts`, empty: even) on
/// the compact placement `hosts` x `per_host`.
inline v1::Layout MakeLayout(int tp, int pp, int dp, const std::vector<std::string>& hosts,
                             int per_host, const std::vector<int>& stage_starts = {},
                             v1::RankOrder order = v1::RANK_ORDER_TP_DP_PP) {
  v1::Layout l;
  *l.mutable_config() = Config(tp, pp, dp);
  l.mutable_config()->set_order(order);
  for (int s : stage_starts) l.mutable_config()->add_stage_starts(s);
  *l.mutable_placement() = HostsPlacement(hosts, per_host);
  return l;
}

/// tp x pp x dp on generated hosts "h<first_host>", "h<first_host + 1>", ..
/// with `per_host` devices each: the compact placement when `per_host`
/// divides the world, else one slot per rank (the last host partly used).
inline v1::Layout MakeLayoutOnHosts(int tp, int pp, int dp, int per_host, int first_host = 0,
                                    const std::vector<int>& stage_starts = {}) {
  v1::Layout l;
  *l.mutable_config() = Config(tp, pp, dp);
  for (int s : stage_starts) l.mutable_config()->add_stage_starts(s);
  const int world = tp * pp * dp;
  if (world % per_host == 0) {
    for (int h = 0; h < world / per_host; ++h) {
      l.mutable_placement()->add_hosts("h" + std::to_string(first_host + h));
    }
    l.mutable_placement()->set_devices_per_host(per_host);
    return l;
  }
  for (int r = 0; r < world; ++r) {
    v1::DeviceSlot* s = l.mutable_placement()->add_ranks();
    s->set_host("h" + std::to_string(first_host + r / per_host));
    s->set_device(r % per_host);
  }
  return l;
}

/// Replaces the placement of `l` by one slot per rank on hosts
/// "h<first_host>".. with `per_host` devices each, for its whole world (cp
/// included).
inline void Place(v1::Layout* l, int per_host, int first_host = 0) {
  const v1::ParallelConfig& c = l->config();
  const int world = c.tp() * c.pp() * c.dp() * (c.cp() > 0 ? c.cp() : 1);
  l->clear_placement();
  for (int r = 0; r < world; ++r) {
    v1::DeviceSlot* s = l->mutable_placement()->add_ranks();
    s->set_host("h" + std::to_string(first_host + r / per_host));
    s->set_device(r % per_host);
  }
}

/// An HSDP layout: tp x pp x dp in `order`, `dp_shard` dp ranks per shard
/// group (dp / dp_shard replicas), one slot per rank on hosts
/// "h<first_host>".. with `per_host` devices each.
inline v1::Layout HsdpLayout(int tp, int pp, int dp, int dp_shard, int per_host, int first_host = 0,
                             v1::RankOrder order = v1::RANK_ORDER_TP_DP_PP) {
  v1::Layout l;
  *l.mutable_config() = Config(tp, pp, dp);
  l.mutable_config()->set_dp_shard(dp_shard);
  l.mutable_config()->set_order(order);
  Place(&l, per_host, first_host);
  return l;
}

/// "host:device" of each rank of `l`, in rank order (either placement form:
/// one slot per rank, or hosts x devices_per_host).
inline std::vector<std::string> SlotsOf(const v1::Layout& l) {
  std::vector<std::string> out;
  const v1::Placement& p = l.placement();
  for (const v1::DeviceSlot& s : p.ranks())
    out.push_back(s.host() + ":" + std::to_string(s.device()));
  for (const std::string& h : p.hosts()) {
    for (int d = 0; d < p.devices_per_host(); ++d) out.push_back(h + ":" + std::to_string(d));
  }
  return out;
}

/// The parallel sizes of issue 13 (0 keeps the default).
struct Extra {
  int cp = 0, vpp = 0, ep = 0, expert_tp = 0;
};

/// `l` with the sizes of `e`.
inline v1::Layout With(v1::Layout l, Extra e) {
  l.mutable_config()->set_cp(e.cp);
  l.mutable_config()->set_vpp(e.vpp);
  l.mutable_config()->set_ep(e.ep);
  l.mutable_config()->set_expert_tp(e.expert_tp);
  return l;
}

// ---- Hosts ----

/// The shape of a registered host; the defaults are two 80 GiB H100s over UCX.
struct HostOptions {
  std::string address;  // empty: "<id>.cluster:7100"
  int devices = 2;
  std::string device_kind = "cuda";
  std::string device_name = "H100";
  int64_t device_memory_bytes = int64_t{80} << 30;
  std::vector<std::string> transports = {"ucx"};
  std::string ucx_address = std::string("\x00\x01\xfe\xff", 4);
  int64_t memory_limit_bytes = int64_t{512} << 30;
};

inline v1::Host MakeHost(const std::string& id, const HostOptions& o = {}) {
  v1::Host h;
  h.set_host_id(id);
  h.set_address(o.address.empty() ? id + ".cluster:7100" : o.address);
  for (int d = 0; d < o.devices; ++d) {
    v1::Device* dev = h.add_devices();
    dev->set_index(d);
    dev->set_kind(o.device_kind);
    dev->set_name(o.device_name);
    dev->set_memory_bytes(o.device_memory_bytes);
  }
  for (const std::string& t : o.transports) h.add_transports(t);
  h.set_ucx_address(o.ucx_address);
  h.set_memory_limit_bytes(o.memory_limit_bytes);
  return h;
}

}  // namespace reshard::test_support
