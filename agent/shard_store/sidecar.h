// The sidecar file of a rank buffer ("<file>.meta"): the buffer's key, item
// sizes and, once sealed, item checksums, so that an agent that restarts finds
// its buffers again. Internal to the shard store. Line-oriented text:
//
//   reshard-rank-buffer 1
//   host <c-escaped host id>
//   job <c-escaped job id>
//   generation <n>
//   rank <n>
//   sealed <0 or 1>
//   published <0 or 1>   (optional, 0 when absent: written since version 2)
//   regenerated <item> ...  (optional, none when absent: written only when
//                            some item is, so other sidecars read as before)
//   items <count>
//   item <bytes> <checksum as 16 hex digits, or "-" while unsealed>  (count lines)
//   end
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "agent/shard_store/shard_store.h"

namespace reshard::agent {

struct Sidecar {
  std::string host_id;
  RankBufferKey key;
  std::vector<int64_t> item_bytes;
  bool sealed = false;
  /// Made by a worker's PublishShard (else by the executor): an unsealed
  /// published buffer survives an agent restart (its worker may still be
  /// writing); an unsealed executor buffer is a dead task's leftover.
  bool published = false;
  std::vector<uint64_t> checksums;  // one per item when sealed, else empty
  /// Items (ascending) whose bytes the executor zero-filled because no
  /// surviving rank held their value (TransferPlan.regenerate): the worker
  /// regenerates them. Always empty for a published buffer.
  std::vector<int32_t> regenerated;
};

std::string SerializeSidecar(const Sidecar& sidecar);
/// InvalidArgument naming the line when `text` is malformed.
[[nodiscard]] absl::StatusOr<Sidecar> ParseSidecar(const std::string& text);

/// Writes `<path>.tmp`, syncs it and renames it over `path`.
[[nodiscard]] absl::Status WriteSidecar(const std::string& path, const Sidecar& sidecar);
[[nodiscard]] absl::StatusOr<Sidecar> ReadSidecar(const std::string& path);

}  // namespace reshard::agent
