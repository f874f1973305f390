// The SQL of the agents' prepare of a stop-free operation
// (migrations/0011_agent_prepare.sql; pg_prepare.cc). Listed in
// AllStatements (pg_statements.cc).
#pragma once

#include "services/coordinator/store/operation_machine.h"
#include "services/coordinator/store/pg_pool.h"

namespace reshard::coordinator::pg {

// $1 operation, $2 the generation the prepare copies from. Only a PLANNED
// stop-free operation whose prepare has not started and that is not cut
// over.
inline constexpr Statement kStartPrepare{
    "start_prepare",
    "UPDATE operations SET prepared_from_generation = $2::bigint, updated_at = now() "
    "WHERE id = $1 AND " RESHARD_SQL_OP_TO_PREPARE("")
    " RETURNING job_id, to_generation, target_layout"};

// $1 operation: the agents are prepared (every host row PREPARED, or none).
inline constexpr Statement kSetAgentsPrepared{
    "set_agents_prepared",
    "UPDATE operations o SET agents_prepared_at = now(), updated_at = now() WHERE o.id = $1 "
    "AND o.agents_prepared_at IS NULL AND NOT EXISTS (SELECT 1 FROM operation_hosts h WHERE "
    "h.operation_id = o.id AND h.state <> 5)"};

// $1 operation: prepared once workers and agents both are, at the later.
inline constexpr Statement kSettlePrepared{
    "settle_prepared",
    "UPDATE operations SET prepared_at = GREATEST(workers_prepared_at, agents_prepared_at) "
    "WHERE id = $1 AND prepared_at IS NULL AND workers_prepared_at IS NOT NULL AND "
    "agents_prepared_at IS NOT NULL"};

// $1 operation, $2 host, $3 progress time: ASSIGNED/RUNNING -> PREPARED
// with everything written.
inline constexpr Statement kPrepareHost{
    "prepare_host",
    "UPDATE operation_hosts SET state = 5, bytes_done = bytes_total, "
    "bytes_precopied = bytes_total, error = '', waiting_on = '', updated_at = now(), "
    "progress_unix_ms = $3 WHERE operation_id = $1 AND host_id = $2 AND state IN (1, 2) "
    "RETURNING bytes_total"};

inline constexpr Statement kHostTaskState{
    "host_task_state",
    "SELECT state FROM operation_hosts WHERE operation_id = $1 AND host_id = $2"};

// $1 operation, $2 bytes a host's prepare wrote.
inline constexpr Statement kAddPrecopied{
    "add_precopied",
    "UPDATE operations SET bytes_precopied = bytes_precopied + $2::bigint, updated_at = now() "
    "WHERE id = $1"};

// $1 operation, $2 host, $3 items, $4 ranks, $5 checksums (the uint64 bit
// for bit as bigint), $6 bytes.
inline constexpr Statement kInsertPreparedSources{
    "insert_prepared_sources",
    "INSERT INTO operation_prepared_sources (operation_id, item, rank, host_id, checksum, bytes) "
    "SELECT $1, s.item, s.rank, $2, s.checksum, s.bytes FROM unnest($3::integer[], "
    "$4::integer[], $5::bigint[], $6::bigint[]) AS s(item, rank, checksum, bytes) "
    "ON CONFLICT (operation_id, item, rank) DO UPDATE SET host_id = EXCLUDED.host_id, "
    "checksum = EXCLUDED.checksum, bytes = EXCLUDED.bytes"};

inline constexpr Statement kSelectPreparedSources{
    "select_prepared_sources",
    "SELECT item, rank, checksum, bytes FROM operation_prepared_sources WHERE operation_id = $1 "
    "ORDER BY item, rank"};

// $1 operation: hosts whose prepare has not finished.
inline constexpr Statement kHostsNotPrepared{
    "hosts_not_prepared",
    "SELECT host_id FROM operation_hosts WHERE operation_id = $1 AND state <> 5 "
    "ORDER BY host_id"};

// $1 job, $2 generation: a PENDING generation exists.
inline constexpr Statement kPendingGenerationExists{
    "pending_generation_exists",
    "SELECT 1 FROM generations WHERE job_id = $1 AND generation = $2 AND state = 2"};

// $1 operation, $2 hosts, $3 bytes totals, $4 progress times: the transfer
// phase starts every row afresh.
inline constexpr Statement kResetHostsForTransfer{
    "reset_hosts_for_transfer",
    "UPDATE operation_hosts h SET state = 1, bytes_done = 0, bytes_total = t.total, error = '', "
    "waiting_on = '', progress_unix_ms = t.progress, updated_at = now() FROM unnest($2::text[], "
    "$3::bigint[], $4::bigint[]) AS t(host_id, total, progress) WHERE h.operation_id = $1 AND "
    "h.host_id = t.host_id"};

// $1 operation, $2 skipped step indexes, $3 skipped bytes, $4 bytes_total.
inline constexpr Statement kSetPreparedTransferring{
    "set_prepared_transferring",
    "UPDATE operations SET state = " RESHARD_SQL_OP_TRANSFERRING ", skipped_steps = $2::integer[], "
    "bytes_skipped_unchanged = $3::bigint, bytes_total = $4::bigint, bytes_done = 0, "
    "updated_at = now() WHERE id = $1"};

}  // namespace reshard::coordinator::pg
