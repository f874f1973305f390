// Conversions between PostgreSQL values (text-format results, array
// literals, BYTEA) and the API's protos. Internal to the store component.
// Pure functions; thread-safe.
#pragma once

#include <cstdint>
#include <pqxx/pqxx>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "google/protobuf/message_lite.h"
#include "reshard/v1/agent.pb.h"
#include "reshard/v1/coordinator.pb.h"
#include "reshard/v1/ptc.pb.h"
#include "services/coordinator/store/store_checks.h"

namespace reshard::coordinator::pg {

// ---- Parameters --------------------------------------------------------------

/// A text[] literal: {"a","b\"c"}.
std::string TextArray(const std::vector<std::string>& values);
/// An integer[] / bigint[] / smallint[] literal: {1,2,3}.
std::string IntArray(const std::vector<int64_t>& values);
/// Serialized message as a binary (BYTEA) parameter.
pqxx::binarystring Bytea(const google::protobuf::MessageLite& message);
pqxx::binarystring Bytea(absl::string_view bytes);
/// Lowercase hex, for decode(x, 'hex') inside array parameters.
std::string Hex(absl::string_view bytes);

/// InvalidArgument when `value` holds a NUL byte (store_checks.h).
using ::reshard::coordinator::CheckText;

// ---- Results -----------------------------------------------------------------

/// A text[] result column.
std::vector<std::string> ParseTextArray(const pqxx::field& field);
/// An integer[] / bigint[] result column (no NULL elements).
std::vector<int64_t> ParseIntArray(const pqxx::field& field);
/// Parses a BYTEA column into `message`; Internal naming `what` on failure.
[[nodiscard]] absl::Status ParseBytea(const pqxx::field& field, absl::string_view what,
                                      google::protobuf::MessageLite* message);

/// Row of RESHARD_PG_JOB_COLUMNS.
[[nodiscard]] absl::StatusOr<v1::Job> JobFromRow(const pqxx::row& row);
/// How many columns RESHARD_PG_OPERATION_COLUMNS has (the plan follows).
inline constexpr int kOperationColumns = 35;
/// Row of RESHARD_PG_OPERATION_COLUMNS; also fills lost hosts/ranks when
/// the pointers are non-null.
[[nodiscard]] absl::StatusOr<v1::Operation> OperationFromRow(const pqxx::row& row,
                                                             std::vector<std::string>* lost_hosts,
                                                             std::vector<int>* lost_ranks);
/// Row of RESHARD_PG_HOST_COLUMNS.
[[nodiscard]] absl::StatusOr<v1::Host> HostFromRow(const pqxx::row& row);
/// Rows of (job id, generation).
[[nodiscard]] absl::StatusOr<std::vector<v1::GenerationRef>> GenerationRefsFromRows(
    const pqxx::result& rows);

// ---- Shard checksums ---------------------------------------------------------

/// One rank's shard checksums packed for generation_ranks.checksums: 20 bytes
/// per shard, little-endian (int32 item, uint64 checksum, int64 bytes).
std::string PackChecksums(const std::vector<const v1::ShardChecksum*>& checksums);
/// The inverse; Internal when the length is not a multiple of 20.
[[nodiscard]] absl::Status UnpackChecksums(absl::string_view packed, int rank,
                                           std::vector<v1::ShardChecksum>* out);

}  // namespace reshard::coordinator::pg
