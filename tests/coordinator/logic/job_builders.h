// Small job specs and layouts for the logic tests: a 2-layer model whose
// tensors use every partition rule (fused tp blocks, pipeline stages, DP
// split and DP flat) and both blob scopes, so plans have cross-host steps,
// local steps and zero fills.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "reshard/v1/ptc.pb.h"

namespace reshard::coordinator::testing {

inline v1::TensorSpec Tensor(const std::string& name, std::vector<int64_t> shape,
                             v1::PipelineMode pipeline, int layer = 0) {
  v1::TensorSpec t;
  t.set_name(name);
  t.set_dtype(v1::DTYPE_FLOAT32);
  for (int64_t d : shape) t.add_shape(d);
  t.mutable_partition()->mutable_pipeline()->set_mode(pipeline);
  t.mutable_partition()->mutable_pipeline()->set_layer(layer);
  return t;
}

inline v1::TensorSpec TpSplit(v1::TensorSpec t, int axis, std::vector<int64_t> blocks = {}) {
  t.mutable_partition()->mutable_tp()->set_mode(v1::TP_SPLIT);
  t.mutable_partition()->mutable_tp()->set_axis(axis);
  for (int64_t b : blocks) t.mutable_partition()->mutable_tp()->add_blocks(b);
  return t;
}

inline v1::TensorSpec Dp(v1::TensorSpec t, v1::DpMode mode, int axis = 0) {
  t.mutable_partition()->mutable_dp()->set_mode(mode);
  t.mutable_partition()->mutable_dp()->set_axis(axis);
  return t;
}

/// `hosts` x `per_host` devices.
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

inline v1::Layout MakeLayout(int tp, int pp, int dp, const std::vector<std::string>& hosts,
                             int per_host) {
  v1::Layout l;
  *l.mutable_config() = Config(tp, pp, dp);
  *l.mutable_placement() = HostsPlacement(hosts, per_host);
  return l;
}

inline v1::Ptc SmallPtc() {
  v1::Ptc ptc;
  ptc.set_num_layers(2);
  *ptc.add_tensors() = TpSplit(Tensor("embed", {32, 8}, v1::PIPELINE_FIRST_STAGE), 0);
  for (int layer = 0; layer < 2; ++layer) {
    const std::string p = "layers." + std::to_string(layer) + ".";
    *ptc.add_tensors() =
        TpSplit(Tensor(p + "qkv", {8, 24}, v1::PIPELINE_LAYER, layer), 1, {8, 8, 8});
    *ptc.add_tensors() = TpSplit(Tensor(p + "proj", {8, 8}, v1::PIPELINE_LAYER, layer), 0);
    *ptc.add_tensors() = Dp(Tensor(p + "norm", {8}, v1::PIPELINE_LAYER, layer), v1::DP_SPLIT, 0);
    // 7x3 = 21 elements: a DP_FLAT split over 2 leaves one padding element.
    *ptc.add_tensors() =
        Dp(Tensor("optimizer." + p + "exp_avg", {7, 3}, v1::PIPELINE_LAYER, layer), v1::DP_FLAT);
  }
  *ptc.add_tensors() = Tensor("final_norm", {8}, v1::PIPELINE_LAST_STAGE);
  v1::BlobSpec* step = ptc.add_blobs();
  step->set_name("step");
  step->set_size_bytes(8);
  step->set_scope(v1::BLOB_REPLICATED);
  v1::BlobSpec* rng = ptc.add_blobs();
  rng->set_name("rng");
  rng->set_size_bytes(16);
  rng->set_scope(v1::BLOB_PER_RANK);
  return ptc;
}

/// SmallPtc at tp 2, pp 2, dp 1 on h0, h1 x 2 devices.
inline v1::JobSpec SmallJob(const std::string& name, const std::string& tenant = "team-a") {
  v1::JobSpec spec;
  spec.set_name(name);
  spec.set_tenant(tenant);
  *spec.mutable_ptc() = SmallPtc();
  *spec.mutable_layout() = MakeLayout(2, 2, 1, {"h0", "h1"}, 2);
  return spec;
}

/// SmallPtc, every item replicated, at tp 1, pp 1, dp 2 on h0, h1 x 1
/// device: each item has a replica on each host, so losing one loses nothing.
inline v1::JobSpec ReplicatedJob(const std::string& name, const std::string& tenant = "team-a") {
  v1::JobSpec spec = SmallJob(name, tenant);
  for (v1::TensorSpec& t : *spec.mutable_ptc()->mutable_tensors()) {
    t.mutable_partition()->mutable_dp()->set_mode(v1::DP_REPLICATED);
  }
  // A per-rank blob has one holder per value; replicate it too.
  for (v1::BlobSpec& b : *spec.mutable_ptc()->mutable_blobs()) b.set_scope(v1::BLOB_REPLICATED);
  *spec.mutable_layout() = MakeLayout(1, 1, 2, {"h0", "h1"}, 1);
  return spec;
}

}  // namespace reshard::coordinator::testing
