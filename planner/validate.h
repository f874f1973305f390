// Validation of PTC specs and layouts. Every error is InvalidArgument and
// names the tensor, the field and the bad value. Pure; thread-safe.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/limits.h"
#include "reshard/v1/ptc.pb.h"

namespace reshard::planner {

// ---- Limits ------------------------------------------------------------------
// Every length and size a client sends has a limit, checked before anything
// is stored; each is listed in docs/coordinator.md ("Limits"). Together they
// keep every sum of bytes (per tensor, rank, host, job) far below 2^63, and
// every name below PostgreSQL's btree key limit (~2,700 bytes). The limits
// the coordinator's request checks share (kMaxIdBytes, kMaxItemNameBytes) and
// CheckLength are in common/limits.h.
/// Tensors and blobs of one PTC.
inline constexpr int64_t kMaxTensors = 1 << 20;
inline constexpr int64_t kMaxBlobs = 1 << 16;
/// Layers of one PTC.
inline constexpr int64_t kMaxLayers = 1 << 20;
/// Sub-blocks of one tensor's tp axis.
inline constexpr int64_t kMaxTpBlocks = 1024;
/// Elements and bytes of one tensor (1 TiB).
inline constexpr int64_t kMaxTensorElements = int64_t{1} << 40;
inline constexpr int64_t kMaxTensorBytes = int64_t{1} << 40;
/// Bytes of one blob (16 GiB).
inline constexpr int64_t kMaxBlobBytes = int64_t{1} << 34;
/// Bytes of one job: every tensor once plus every blob once (1 PiB).
inline constexpr int64_t kMaxJobBytes = int64_t{1} << 50;

/// Bytes per element of `dtype`; 0 for unknown values.
int ElementBytes(v1::DType dtype);

/// Checks tensors and blobs on their own (names, dtypes, shapes, partition
/// fields, byte sizes).
[[nodiscard]] absl::Status ValidatePtc(const v1::Ptc& ptc);

/// Checks a layout against a valid PTC: config, stage boundaries, placement,
/// and that no holding rank is left empty unless the tensor allows it.
/// `what` names the layout in messages ("layout", "target").
[[nodiscard]] absl::Status ValidateLayout(const v1::Ptc& ptc, const v1::Layout& layout,
                                          absl::string_view what);

/// ValidatePtc + ValidateLayout + job-level fields.
[[nodiscard]] absl::Status ValidateJobSpec(const v1::JobSpec& spec);

/// The bytes of shards a host holds under a layout.
struct HostBytes {
  std::string host;
  int64_t bytes = 0;
};
/// For every host of `layout` (in order of first rank), the sum over its
/// ranks of each item's shard bytes (what agent::RankItemBytes gives, without
/// the agent's per-item alignment). Every sum is overflow-checked:
/// InvalidArgument naming the host when one would not fit 64 bits. `ptc`
/// and `layout` must be valid.
[[nodiscard]] absl::StatusOr<std::vector<HostBytes>> BytesPerHost(const v1::Ptc& ptc,
                                                                  const v1::Layout& layout);

}  // namespace reshard::planner
