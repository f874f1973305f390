// The per-GPU-type efficiency table. How the A100 row was fitted, and on
// which published rows: docs/advisor.md ("Time").
#include "advisor/types.h"

namespace reshard::advisor {

const char* RecomputeName(Recompute r) {
  switch (r) {
    case Recompute::kNone:
      return "none";
    case Recompute::kSelective:
      return "selective";
    case Recompute::kFull:
      return "full";
  }
  return "?";
}

GpuType KnownGpu(const std::string& name) {
  // gemm_efficiency and traffic_factor: least squares on the 1.7B, 7.5B,
  // 39.1B, 145.6B and 529.6B rows of Narayanan et al. SC'21 Table 1 (A100
  // 80 GB); the other five rows and Korthikanti et al.'s rows validate them.
  constexpr double kGemmEfficiency = 0.635;
  constexpr double kTrafficFactor = 1.7;
  GpuType g;
  g.name = name;
  g.gemm_efficiency = kGemmEfficiency;
  g.traffic_factor = kTrafficFactor;
  if (name == "H100" || name == "H100-SXM") {
    // Not fitted: the A100 constants with H100 SXM peak and HBM3 bandwidth.
    g.memory_bytes = 80e9;
    g.peak_flops = 989e12;
    g.hbm_bytes_per_s = 3.35e12;
  } else if (name == "A100-40GB") {
    g.memory_bytes = 40e9;
    g.peak_flops = 312e12;
    g.hbm_bytes_per_s = 1.555e12;
  } else if (name == "A100" || name == "A100-80GB") {
    g.memory_bytes = 80e9;
    g.peak_flops = 312e12;
    g.hbm_bytes_per_s = 2.039e12;
  }  // unknown: efficiency constants only; the caller gives the rest
  return g;
}

}  // namespace reshard::advisor
