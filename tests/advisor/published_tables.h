// Published numbers the advisor is checked against, with their sources.
// Every number here was transcribed by hand; the cross-checks in
// published_tables_test.cc (aggregate = per-GPU x GPUs, parameters from the
// shape) guard against transcription slips.
#pragma once

namespace reshard::advisor::published {

/// Narayanan et al., "Efficient Large-Scale Language Model Training on GPU
/// Clusters Using Megatron-LM", SC'21 (arXiv:2104.04473), Table 1: weak
/// scaling of GPT models on Selene (DGX A100 80 GB, 8 GPUs and 8 HDR
/// InfiniBand NICs per node), vocabulary 51,200, sequence 2048, fp16, full
/// activation recomputation (`--checkpoint-activations`).
/// Shape, t, p, batch, GPUs: the paper's table and the authors' launch script
/// examples/sc21/run_table_1.sh in github.com/NVIDIA/Megatron-LM (commit
/// de7dc40f, 2021-08-10), which also gives what the table leaves out: the
/// micro-batch size, the interleaved schedule's layers per virtual stage and
/// the DDP implementation (torch DDP overlaps the gradient all-reduce with
/// the backward pass; Megatron's "local" DDP of 2021 does not). The
/// throughput columns (TFLOP/s per GPU, percent of peak, aggregate PFLOP/s)
/// come from the paper's table alone: no second copy of them was at hand, so
/// they are checked only against each other (per-GPU x GPUs = aggregate) and
/// against the paper's abstract (502 PFLOP/s, 52% of peak, on 3,072 GPUs).
struct ThroughputRow {
  double params_billion;
  int heads;
  int hidden;
  int layers;
  int tp;
  int pp;
  int gpus;
  int batch;
  int micro_batch;     // run_table_1.sh MBS
  int virtual_stages;  // layers per stage / --num-layers-per-virtual-pipeline-stage
  bool torch_ddp;      // run_table_1.sh DDP=torch (overlapped all-reduce)
  double tflops_per_gpu;
  double percent_of_peak;
  double aggregate_pflops;
  bool used_in_fit;  // the efficiency table was fitted on these rows
};

inline constexpr ThroughputRow kNarayananTable1[] = {
    {1.7, 24, 2304, 24, 1, 1, 32, 512, 16, 1, true, 137, 44, 4.4, true},
    {3.6, 32, 3072, 30, 2, 1, 64, 512, 16, 1, true, 138, 44, 8.8, false},
    {7.5, 32, 4096, 36, 4, 1, 128, 512, 16, 1, true, 142, 46, 18.2, true},
    {18.4, 48, 6144, 40, 8, 1, 256, 1024, 8, 1, true, 135, 43, 34.6, false},
    {39.1, 64, 8192, 48, 8, 2, 512, 1536, 4, 1, false, 138, 44, 70.8, true},
    {76.1, 80, 10240, 60, 8, 4, 1024, 1792, 2, 3, false, 140, 45, 143.8, false},
    {145.6, 96, 12288, 80, 8, 8, 1536, 2304, 2, 2, false, 148, 47, 227.1, true},
    {310.1, 128, 16384, 96, 8, 16, 1920, 2160, 1, 2, false, 155, 50, 297.4, false},
    {529.6, 128, 20480, 105, 8, 35, 2520, 2520, 1, 3, false, 163, 52, 410.2, true},
    {1008.0, 160, 25600, 128, 8, 64, 3072, 3072, 1, 1, false, 163, 52, 502.0, false},
};
inline constexpr int kNarayananVocab = 51200;
inline constexpr int kNarayananSeq = 2048;

/// Korthikanti et al., "Reducing Activation Recomputation in Large
/// Transformer Models" (arXiv:2205.05198, MLSys'23): the four models of its
/// Table 3 (A100 80 GB, sequence 2048, vocabulary 51,200, sequence
/// parallelism and selective recomputation, data-parallel size 1), with the
/// hardware FLOPs utilization the Megatron-LM README published for them
/// (commit 2e90a342, 2022-05-19: "measured using a data parallel size of
/// one"). The shapes, t and p are those of the paper's Table 3; the global
/// and micro-batch sizes were transcribed from the same table and have no
/// second source here.
struct UtilizationRow {
  const char* name;
  int heads;
  int hidden;
  int layers;
  int tp;
  int pp;
  int batch;
  int micro_batch;
  double model_flops_utilization;     // percent
  double hardware_flops_utilization;  // percent
};

inline constexpr UtilizationRow kKorthikantiModels[] = {
    {"22B", 64, 6144, 48, 8, 1, 4, 4, 41.5, 43.7},
    {"175B", 96, 12288, 96, 8, 8, 64, 1, 51.4, 52.8},
    {"530B", 128, 20480, 105, 8, 35, 280, 1, 56.0, 57.0},
    {"1T", 160, 25600, 128, 8, 64, 512, 1, 56.3, 57.0},
};

/// Korthikanti et al. §4.3 (selective recomputation): "this reduces the
/// activation memory required ... by 70% for GPT-3 and 65% for MT-NLG"
/// (with tensor and sequence parallelism; GPT-3 = the 175B row above,
/// MT-NLG = the 530B row).
inline constexpr double kSelectiveSavingGpt3 = 0.70;
inline constexpr double kSelectiveSavingMtNlg = 0.65;

/// Korthikanti et al. Table 2: activation bytes per transformer layer, in
/// units of s*b*h (a: heads, t: tensor-parallel size), 2-byte activations.
enum class Technique {
  kNoParallelism,            // 34 + 5as/h
  kTensor,                   // 10 + 24/t + 5as/(ht)
  kTensorSequence,           // 34/t + 5as/(ht)
  kTensorSelective,          // 10 + 24/t
  kTensorSequenceSelective,  // 34/t
  kFullRecompute,            // 2
};

inline double Table2PerLayer(Technique k, double a, double s, double h, double t) {
  switch (k) {
    case Technique::kNoParallelism:
      return 34 + 5 * a * s / h;
    case Technique::kTensor:
      return 10 + 24 / t + 5 * a * s / (h * t);
    case Technique::kTensorSequence:
      return 34 / t + 5 * a * s / (h * t);
    case Technique::kTensorSelective:
      return 10 + 24 / t;
    case Technique::kTensorSequenceSelective:
      return 34 / t;
    case Technique::kFullRecompute:
      return 2;
  }
  return 0;
}

}  // namespace reshard::advisor::published
