// Checks of scheduler requests that need no store: field presence and the
// target layouts of Resize / Migrate / RecoverFromFailure against the job.
// Every failure is InvalidArgument naming the field and value. Pure.
#pragma once

#include <set>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "google/protobuf/repeated_field.h"
#include "reshard/v1/agent.pb.h"
#include "reshard/v1/ptc.pb.h"

namespace reshard::coordinator {

// Limits of request fields that are not part of a spec (the spec's own are
// in planner/validate.h, those both check in common/limits.h);
// docs/coordinator.md lists them all.
/// Bytes of an agent's address (host:port or a URI).
inline constexpr int64_t kMaxAddressBytes = 1024;
/// Bytes of an agent's UCX worker address blob.
inline constexpr int64_t kMaxUcxAddressBytes = 64 << 10;
/// Devices and transports one agent may report.
inline constexpr int64_t kMaxDevicesPerHost = 1024;
inline constexpr int64_t kMaxTransports = 16;
inline constexpr int64_t kMaxTransportNameBytes = 64;
/// Entries of a RecoverFromFailure's lost_hosts / lost_ranks.
inline constexpr int64_t kMaxLostEntries = 1 << 20;

/// An identifier field (job id, operation id, host id): InvalidArgument
/// `FIELD is empty` when it is, and when it is longer than
/// kMaxIdBytes (common/limits.h), naming field, value and limit.
[[nodiscard]] absl::Status RequireNonEmpty(absl::string_view field, const std::string& value);

/// An idempotency key may be empty; else at most kMaxIdBytes.
[[nodiscard]] absl::Status CheckIdempotencyKey(const std::string& key);

/// The fields of RegisterAgentRequest.host: host_id (non-empty, limit),
/// address, ucx_address, devices, transports, memory_limit_bytes >= 0.
[[nodiscard]] absl::Status CheckHostFields(const v1::Host& host);

/// expected_generation must name a generation (they start at 1).
[[nodiscard]] absl::Status CheckExpectedGeneration(int64_t expected_generation);

/// Migrate keeps the config: the new placement must have a slot per rank.
[[nodiscard]] absl::Status CheckMigrateWorld(const v1::ParallelConfig& config,
                                             const v1::Placement& placement);

/// The lost set names at least one well-formed host or rank.
[[nodiscard]] absl::Status CheckLostFields(
    const google::protobuf::RepeatedPtrField<std::string>& lost_hosts,
    const google::protobuf::RepeatedField<int32_t>& lost_ranks);

/// The lost set against the generation it is about (`current`): every lost
/// host holds a rank of it, every lost rank exists, and `target` uses no
/// lost host, nor the device of a lost rank unless that rank's host is in
/// `in_place_hosts` (ALIVE and named lost nowhere: the rank restarts in
/// place, docs/coordinator.md, "Recovery keeps the job's redundancy").
[[nodiscard]] absl::Status CheckLostAgainst(
    const v1::Layout& current, const v1::Layout& target,
    const google::protobuf::RepeatedPtrField<std::string>& lost_hosts,
    const google::protobuf::RepeatedField<int32_t>& lost_ranks,
    const std::set<std::string>& in_place_hosts = {});

}  // namespace reshard::coordinator
