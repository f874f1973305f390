// GPT-shaped PTCs and layouts for the planner benchmark, built in C++ so the
// benchmark needs no files. Pure; thread-safe.
#pragma once

#include <cstdint>
#include <string>

#include "reshard/v1/ptc.pb.h"

namespace reshard::bench {

/// A Megatron GPT model's shape.
struct GptShape {
  int layers = 24;
  int64_t hidden = 2048;
  int64_t seq = 2048;
  int64_t vocab = 50257;
};

inline constexpr GptShape kGpt3Xl{24, 2048, 2048, 50257};
inline constexpr GptShape kGpt3_175b{96, 12288, 2048, 50257};
/// A 70B GPT (Llama-2-70B's depth, width, context and vocabulary; GPT blocks).
inline constexpr GptShape kGpt70b{80, 8192, 4096, 32000};

/// Megatron pads the vocabulary to a multiple of 128 * tp.
int64_t PaddedVocab(int64_t vocab, int tp);

/// Megatron GPT tensors (`embedding.word_embeddings.weight`, per layer
/// `decoder.layers.N.self_attention.query_key_value.weight`, ...) in fp16,
/// column-parallel weights and biases split on axis 0, row-parallel weights on
/// axis 1, norms and row-parallel biases replicated; the word embeddings on
/// the first stage and `output_layer.weight` on the last, vocabulary padded
/// for `tp`. Every weight gets fp32 `optimizer.master.`, `optimizer.exp_avg.`
/// and `optimizer.exp_avg_sq.` tensors, DP_FLAT (distributed optimizer).
/// Blobs: `step` (8 bytes, replicated) and `rng_state` (per rank). Without
/// `distributed_optimizer` the optimizer tensors are DP_REPLICATED like the
/// weights.
v1::Ptc BuildGptPtc(const GptShape& shape, int tp, bool distributed_optimizer = true);

/// The same model as an FSDP2 / HSDP job with tensor parallelism
/// (torchtitan's 2-d mesh): bf16 weights, fp32 `optimizer.master.` weights
/// and Adam moments, every tensor DP_CHUNK on axis 0 (DTensor Shard(0) over
/// the shard group) with allow_empty (torch.chunk leaves trailing ranks short
/// or empty), as reshard.frameworks.fsdp.dtensor_ptc describes them. Blobs as
/// BuildGptPtc.
v1::Ptc BuildFsdpGptPtc(const GptShape& shape, int tp);

/// tp x pp x dp on hosts `<prefix><first>` .. `<prefix><first + n - 1>`, each
/// with `devices_per_host` devices (the compact placement).
v1::Layout MakeLayout(int tp, int pp, int dp, const std::string& prefix, int first_host,
                      int devices_per_host);

/// `layout` with HSDP shard groups of `dp_shard` data-parallel ranks
/// (ParallelConfig.dp_shard): dp / dp_shard replicas.
v1::Layout WithDpShard(v1::Layout layout, int dp_shard);

}  // namespace reshard::bench
