// PgStore's dataset-state rows (migrations/0007_dataset_state.sql), used by
// the job, operation and CommitStep transactions. Internal to the store.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "reshard/v1/ptc.pb.h"
#include "services/coordinator/store/dataset_commit.h"
#include "services/coordinator/store/pg_pool.h"

namespace reshard::coordinator::pg {

/// A row of RESHARD_PG_DATASET_COLUMNS (pg_dataset_statements.h).
v1::DatasetState DatasetStateFromRow(const pqxx::row& row);

/// Generation `generation`'s row from `state` (committed_generation =
/// generation; committed_unix_ms ignored).
void InsertDatasetState(PgTx& tx, const std::string& job_id, int64_t generation,
                        const v1::DatasetState& state);

/// Generation `generation`'s dataset state; nullopt when it has none.
/// `for_update`: lock the row.
std::optional<v1::DatasetState> ReadDatasetState(PgTx& tx, const std::string& job_id,
                                                 int64_t generation, bool for_update = false);

/// Copies generation `from`'s row to generation `to` (an operation commits).
void CarryDatasetState(PgTx& tx, const std::string& job_id, int64_t from, int64_t to);

/// The job's checkpoint that has not ended, if any (kPendingCheckpointOfJob).
std::optional<PendingCheckpoint> ReadPendingCheckpoint(PgTx& tx, const std::string& job_id);

}  // namespace reshard::coordinator::pg
