#include "bench/planner/gpt_model.h"

#include <vector>

#include "absl/strings/str_cat.h"
#include "common/log.h"

namespace reshard::bench {
namespace {

constexpr int kRngStateBytes = 5120;

enum class Tp { kReplicated, kSplit0, kSplit1 };

void AddTensor(v1::Ptc* ptc, const std::string& name, std::vector<int64_t> shape, Tp tp,
               v1::PipelineMode pipeline, int layer) {
  v1::TensorSpec* t = ptc->add_tensors();
  t->set_name(name);
  t->set_dtype(v1::DTYPE_FLOAT16);
  for (int64_t d : shape) t->add_shape(d);
  v1::PartitionSpec* p = t->mutable_partition();
  if (tp != Tp::kReplicated) {
    p->mutable_tp()->set_mode(v1::TP_SPLIT);
    p->mutable_tp()->set_axis(tp == Tp::kSplit0 ? 0 : 1);
  }
  p->mutable_pipeline()->set_mode(pipeline);
  if (pipeline == v1::PIPELINE_LAYER) p->mutable_pipeline()->set_layer(layer);
  p->mutable_dp()->set_mode(v1::DP_REPLICATED);
}

}  // namespace

int64_t PaddedVocab(int64_t vocab, int tp) {
  const int64_t multiple = 128 * static_cast<int64_t>(tp);
  return (vocab + multiple - 1) / multiple * multiple;
}

v1::Ptc BuildGptPtc(const GptShape& s, int tp, bool distributed_optimizer) {
  RESHARD_CHECK(tp > 0) << "tp " << tp;
  v1::Ptc ptc;
  ptc.set_num_layers(s.layers);
  const int64_t h = s.hidden, vocab = PaddedVocab(s.vocab, tp);
  AddTensor(&ptc, "embedding.word_embeddings.weight", {vocab, h}, Tp::kSplit0,
            v1::PIPELINE_FIRST_STAGE, 0);
  AddTensor(&ptc, "embedding.position_embeddings.weight", {s.seq, h}, Tp::kReplicated,
            v1::PIPELINE_FIRST_STAGE, 0);
  for (int n = 0; n < s.layers; ++n) {
    const std::string p = absl::StrCat("decoder.layers.", n, ".");
    auto add = [&](const char* name, std::vector<int64_t> shape, Tp mode) {
      AddTensor(&ptc, absl::StrCat(p, name), std::move(shape), mode, v1::PIPELINE_LAYER, n);
    };
    add("input_layernorm.weight", {h}, Tp::kReplicated);
    add("input_layernorm.bias", {h}, Tp::kReplicated);
    add("self_attention.query_key_value.weight", {3 * h, h}, Tp::kSplit0);
    add("self_attention.query_key_value.bias", {3 * h}, Tp::kSplit0);
    add("self_attention.dense.weight", {h, h}, Tp::kSplit1);
    add("self_attention.dense.bias", {h}, Tp::kReplicated);
    add("post_attention_layernorm.weight", {h}, Tp::kReplicated);
    add("post_attention_layernorm.bias", {h}, Tp::kReplicated);
    add("mlp.dense_h_to_4h.weight", {4 * h, h}, Tp::kSplit0);
    add("mlp.dense_h_to_4h.bias", {4 * h}, Tp::kSplit0);
    add("mlp.dense_4h_to_h.weight", {h, 4 * h}, Tp::kSplit1);
    add("mlp.dense_4h_to_h.bias", {h}, Tp::kReplicated);
  }
  AddTensor(&ptc, "decoder.final_layernorm.weight", {h}, Tp::kReplicated, v1::PIPELINE_LAST_STAGE,
            0);
  AddTensor(&ptc, "decoder.final_layernorm.bias", {h}, Tp::kReplicated, v1::PIPELINE_LAST_STAGE, 0);
  AddTensor(&ptc, "output_layer.weight", {vocab, h}, Tp::kSplit0, v1::PIPELINE_LAST_STAGE, 0);

  const int weights = ptc.tensors_size();
  for (const char* kind : {"master", "exp_avg", "exp_avg_sq"}) {
    for (int i = 0; i < weights; ++i) {
      v1::TensorSpec t = ptc.tensors(i);
      t.set_name(absl::StrCat("optimizer.", kind, ".", t.name()));
      t.set_dtype(v1::DTYPE_FLOAT32);
      if (distributed_optimizer) t.mutable_partition()->mutable_dp()->set_mode(v1::DP_FLAT);
      *ptc.add_tensors() = std::move(t);
    }
  }

  v1::BlobSpec* step = ptc.add_blobs();
  step->set_name("step");
  step->set_size_bytes(8);
  step->set_scope(v1::BLOB_REPLICATED);
  v1::BlobSpec* rng = ptc.add_blobs();
  rng->set_name("rng_state");
  rng->set_size_bytes(kRngStateBytes);
  rng->set_scope(v1::BLOB_PER_RANK);
  return ptc;
}

v1::Ptc BuildFsdpGptPtc(const GptShape& s, int tp) {
  v1::Ptc ptc = BuildGptPtc(s, tp, /*distributed_optimizer=*/false);
  for (v1::TensorSpec& t : *ptc.mutable_tensors()) {
    // The optimizer's tensors were copied from the weights with fp32.
    if (t.dtype() == v1::DTYPE_FLOAT16) t.set_dtype(v1::DTYPE_BFLOAT16);
    v1::PartitionSpec* p = t.mutable_partition();
    p->mutable_dp()->set_mode(v1::DP_CHUNK);
    p->mutable_dp()->set_axis(0);
    p->set_allow_empty(true);
  }
  return ptc;
}

v1::Layout MakeLayout(int tp, int pp, int dp, const std::string& prefix, int first_host,
                      int devices_per_host) {
  const int world = tp * pp * dp;
  RESHARD_CHECK(world % devices_per_host == 0)
      << "world " << world << " is not a multiple of " << devices_per_host;
  v1::Layout layout;
  layout.mutable_config()->set_tp(tp);
  layout.mutable_config()->set_pp(pp);
  layout.mutable_config()->set_dp(dp);
  v1::Placement* placement = layout.mutable_placement();
  placement->set_devices_per_host(devices_per_host);
  for (int i = 0; i < world / devices_per_host; ++i) {
    placement->add_hosts(absl::StrCat(prefix, first_host + i));
  }
  return layout;
}

v1::Layout WithDpShard(v1::Layout layout, int dp_shard) {
  RESHARD_CHECK(dp_shard > 0 && layout.config().dp() % dp_shard == 0)
      << "dp_shard " << dp_shard << " does not divide dp " << layout.config().dp();
  layout.mutable_config()->set_dp_shard(dp_shard);
  return layout;
}

}  // namespace reshard::bench
