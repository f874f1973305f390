// The statements of PgStore::HeartbeatHosts (pg_heartbeat.cc): heartbeats in
// batches, each list as one query over every host of the batch. $1 is always
// the batch's host ids (a text[] literal, pg_codec.h).
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "services/coordinator/store/operation_machine.h"
#include "services/coordinator/store/pg_pool.h"

namespace reshard::coordinator::pg {

// $2 epochs, $3 now, $4 lease ends (bigint[] literals), one per host id. A
// host named twice is updated once (with either beat's times); RETURNING
// its epoch says which beat matched.
inline constexpr Statement kHeartbeatHosts{
    "heartbeat_hosts",
    "UPDATE hosts h SET last_heartbeat_unix_ms = b.now_ms, lease_expires_unix_ms = b.lease_ms "
    "FROM unnest($1::text[], $2::bigint[], $3::bigint[], $4::bigint[]) AS b(id, epoch, now_ms, "
    "lease_ms) WHERE h.id = b.id AND h.epoch = b.epoch AND h.state = 1 RETURNING h.id, h.epoch"};

inline constexpr Statement kHostsEpochState{
    "hosts_epoch_state", "SELECT id, epoch, state FROM hosts WHERE id = ANY($1::text[])"};

// AssignedOperations (pg_statements.h) of every host of $1.
inline constexpr Statement kAssignedOperationsOfHosts{
    "assigned_operations_of_hosts",
    "SELECT oh.host_id, o.id FROM operation_hosts oh JOIN operations o ON o.id = oh.operation_id "
    "WHERE oh.host_id = ANY($1::text[]) AND ((" RESHARD_SQL_OP_IS_TRANSFERRING("o.")
    " AND oh.state NOT IN (3, 4)) OR (" RESHARD_SQL_OP_AGENTS_PREPARE("o.")
    " AND oh.state IN (1, 2))) ORDER BY oh.host_id, o.seq"};

// GenerationsToRelease (RETIRED, 3) and GenerationsToDiscard (DISCARDED, 4)
// of every host of $1, told apart by the last column.
inline constexpr Statement kGenerationsToDropOfHosts{
    "generations_to_drop_of_hosts",
    "SELECT r.host_id, g.job_id, g.generation, g.state FROM generations g JOIN (SELECT DISTINCT "
    "host_id, job_id, generation FROM generation_ranks WHERE host_id = ANY($1::text[])) r ON "
    "r.job_id = g.job_id AND r.generation = g.generation WHERE g.state IN (3, 4) ORDER BY "
    "r.host_id, g.job_id, g.generation"};

/// Why a heartbeat of `host_id` for `epoch` updated nothing: NotFound
/// (`found` false), an older epoch than `latest`, or a host marked LOST.
absl::Status HeartbeatRefusal(const std::string& host_id, int64_t epoch, bool found,
                              int64_t latest);

}  // namespace reshard::coordinator::pg
