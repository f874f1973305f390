// Small builders for PTC specs and layouts used by the planner unit tests.
#pragma once

#include <string>
#include <vector>

#include "reshard/v1/ptc.pb.h"

namespace reshard::planner::testing {

inline v1::TensorSpec Tensor(const std::string& name, std::vector<int64_t> shape,
                             v1::DType dtype = v1::DTYPE_FLOAT32) {
  v1::TensorSpec t;
  t.set_name(name);
  t.set_dtype(dtype);
  for (int64_t d : shape) t.add_shape(d);
  t.mutable_partition()->mutable_pipeline()->set_mode(v1::PIPELINE_EVERY_STAGE);
  return t;
}

inline v1::TensorSpec& TpSplit(v1::TensorSpec& t, int axis, std::vector<int64_t> blocks = {}) {
  t.mutable_partition()->mutable_tp()->set_mode(v1::TP_SPLIT);
  t.mutable_partition()->mutable_tp()->set_axis(axis);
  for (int64_t b : blocks) t.mutable_partition()->mutable_tp()->add_blocks(b);
  return t;
}

inline v1::TensorSpec& AtLayer(v1::TensorSpec& t, int layer) {
  t.mutable_partition()->mutable_pipeline()->set_mode(v1::PIPELINE_LAYER);
  t.mutable_partition()->mutable_pipeline()->set_layer(layer);
  return t;
}

inline v1::TensorSpec& Dp(v1::TensorSpec& t, v1::DpMode mode, int axis = 0) {
  t.mutable_partition()->mutable_dp()->set_mode(mode);
  t.mutable_partition()->mutable_dp()->set_axis(axis);
  return t;
}

/// tp x pp x dp over hosts h<first_host>.. with `per_host` devices each.
inline v1::Layout MakeLayout(int tp, int pp, int dp, int per_host, int first_host = 0,
                             std::vector<int> stage_starts = {}) {
  v1::Layout l;
  l.mutable_config()->set_tp(tp);
  l.mutable_config()->set_pp(pp);
  l.mutable_config()->set_dp(dp);
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

/// Replaces the placement of `l` by ranks on hosts h<first_host>.. with
/// `per_host` devices each, for its whole world (cp included).
inline void Place(v1::Layout& l, int per_host, int first_host = 0) {
  const v1::ParallelConfig& c = l.config();
  const int world = c.tp() * c.pp() * c.dp() * (c.cp() > 0 ? c.cp() : 1);
  l.clear_placement();
  for (int r = 0; r < world; ++r) {
    v1::DeviceSlot* s = l.mutable_placement()->add_ranks();
    s->set_host("h" + std::to_string(first_host + r / per_host));
    s->set_device(r % per_host);
  }
}

}  // namespace reshard::planner::testing
