// The advisor's analytic model of one candidate: parameter counts, FLOPs per
// step (Narayanan et al., SC'21), memory per device (Korthikanti et al.,
// 2022) and step time. Pure functions; thread-safe. Formulas and their
// sources: docs/advisor.md.
#pragma once

#include "advisor/types.h"

namespace reshard::advisor {

/// Devices per host and bandwidths the time model uses for one candidate.
struct Links {
  int devices_per_host = 8;
  double intra_host_bytes_per_s = 0;  // per GPU
  double inter_host_bytes_per_s = 0;  // per host
};

/// Parameters of one transformer layer (all experts counted).
double LayerParams(const ModelSpec& m);
/// Parameters of the whole model (tied word embeddings).
double ModelParams(const ModelSpec& m);

/// Hardware FLOPs of one step of `global_batch` sequences, recomputation
/// included; with ffn = 4h, kv = heads and full recomputation this is
/// 96 B s l h^2 (1 + s/6h + V/16lh).
double StepFlops(const ModelSpec& m, int64_t global_batch, Recompute r);

/// Activation bytes one layer stores for one micro-batch of `b` sequences
/// (2-byte activations), Korthikanti et al. Table 2 generalised to GQA and
/// other FFN widths. `sequence_parallel` applies when tp > 1.
double LayerActivationBytes(const ModelSpec& m, int tp, int64_t b, bool sequence_parallel,
                            Recompute r);

/// Peak memory of the first pipeline stage. `state_bytes` < 0: computed from
/// the model (Megatron's 18 bytes per parameter, or 6 + 12/dp with the
/// distributed optimizer); otherwise those state bytes plus fp32 gradients.
Memory EstimateMemory(const ModelSpec& m, const TrainingSpec& t, const ParallelChoice& c,
                      double state_bytes = -1);

/// Step time of `c` on `gpu` with `links`.
StepTime EstimateStepTime(const ModelSpec& m, const TrainingSpec& t, const ParallelChoice& c,
                          const GpuType& gpu, const Links& links);

}  // namespace reshard::advisor
