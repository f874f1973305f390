// The advisor's inputs and outputs: a transformer model, the devices offered,
// the training settings, and the candidate parallel layouts it predicts.
// Plain data; thread-compatible. Units: bytes, bytes/s, FLOP/s, seconds.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "reshard/v1/ptc.pb.h"

namespace reshard::planner {
struct LostSet;  // planner/planner.h
}  // namespace reshard::planner

namespace reshard::advisor {

/// A GPT-style decoder: `layers` blocks of attention + MLP, tied or untied
/// word embeddings of `vocab` rows. 0 in an optional field means the usual
/// default (kv_heads = heads, ffn_hidden = 4 * hidden).
struct ModelSpec {
  int layers = 0;
  int64_t hidden = 0;
  int heads = 0;
  int kv_heads = 0;        // grouped-query attention; 0: = heads
  int64_t ffn_hidden = 0;  // 0: 4 * hidden
  bool gated_mlp = false;  // SwiGLU-style: three FFN matrices instead of two
  int64_t vocab = 0;
  int64_t seq_length = 0;
  int experts = 0;  // mixture of experts in every layer; 0: dense
  int expert_topk = 0;
};

/// One GPU model. `gemm_efficiency` and `traffic_factor` of 0 take the value
/// of the efficiency table (KnownGpu) for `name`, or the A100 row if unknown.
struct GpuType {
  std::string name;
  double memory_bytes = 0;
  double peak_flops = 0;  // dense bf16/fp16 tensor-core FLOP/s
  double hbm_bytes_per_s = 0;
  double gemm_efficiency = 0;
  double traffic_factor = 0;
};

/// The efficiency table: "A100" (= "A100-80GB"), "A100-40GB", "H100" (=
/// "H100-SXM") with memory, peak and HBM bandwidth; any other name gets the
/// efficiency constants only (memory, peak and HBM stay 0 for the caller to
/// give). docs/advisor.md says how the A100 constants were fitted.
GpuType KnownGpu(const std::string& name);

struct HostOffer {
  std::string name;
  int devices = 0;
  GpuType gpu;
};

/// The devices a job is offered. Bandwidths are achieved (bus) bandwidths:
/// `intra_host_bytes_per_s` per GPU inside a host (NVLink),
/// `inter_host_bytes_per_s` per host across hosts (all its NICs together).
struct ClusterOffer {
  std::vector<HostOffer> hosts;
  double intra_host_bytes_per_s = 0;
  double inter_host_bytes_per_s = 0;
};

struct TrainingSpec {
  int64_t global_batch = 0;  // sequences per step
  bool distributed_optimizer = false;
  bool sequence_parallel = true;
  /// Fraction of the data-parallel gradient reduction hidden behind the
  /// backward pass (Megatron's --overlap-grad-reduce); 0 = not overlapped.
  double dp_overlap = 0.5;
  /// Bytes of one gradient element in the data-parallel reduction.
  int grad_reduce_bytes = 2;
  /// A layout is feasible when its peak memory is at most this fraction of
  /// the GPU's memory (allocator fragmentation, workspaces, CUDA context).
  double usable_memory_fraction = 0.9;
};

enum class Recompute { kNone, kSelective, kFull };
const char* RecomputeName(Recompute r);

struct ParallelChoice {
  int tp = 1;
  int pp = 1;
  int dp = 1;
  int micro_batch = 1;
  Recompute recompute = Recompute::kNone;
  /// Interleaved 1F1B: model chunks per pipeline stage (Megatron's
  /// --num-layers-per-virtual-pipeline-stage). The time and memory model
  /// take it; Advise() enumerates only 1.
  int virtual_stages = 1;
};

/// Seconds of one training step, by cause. `total` is what the advisor
/// ranks; the parts before the bubble are per GPU and not overlapped.
struct StepTime {
  double compute = 0;      // GEMMs at the table's efficiency
  double elementwise = 0;  // HBM traffic of norms, softmax, dropout, activations
  double tp_comm = 0;      // tensor-parallel all-reduces (ring, intra-host)
  double pp_comm = 0;      // pipeline point-to-point sends
  double bubble = 0;       // (p-1)/m of the above
  double dp_comm = 0;      // exposed part of the gradient reduction
  double total = 0;
  double hardware_flops = 0;  // per step, recomputation included
  double model_flops = 0;     // per step, without recomputation
};

/// Peak bytes on the most loaded device (the first pipeline stage).
struct Memory {
  double state = 0;        // weights, gradients, optimizer state
  double activations = 0;  // stored for the backward pass, 1F1B schedule
  double total = 0;
};

/// Cost of moving the job's state from its current layout to a candidate,
/// as the planner computes it (MakePlan).
struct ReconfigCost {
  bool computed = false;
  std::string error;  // why it could not be computed (then computed = false)
  int64_t cross_host_bytes = 0;
  int64_t lower_bound_cross_host_bytes = 0;
  int64_t local_bytes = 0;
  std::string busiest_host;
  int64_t busiest_host_bytes = 0;  // max(bytes in, bytes out) of that host
  double transfer_seconds = 0;     // busiest_host_bytes / inter-host bandwidth
};

struct Candidate {
  ParallelChoice choice;
  StepTime time;
  Memory memory;
  double tflops_per_gpu = 0;  // hardware FLOP/s per GPU / 1e12
  v1::Layout layout;          // config + placement on the offered hosts
  ReconfigCost reconfig;
};

/// The job's current state, when it has one: its PTC and layout. Both
/// pointers must outlive the Advise() call.
struct CurrentJob {
  const v1::Ptc* ptc = nullptr;
  const v1::Layout* layout = nullptr;
  /// Hosts and ranks of `layout` that are lost: moves are priced as a
  /// recovery from the survivors (null: nothing lost).
  const planner::LostSet* lost = nullptr;
};

struct AdviceRequest {
  ModelSpec model;
  TrainingSpec training;
  ClusterOffer cluster;
  CurrentJob current;
  /// Limits of the search (0: no limit beyond the offer).
  int max_micro_batch = 0;
  /// Candidates whose reconfiguration is planned, fastest first (the planner
  /// is the expensive part); the rest of the Pareto set gets computed=false.
  int max_reconfig_plans = 16;
};

struct Advice {
  /// Pareto-optimal in (time.total, memory.total), fastest first.
  std::vector<Candidate> pareto;
  int64_t considered = 0;  // (tp, pp, dp, micro-batch, recompute) tuples
  int64_t feasible = 0;    // of those, fitting in memory
};

}  // namespace reshard::advisor
