#include "tests/coordinator/server/test_jobs.h"

#include <string>
#include <utility>

namespace reshard::coordinator::testing {
namespace {

using ::reshard::test_support::GptJobSpec;
using ::reshard::test_support::kGptHidden;
using ::reshard::test_support::kGptLayers;

}  // namespace

std::vector<InvalidSpecCase> InvalidSpecCases() {
  std::vector<InvalidSpecCase> cases;
  auto add = [&](const std::string& name, auto mutate) {
    v1::JobSpec spec = GptJobSpec("bad-" + name, "tenant-bad");
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
    tp->set_blocks(2, kGptHidden - 1);
  });
  add("layer_beyond_count", [](v1::JobSpec* s) {
    s->mutable_ptc()->mutable_tensors(1)->mutable_partition()->mutable_pipeline()->set_layer(
        kGptLayers);
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
