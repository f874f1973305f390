#include "tests/coordinator/server/test_jobs.h"

#include "absl/strings/str_cat.h"

namespace reshard::coordinator::testing {
namespace {

constexpr int kLayers = 4;
constexpr int64_t kHidden = 64;
constexpr int64_t kVocab = 256;

v1::TensorSpec* AddTensor(v1::Ptc* ptc, const std::string& name, std::vector<int64_t> shape,
                          v1::PipelineMode pipeline, int layer = 0) {
  v1::TensorSpec* t = ptc->add_tensors();
  t->set_name(name);
  t->set_dtype(v1::DTYPE_BFLOAT16);
  for (int64_t d : shape) t->add_shape(d);
  t->mutable_partition()->mutable_pipeline()->set_mode(pipeline);
  if (pipeline == v1::PIPELINE_LAYER) t->mutable_partition()->mutable_pipeline()->set_layer(layer);
  return t;
}

void TpSplit(v1::TensorSpec* t, int axis, std::vector<int64_t> blocks = {}) {
  t->mutable_partition()->mutable_tp()->set_mode(v1::TP_SPLIT);
  t->mutable_partition()->mutable_tp()->set_axis(axis);
  for (int64_t b : blocks) t->mutable_partition()->mutable_tp()->add_blocks(b);
}

}  // namespace

v1::Placement HostsPlacement(const std::vector<std::string>& hosts, int per_host) {
  v1::Placement p;
  for (const std::string& h : hosts) p.add_hosts(h);
  p.set_devices_per_host(per_host);
  return p;
}

v1::Layout MakeLayout(int tp, int pp, int dp, const std::vector<std::string>& hosts, int per_host) {
  v1::Layout l;
  l.mutable_config()->set_tp(tp);
  l.mutable_config()->set_pp(pp);
  l.mutable_config()->set_dp(dp);
  *l.mutable_placement() = HostsPlacement(hosts, per_host);
  return l;
}

v1::JobSpec SmallJobSpec(const std::string& name, const std::string& tenant,
                         const std::vector<std::string>& hosts) {
  v1::JobSpec spec;
  spec.set_name(name);
  spec.set_tenant(tenant);
  v1::Ptc* ptc = spec.mutable_ptc();
  ptc->set_num_layers(kLayers);
  TpSplit(AddTensor(ptc, "embedding.weight", {kVocab, kHidden}, v1::PIPELINE_FIRST_STAGE), 0);
  for (int n = 0; n < kLayers; ++n) {
    const std::string p = absl::StrCat("layers.", n, ".");
    TpSplit(AddTensor(ptc, p + "attn.qkv.weight", {3 * kHidden, kHidden}, v1::PIPELINE_LAYER, n), 0,
            {kHidden, kHidden, kHidden});
    TpSplit(AddTensor(ptc, p + "attn.dense.weight", {kHidden, kHidden}, v1::PIPELINE_LAYER, n), 1);
    AddTensor(ptc, p + "norm.weight", {kHidden}, v1::PIPELINE_LAYER, n);
  }
  TpSplit(AddTensor(ptc, "output.weight", {kVocab, kHidden}, v1::PIPELINE_LAST_STAGE), 0);
  const int weights = ptc->tensors_size();
  for (int i = 0; i < weights; ++i) {
    v1::TensorSpec t = ptc->tensors(i);
    t.set_name("optimizer.exp_avg." + t.name());
    t.set_dtype(v1::DTYPE_FLOAT32);
    t.mutable_partition()->mutable_dp()->set_mode(v1::DP_FLAT);
    *ptc->add_tensors() = std::move(t);
  }
  v1::BlobSpec* step = ptc->add_blobs();
  step->set_name("step");
  step->set_size_bytes(8);
  v1::BlobSpec* rng = ptc->add_blobs();
  rng->set_name("rng_state");
  rng->set_size_bytes(64);
  rng->set_scope(v1::BLOB_PER_RANK);
  *spec.mutable_layout() = MakeLayout(2, 2, 2, hosts, 4);
  return spec;
}

v1::JobSpec ReplicatedJobSpec(const std::string& name, const std::string& tenant) {
  v1::JobSpec spec = SmallJobSpec(name, tenant);
  v1::Ptc* ptc = spec.mutable_ptc();
  google::protobuf::RepeatedPtrField<v1::TensorSpec> kept;
  for (const v1::TensorSpec& t : ptc->tensors()) {
    if (t.partition().dp().mode() == v1::DP_REPLICATED) *kept.Add() = t;
  }
  *ptc->mutable_tensors() = std::move(kept);
  ptc->mutable_blobs()->RemoveLast();  // rng_state, per rank
  *spec.mutable_layout() = MakeLayout(2, 2, 2, {"h0", "h1", "h2", "h3"}, 2);
  return spec;
}

std::vector<InvalidSpecCase> InvalidSpecCases() {
  std::vector<InvalidSpecCase> cases;
  auto add = [&](const std::string& name, auto mutate) {
    v1::JobSpec spec = SmallJobSpec("bad-" + name, "tenant-bad");
    mutate(&spec);
    cases.push_back({name, std::move(spec)});
  };
  add("duplicate_tensor_name", [](v1::JobSpec* s) {
    s->mutable_ptc()->mutable_tensors(2)->set_name(s->ptc().tensors(1).name());
  });
  add("unknown_dtype",
      [](v1::JobSpec* s) { s->mutable_ptc()->mutable_tensors(0)->set_dtype(v1::DType(99)); });
  add("tp_axis_out_of_range", [](v1::JobSpec* s) {
    s->mutable_ptc()->mutable_tensors(0)->mutable_partition()->mutable_tp()->set_axis(2);
  });
  add("blocks_not_summing", [](v1::JobSpec* s) {
    // tensors(1) is layers.0.attn.qkv.weight, axis 0 of size 3 * hidden.
    auto* tp = s->mutable_ptc()->mutable_tensors(1)->mutable_partition()->mutable_tp();
    tp->set_blocks(2, kHidden - 1);
  });
  add("layer_beyond_count", [](v1::JobSpec* s) {
    s->mutable_ptc()->mutable_tensors(1)->mutable_partition()->mutable_pipeline()->set_layer(
        kLayers);
  });
  add("stage_starts_not_from_zero", [](v1::JobSpec* s) {
    s->mutable_layout()->mutable_config()->add_stage_starts(1);
    s->mutable_layout()->mutable_config()->add_stage_starts(3);
  });
  add("stage_starts_not_increasing", [](v1::JobSpec* s) {
    s->mutable_layout()->mutable_config()->add_stage_starts(0);
    s->mutable_layout()->mutable_config()->add_stage_starts(0);
  });
  add("world_not_placement_size",
      [](v1::JobSpec* s) { s->mutable_layout()->mutable_placement()->set_devices_per_host(2); });
  add("zero_tp", [](v1::JobSpec* s) { s->mutable_layout()->mutable_config()->set_tp(0); });
  add("negative_dimension",
      [](v1::JobSpec* s) { s->mutable_ptc()->mutable_tensors(0)->set_shape(0, -5); });
  add("empty_name", [](v1::JobSpec* s) { s->set_name(""); });
  return cases;
}

}  // namespace reshard::coordinator::testing
