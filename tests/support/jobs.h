// The canned job specs of the test suites, built with job_builders.h. They
// stay distinct because tests index into them (tensors(1) is the fused QKV of
// GptJobSpec, InvalidSpecCases relies on it) and assert on their sizes.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "reshard/v1/ptc.pb.h"
#include "tests/support/job_builders.h"

namespace reshard::test_support {

// ---- A 2-layer fp32 model (the logic tests) ----

/// 2 layers, fp32, tensors using every partition rule (fused tp blocks,
/// pipeline stages, DP split and DP flat) and both blob scopes, so plans have
/// cross-host steps, local steps and zero fills: embed (first stage, tp 0),
/// per layer qkv (tp 1, blocks 8,8,8), proj (tp 0), norm (DP_SPLIT) and
/// optimizer exp_avg (7x3, DP_FLAT), final_norm (last stage); blobs step
/// (replicated, 8 B) and rng (per rank, 16 B).
inline v1::Ptc TwoLayerPtc() {
  v1::Ptc ptc;
  ptc.set_num_layers(2);
  SetTpSplit(AddTensor(&ptc, "embed", {32, 8}, v1::DTYPE_FLOAT32, v1::PIPELINE_FIRST_STAGE), 0);
  for (int layer = 0; layer < 2; ++layer) {
    const std::string p = "layers." + std::to_string(layer) + ".";
    SetTpSplit(AddTensor(&ptc, p + "qkv", {8, 24}, v1::DTYPE_FLOAT32, v1::PIPELINE_LAYER, layer), 1,
               {8, 8, 8});
    SetTpSplit(AddTensor(&ptc, p + "proj", {8, 8}, v1::DTYPE_FLOAT32, v1::PIPELINE_LAYER, layer),
               0);
    SetDp(AddTensor(&ptc, p + "norm", {8}, v1::DTYPE_FLOAT32, v1::PIPELINE_LAYER, layer),
          v1::DP_SPLIT, 0);
    // 7x3 = 21 elements: a DP_FLAT split over 2 leaves one padding element.
    SetDp(AddTensor(&ptc, "optimizer." + p + "exp_avg", {7, 3}, v1::DTYPE_FLOAT32,
                    v1::PIPELINE_LAYER, layer),
          v1::DP_FLAT);
  }
  AddTensor(&ptc, "final_norm", {8}, v1::DTYPE_FLOAT32, v1::PIPELINE_LAST_STAGE);
  AddBlob(&ptc, "step", 8, v1::BLOB_REPLICATED);
  AddBlob(&ptc, "rng", 16, v1::BLOB_PER_RANK);
  return ptc;
}

/// TwoLayerPtc at tp 2, pp 2, dp 1 on h0, h1 x 2 devices.
inline v1::JobSpec TwoLayerJob(const std::string& name, const std::string& tenant = "team-a") {
  v1::JobSpec spec;
  spec.set_name(name);
  spec.set_tenant(tenant);
  *spec.mutable_ptc() = TwoLayerPtc();
  *spec.mutable_layout() = MakeLayout(2, 2, 1, {"h0", "h1"}, 2);
  return spec;
}

/// TwoLayerPtc with every item replicated, at tp 1, pp 1, dp 2 on h0, h1 x 1
/// device: each item has a replica on each host, so losing one loses nothing.
inline v1::JobSpec ReplicatedTwoLayerJob(const std::string& name,
                                         const std::string& tenant = "team-a") {
  v1::JobSpec spec = TwoLayerJob(name, tenant);
  for (v1::TensorSpec& t : *spec.mutable_ptc()->mutable_tensors()) {
    t.mutable_partition()->mutable_dp()->set_mode(v1::DP_REPLICATED);
  }
  // A per-rank blob has one holder per value; replicate it too.
  for (v1::BlobSpec& b : *spec.mutable_ptc()->mutable_blobs()) b.set_scope(v1::BLOB_REPLICATED);
  *spec.mutable_layout() = MakeLayout(1, 1, 2, {"h0", "h1"}, 1);
  return spec;
}

// ---- A 4-layer GPT-like bf16 model (the server, client and agent tests) ----

inline constexpr int kGptLayers = 4;
inline constexpr int64_t kGptHidden = 64;
inline constexpr int64_t kGptVocab = 256;

/// A 4-layer GPT-like job: embeddings (first stage), per layer a fused QKV
/// weight (blocks), a row-parallel weight and a norm, the output head (last
/// stage), all bf16; an fp32 Adam moment per weight (DP_FLAT), a step blob
/// and a per-rank RNG blob (64 B). Layout: tp 2, pp 2, dp 2 on `hosts` x 4.
inline v1::JobSpec GptJobSpec(const std::string& name, const std::string& tenant,
                              const std::vector<std::string>& hosts = {"h0", "h1"}) {
  constexpr v1::DType kBf16 = v1::DTYPE_BFLOAT16;
  v1::JobSpec spec;
  spec.set_name(name);
  spec.set_tenant(tenant);
  v1::Ptc* ptc = spec.mutable_ptc();
  ptc->set_num_layers(kGptLayers);
  SetTpSplit(
      AddTensor(ptc, "embedding.weight", {kGptVocab, kGptHidden}, kBf16, v1::PIPELINE_FIRST_STAGE),
      0);
  for (int n = 0; n < kGptLayers; ++n) {
    const std::string p = "layers." + std::to_string(n) + ".";
    SetTpSplit(AddTensor(ptc, p + "attn.qkv.weight", {3 * kGptHidden, kGptHidden}, kBf16,
                         v1::PIPELINE_LAYER, n),
               0, {kGptHidden, kGptHidden, kGptHidden});
    SetTpSplit(AddTensor(ptc, p + "attn.dense.weight", {kGptHidden, kGptHidden}, kBf16,
                         v1::PIPELINE_LAYER, n),
               1);
    AddTensor(ptc, p + "norm.weight", {kGptHidden}, kBf16, v1::PIPELINE_LAYER, n);
  }
  SetTpSplit(
      AddTensor(ptc, "output.weight", {kGptVocab, kGptHidden}, kBf16, v1::PIPELINE_LAST_STAGE), 0);
  const int weights = ptc->tensors_size();
  for (int i = 0; i < weights; ++i) {
    v1::TensorSpec t = ptc->tensors(i);
    t.set_name("optimizer.exp_avg." + t.name());
    t.set_dtype(v1::DTYPE_FLOAT32);
    t.mutable_partition()->mutable_dp()->set_mode(v1::DP_FLAT);
    *ptc->add_tensors() = std::move(t);
  }
  AddBlob(ptc, "step", 8, v1::BLOB_REPLICATED);
  AddBlob(ptc, "rng_state", 64, v1::BLOB_PER_RANK);
  *spec.mutable_layout() = MakeLayout(2, 2, 2, hosts, 4);
  return spec;
}

/// GptJobSpec without per-rank or data-parallel-split state (only its
/// DP_REPLICATED tensors, no per-rank blob), at tp 2, pp 2, dp 2 on h0..h3 x
/// 2 devices: each host holds one data-parallel replica of one stage, so
/// losing h1 (or h3) is recoverable from the other replica.
inline v1::JobSpec ReplicatedGptJobSpec(const std::string& name, const std::string& tenant) {
  v1::JobSpec spec = GptJobSpec(name, tenant);
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

// ---- A 2-layer fp32 model with five tensors (the store tests) ----

/// 2 layers, fp32: embedding.weight (first stage, tp 0), layers.0.qkv.weight
/// (tp 0, blocks 16,16,16), layers.1.fc.weight (tp 1), final_norm.weight
/// (last stage), optimizer.exp_avg.layers.1.fc.weight (tp 1, DP_FLAT); blobs
/// step (replicated, 8 B) and rng_state (per rank, 16 B); tp 2, pp 2, dp 1 on
/// h0, h1 x 2.
inline v1::JobSpec StoreSmallSpec(const std::string& name, const std::string& tenant = "tenant-a") {
  constexpr v1::DType kFp32 = v1::DTYPE_FLOAT32;
  v1::JobSpec spec;
  spec.set_name(name);
  spec.set_tenant(tenant);
  v1::Ptc* ptc = spec.mutable_ptc();
  ptc->set_num_layers(2);
  SetTpSplit(AddTensor(ptc, "embedding.weight", {64, 16}, kFp32, v1::PIPELINE_FIRST_STAGE), 0);
  SetTpSplit(AddTensor(ptc, "layers.0.qkv.weight", {48, 16}, kFp32, v1::PIPELINE_LAYER, 0), 0,
             {16, 16, 16});
  SetTpSplit(AddTensor(ptc, "layers.1.fc.weight", {16, 32}, kFp32, v1::PIPELINE_LAYER, 1), 1);
  AddTensor(ptc, "final_norm.weight", {16}, kFp32, v1::PIPELINE_LAST_STAGE);
  v1::TensorSpec* opt = AddTensor(ptc, "optimizer.exp_avg.layers.1.fc.weight", {16, 32}, kFp32,
                                  v1::PIPELINE_LAYER, 1);
  SetTpSplit(opt, 1);
  opt->mutable_partition()->mutable_dp()->set_mode(v1::DP_FLAT);
  AddBlob(ptc, "step", 8, v1::BLOB_REPLICATED);
  AddBlob(ptc, "rng_state", 16, v1::BLOB_PER_RANK);
  *spec.mutable_layout() = MakeLayout(2, 2, 1, {"h0", "h1"}, 2);
  return spec;
}

// ---- A 1-layer model of four tensors (the executor and agent session tests) ----

/// 1 layer: w (`rows` x 256 fp32, tp 0), qkv (12x8 bf16, tp 0, blocks
/// 4,4,4), m (5x5 fp32, DP_FLAT), o (`rows` x 16 int8, tp 1, DP_FLAT); blobs
/// step (replicated, 8 B) and rng (per rank, 16 B).
inline v1::Ptc ExecutorPtc(int64_t rows) {
  v1::Ptc ptc;
  ptc.set_num_layers(1);
  SetTpSplit(AddTensor(&ptc, "w", {rows, 256}), 0);
  SetTpSplit(AddTensor(&ptc, "qkv", {12, 8}, v1::DTYPE_BFLOAT16), 0, {4, 4, 4});
  SetDp(AddTensor(&ptc, "m", {5, 5}), v1::DP_FLAT);
  v1::TensorSpec* o = AddTensor(&ptc, "o", {rows, 16}, v1::DTYPE_INT8);
  SetTpSplit(o, 1);
  SetDp(o, v1::DP_FLAT);
  AddBlob(&ptc, "step", 8, v1::BLOB_REPLICATED);
  AddBlob(&ptc, "rng", 16, v1::BLOB_PER_RANK);
  return ptc;
}

}  // namespace reshard::test_support
