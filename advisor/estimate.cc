#include "advisor/estimate.h"

#include <algorithm>
#include <cmath>

namespace reshard::advisor {
namespace {

double Kv(const ModelSpec& m) {
  const int kv = m.kv_heads > 0 ? m.kv_heads : m.heads;
  return static_cast<double>(m.hidden) * kv / m.heads;
}
double Ffn(const ModelSpec& m) {
  return static_cast<double>(m.ffn_hidden > 0 ? m.ffn_hidden : 4 * m.hidden);
}
double FfnMatrices(const ModelSpec& m) { return m.gated_mlp ? 3.0 : 2.0; }
int ExpertsHeld(const ModelSpec& m) { return m.experts > 0 ? m.experts : 1; }
int ExpertsActive(const ModelSpec& m) { return m.experts > 0 ? std::max(1, m.expert_topk) : 1; }

// Weights split by tensor parallelism in one layer (matrices and their
// column-parallel biases), and those every tp rank holds (norms, row-parallel
// biases).
double LayerSplitParams(const ModelSpec& m) {
  const double h = m.hidden, kv = Kv(m), f = Ffn(m);
  const double attention = h * (h + 2 * kv) + (h + 2 * kv) + h * h;
  const double mlp = (FfnMatrices(m) * h * f + (FfnMatrices(m) - 1) * f) * ExpertsHeld(m);
  return attention + mlp;
}
double LayerReplicatedParams(const ModelSpec& m) {
  const double h = m.hidden;
  return 4 * h /* two norms */ + 2 * h /* row-parallel biases */ +
         (m.experts > 0 ? h * m.experts : 0) /* router */;
}

// Forward GEMM FLOPs of one layer per token (projections and MLP), and of
// the attention scores per token (QK^T and attention over V).
double LayerGemmFlopsPerToken(const ModelSpec& m) {
  const double h = m.hidden, kv = Kv(m), f = Ffn(m);
  return 2 * (h * (h + 2 * kv) + h * h + FfnMatrices(m) * h * f * ExpertsActive(m));
}
double AttentionFlopsPerToken(const ModelSpec& m) {
  return 4.0 * static_cast<double>(m.seq_length) * m.hidden;
}

// Stored activation bytes of one layer per token, split into what tensor
// parallelism (without sequence parallelism) leaves replicated and what it
// splits, and the attention-score part per token (Korthikanti et al. §4.1:
// 34 s b h + 5 a s^2 b for the standard block).
struct LayerActs {
  double replicated = 0;  // 10 h: norm inputs, block inputs, dropout masks
  double split = 0;       // 24 h for the standard block
  double scores = 0;      // 5 a s
};
LayerActs LayerActsPerToken(const ModelSpec& m) {
  const double h = m.hidden, kv = Kv(m), f = Ffn(m) * ExpertsActive(m);
  LayerActs a;
  a.replicated = 4 * h + 2 * h + 2 * h + 2 * h;
  // Attention: Q (2h), K and V (4 kv), the output projection's input (2h).
  // MLP: first GEMM's output and the activation's output (4f, 6f gated).
  a.split = 2 * h + 4 * kv + 2 * h + (m.gated_mlp ? 6 : 4) * f;
  a.scores = 5.0 * m.heads * static_cast<double>(m.seq_length);
  return a;
}

double RingAllReduceSeconds(double bytes, int n, double bw) {
  if (n <= 1 || bw <= 0) return 0;
  return 2.0 * (n - 1) / n * bytes / bw;
}

}  // namespace

double LayerParams(const ModelSpec& m) { return LayerSplitParams(m) + LayerReplicatedParams(m); }

double ModelParams(const ModelSpec& m) {
  const double h = m.hidden;
  // Tied input and output embeddings (Megatron GPT's default), learned
  // position embeddings, final norm.
  return m.layers * LayerParams(m) + static_cast<double>(m.vocab) * h +
         static_cast<double>(m.seq_length) * h + 2 * h;
}

double StepFlops(const ModelSpec& m, int64_t global_batch, Recompute r) {
  const double tokens = static_cast<double>(global_batch) * m.seq_length;
  const double gemm = LayerGemmFlopsPerToken(m), att = AttentionFlopsPerToken(m);
  const double logits = 2.0 * m.hidden * m.vocab;
  const double forward = tokens * (m.layers * (gemm + att) + logits);
  double recomputed = 0;
  if (r == Recompute::kSelective) recomputed = tokens * m.layers * att;
  if (r == Recompute::kFull) recomputed = tokens * m.layers * (gemm + att);
  return 3 * forward + recomputed;
}

double LayerActivationBytes(const ModelSpec& m, int tp, int64_t b, bool sequence_parallel,
                            Recompute r) {
  const double tokens = static_cast<double>(b) * m.seq_length;
  const bool sp = sequence_parallel && tp > 1;
  if (r == Recompute::kFull) {
    // Only the layer's input is kept (2 s b h), sequence-split with SP.
    return tokens * 2.0 * m.hidden / (sp ? tp : 1);
  }
  const LayerActs a = LayerActsPerToken(m);
  const double linear = sp ? (a.replicated + a.split) / tp : a.replicated + a.split / tp;
  const double scores = r == Recompute::kSelective ? 0 : a.scores / tp;
  return tokens * (linear + scores);
}

Memory EstimateMemory(const ModelSpec& m, const TrainingSpec& t, const ParallelChoice& c,
                      double state_bytes) {
  const double h = m.hidden, layers_per_stage = static_cast<double>(m.layers) / c.pp;
  // The first stage holds its layers and the word and position embeddings
  // (the last stage's copy of the tied word embeddings is no larger).
  const double params = layers_per_stage * (LayerSplitParams(m) / c.tp + LayerReplicatedParams(m)) +
                        static_cast<double>(m.vocab) * h / c.tp +
                        static_cast<double>(m.seq_length) * h;
  Memory mem;
  if (state_bytes >= 0) {
    mem.state = state_bytes + 4.0 * params;  // + fp32 main gradients
  } else {
    // bf16 weights 2 + fp32 gradients 4 + fp32 master weights 4 + Adam 8
    // (Megatron's theoretical_memory_usage.py); the distributed optimizer
    // shards the last 12 across dp.
    const double per_param = t.distributed_optimizer ? 6.0 + 12.0 / c.dp : 18.0;
    mem.state = per_param * params;
  }
  // 1F1B: the first stage keeps min(m, p) micro-batches in flight, so it
  // stores p * (l / p) = l layers' activations when m >= p.
  const int64_t per_dp = t.global_batch / c.dp;
  const int64_t micro_batches = per_dp / c.micro_batch;
  const double in_flight = std::min<double>(static_cast<double>(micro_batches), c.pp);
  const double b = c.micro_batch, s = static_cast<double>(m.seq_length);
  const bool sp = t.sequence_parallel && c.tp > 1;
  double acts = in_flight * layers_per_stage *
                LayerActivationBytes(m, c.tp, c.micro_batch, t.sequence_parallel, c.recompute);
  // Embedding dropout output and token ids (Megatron's estimator).
  acts += in_flight * (s * b * h * 2 / (sp ? c.tp : 1) + 8 * s * b);
  if (c.recompute == Recompute::kFull) {
    // Recomputing one layer in the backward pass re-materialises it whole.
    acts += LayerActivationBytes(m, c.tp, c.micro_batch, t.sequence_parallel, Recompute::kNone);
  }
  if (c.virtual_stages > 1) acts *= 1 + (c.pp - 1.0) / (c.pp * c.virtual_stages);
  if (c.pp == 1) {
    // Output layer: final norm output and fp32 logits, vocabulary split by tp.
    acts += s * b * (4 * h + 4.0 * m.vocab / c.tp);
  }
  mem.activations = acts;
  mem.total = mem.state + mem.activations;
  return mem;
}

StepTime EstimateStepTime(const ModelSpec& m, const TrainingSpec& t, const ParallelChoice& c,
                          const GpuType& gpu, const Links& links) {
  StepTime st;
  const int n = c.tp * c.pp * c.dp;
  const int64_t per_dp = t.global_batch / c.dp;
  const double micro_batches = static_cast<double>(per_dp / c.micro_batch);
  const double layers_per_stage = static_cast<double>(m.layers) / c.pp;
  const double b = c.micro_batch, s = static_cast<double>(m.seq_length), h = m.hidden;
  st.hardware_flops = StepFlops(m, t.global_batch, c.recompute);
  st.model_flops = StepFlops(m, t.global_batch, Recompute::kNone);
  st.compute = st.hardware_flops / (n * gpu.peak_flops * gpu.gemm_efficiency);

  // Memory-bound work moves each stored activation byte through HBM a few
  // times per pass (traffic_factor); forward, backward (2 passes) and the
  // recomputed forward.
  const LayerActs a = LayerActsPerToken(m);
  const bool sp = t.sequence_parallel && c.tp > 1;
  const double linear = sp ? (a.replicated + a.split) / c.tp : a.replicated + a.split / c.tp;
  const double scores = a.scores / c.tp;
  const double linear_passes = c.recompute == Recompute::kFull ? 4 : 3;
  const double score_passes = c.recompute == Recompute::kNone ? 3 : 4;
  const double traffic_per_layer =
      b * s * (linear * linear_passes + scores * score_passes) * gpu.traffic_factor;
  st.elementwise = micro_batches * layers_per_stage * traffic_per_layer / gpu.hbm_bytes_per_s;

  // Tensor parallel: 4 all-reduces (or reduce-scatter + all-gather pairs) of
  // s b h 2-byte activations per layer and micro-batch, 6 when the forward
  // pass is recomputed whole.
  if (c.tp > 1) {
    const double all_reduces = c.recompute == Recompute::kFull ? 6 : 4;
    st.tp_comm = micro_batches * layers_per_stage * all_reduces *
                 RingAllReduceSeconds(s * b * h * 2, c.tp, links.intra_host_bytes_per_s);
  }
  // Pipeline: one activation and one gradient send per micro-batch and stage
  // boundary, scatter/gather-split across the tp ranks. A stage spans tp * dp
  // ranks; when that fills a host, its neighbour is on another host and the
  // sends share the host's NICs with the other GPUs.
  const bool stage_crosses_hosts = c.tp * c.dp >= links.devices_per_host;
  const double nic_per_gpu = links.inter_host_bytes_per_s / links.devices_per_host;
  if (c.pp > 1) {
    const double bw = stage_crosses_hosts ? nic_per_gpu : links.intra_host_bytes_per_s;
    st.pp_comm = c.virtual_stages * micro_batches * 2 * (s * b * h * 2 / c.tp) / bw;
  }
  const double per_pipeline = st.compute + st.elementwise + st.tp_comm + st.pp_comm;
  st.bubble = per_pipeline * (c.pp - 1) / (micro_batches * c.virtual_stages);

  // Data parallel: ring all-reduce of the gradients of a device's share of
  // the model, within the host when the dp group fits in it.
  if (c.dp > 1) {
    const double grad_bytes = ModelParams(m) / (c.tp * c.pp) * t.grad_reduce_bytes;
    const double bw =
        c.tp * c.dp <= links.devices_per_host ? links.intra_host_bytes_per_s : nic_per_gpu;
    st.dp_comm = RingAllReduceSeconds(grad_bytes, c.dp, bw) * (1 - t.dp_overlap);
  }
  st.total = per_pipeline + st.bubble + st.dp_comm;
  return st;
}

}  // namespace reshard::advisor
