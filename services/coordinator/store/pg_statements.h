// Every SQL statement PgStore runs, as named constants. The name is the
// prepared statement's name and the metric label. Schema:
// migrations/0001_init.sql. Enum numbers are the proto numbers (JobState,
// HostState, HostTaskState) and store.h's GenerationState; operation states
// and phases only through operation_machine.h's RESHARD_SQL_OP_* fragments.
//
// Array parameters are passed as PostgreSQL array literals (pg_codec.h) and
// expanded with unnest(), so a batch is one round trip.
#pragma once

#include <vector>

#include "services/coordinator/store/operation_machine.h"
#include "services/coordinator/store/pg_pool.h"

namespace reshard::coordinator::pg {

// ---- Jobs ------------------------------------------------------------------

// The columns JobFromRow (pg_codec.h) reads, from `jobs j` joined with its
// current generation `g`. Lost hosts: those job_lost_hosts names (see
// migrations/0002) and hosts of the current generation whose state is LOST
// (HostState 2), found from the generation's ranks (its primary key) so
// that a read costs the job's ranks, not every host (the change feed reads
// a job at each of its changes); active operation: PENDING/PLANNED/TRANSFERRING; the
// operation waiting for its step boundary (migrations/0013); state_memory
// (migrations/0019).
#define RESHARD_PG_JOB_COLUMNS \
  "j.id, j.tenant, j.name, j.state, j.generation, j.num_layers, j.tensor_count, "           \
  "j.total_bytes, reshard_unix_ms(j.created_at), reshard_unix_ms(j.updated_at), g.layout, " \
  "(SELECT o.id FROM operations o WHERE o.job_id = j.id AND " RESHARD_SQL_OP_ACTIVE("o.") " " \
  "ORDER BY o.seq LIMIT 1), "                                                               \
  "ARRAY(SELECT l.host_id FROM job_lost_hosts l WHERE l.job_id = j.id UNION "               \
  "SELECT h.id FROM generation_ranks r JOIN hosts h ON h.id = r.host_id WHERE "             \
  "r.job_id = j.id AND r.generation = j.generation AND h.state = 2 ORDER BY 1), "           \
  "(SELECT o.id FROM operations o WHERE o.job_id = j.id AND "                               \
  RESHARD_SQL_OP_IS_PENDING("o.") " AND "                                                   \
  "o.step_boundary = 1 AND NOT EXISTS (SELECT 1 FROM operations c WHERE "                   \
  "c.id = o.queued_behind_operation_id AND " RESHARD_SQL_OP_ACTIVE("c.") ") LIMIT 1), "     \
  "j.layout_epoch, j.version, j.state_memory, j.policy, j.policy_status "                                              \
  "FROM jobs j JOIN generations g ON g.job_id = j.id AND g.generation = j.generation "

inline constexpr Statement kSelectJob{"select_job",
                                      "SELECT " RESHARD_PG_JOB_COLUMNS "WHERE j.id = $1"};

// The change feed's safety poll (migrations/0016): versions of the given ids.
inline constexpr Statement kJobVersions{
    "job_versions", "SELECT id, version FROM jobs WHERE id = ANY($1::text[])"};
inline constexpr Statement kOperationVersions{
    "operation_versions", "SELECT id, version FROM operations WHERE id = ANY($1::text[])"};

inline constexpr Statement kListJobs{
    "list_jobs", "SELECT " RESHARD_PG_JOB_COLUMNS
                 "WHERE ($1::text = '' OR j.tenant = $1::text) AND ($2::smallint = 0 OR j.state = "
                 "$2::smallint) AND j.id > $3::text ORDER BY j.id LIMIT $4::integer"};

inline constexpr Statement kInsertJob{
    "insert_job",
    "INSERT INTO jobs (id, tenant, name, state, generation, num_layers, tensor_count, "
    "total_bytes, state_memory) VALUES ($1, $2, $3, 1, 1, $4, $5, $6, $7) "
    "ON CONFLICT ON CONSTRAINT jobs_tenant_name_key DO NOTHING RETURNING id"};

// Locks the job row: operations on one job serialize on it.
inline constexpr Statement kLockJob{"lock_job",
                                    "SELECT generation, state FROM jobs WHERE id = $1 FOR UPDATE"};

inline constexpr Statement kJobExists{"job_exists", "SELECT 1 FROM jobs WHERE id = $1"};

inline constexpr Statement kDeleteJob{"delete_job", "DELETE FROM jobs WHERE id = $1"};

inline constexpr Statement kSetJobState{
    "set_job_state", "UPDATE jobs SET state = $2, updated_at = now() WHERE id = $1 RETURNING id"};

// Elastic policies (migrations/0024): $2 the ElasticPolicy (NULL: none).
inline constexpr Statement kSetJobPolicy{
    "set_job_policy", "UPDATE jobs SET policy = $2, updated_at = now() WHERE id = $1 RETURNING id"};
inline constexpr Statement kClearJobPolicy{
    "clear_job_policy",
    "UPDATE jobs SET policy = NULL, updated_at = now() WHERE id = $1 RETURNING id"};
// Only when it changes: an unchanged status keeps the job's version.
inline constexpr Statement kSetPolicyStatus{
    "set_policy_status",
    "WITH j AS (SELECT id FROM jobs WHERE id = $1), "
    "u AS (UPDATE jobs SET policy_status = $2 WHERE id = $1 AND policy_status <> $2 RETURNING id) "
    "SELECT id FROM j"};
inline constexpr Statement kJobsWithPolicy{
    "jobs_with_policy", "SELECT id FROM jobs WHERE policy IS NOT NULL ORDER BY id"};

// Whether job `j` has lost hosts: persisted ones (job_lost_hosts) or hosts
// of its current generation that are LOST now.
#define RESHARD_PG_JOB_HAS_LOST_HOSTS                                                        \
  "(EXISTS (SELECT 1 FROM job_lost_hosts l WHERE l.job_id = j.id) OR EXISTS (SELECT 1 FROM " \
  "generation_ranks r JOIN hosts h ON h.id = r.host_id WHERE r.job_id = j.id AND "           \
  "r.generation = j.generation AND h.state = 2))"

// After an operation ends: DEGRADED (3) when the job has lost hosts, else
// ACTIVE (1).
inline constexpr Statement kSettleJobState{
    "settle_job_state", "UPDATE jobs j SET state = CASE WHEN " RESHARD_PG_JOB_HAS_LOST_HOSTS
                        " THEN 3 ELSE 1 END, updated_at = now() WHERE j.id = $1"};

inline constexpr Statement kCountJobsByState{
    "count_jobs_by_state", "SELECT state, count(*) FROM jobs GROUP BY state ORDER BY state"};

inline constexpr Statement kSelectJobLayers{"select_job_layers",
                                            "SELECT num_layers FROM jobs WHERE id = $1"};

// ---- PTC -------------------------------------------------------------------

// $2 names, $3 dtypes, $4 shapes (each a bigint[] literal), $5 serialized
// PartitionSpecs in hex; idx is the position in the arrays.
inline constexpr Statement kInsertPtcTensors{
    "insert_ptc_tensors",
    "INSERT INTO ptc_tensors (job_id, idx, name, dtype, shape, partition_spec) "
    "SELECT $1, t.ord - 1, t.name, t.dtype, t.shape::bigint[], decode(t.spec, 'hex') "
    "FROM unnest($2::text[], $3::smallint[], $4::text[], $5::text[]) WITH ORDINALITY "
    "AS t(name, dtype, shape, spec, ord)"};

inline constexpr Statement kInsertPtcBlobs{
    "insert_ptc_blobs",
    "INSERT INTO ptc_blobs (job_id, idx, name, size_bytes, scope) "
    "SELECT $1, b.ord - 1, b.name, b.size_bytes, b.scope "
    "FROM unnest($2::text[], $3::bigint[], $4::smallint[]) WITH ORDINALITY "
    "AS b(name, size_bytes, scope, ord)"};

inline constexpr Statement kSelectPtcTensors{
    "select_ptc_tensors",
    "SELECT name, dtype, shape, partition_spec FROM ptc_tensors WHERE job_id = $1 ORDER BY idx"};

inline constexpr Statement kSelectPtcBlobs{
    "select_ptc_blobs",
    "SELECT name, size_bytes, scope FROM ptc_blobs WHERE job_id = $1 ORDER BY idx"};

// ---- Generations -----------------------------------------------------------

inline constexpr Statement kInsertGeneration{
    "insert_generation",
    "INSERT INTO generations (job_id, generation, layout, tp, pp, dp, world, state, "
    "operation_id) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, NULLIF($9, ''))"};

// $3 host ids and $4 devices in rank order.
inline constexpr Statement kInsertGenerationRanks{
    "insert_generation_ranks",
    "INSERT INTO generation_ranks (job_id, generation, rank, host_id, device) "
    "SELECT $1, $2, r.ord - 1, r.host_id, r.device "
    "FROM unnest($3::text[], $4::integer[]) WITH ORDINALITY AS r(host_id, device, ord)"};

inline constexpr Statement kMaxGeneration{
    "max_generation", "SELECT max(generation) FROM generations WHERE job_id = $1"};

inline constexpr Statement kDiscardPendingGeneration{
    "discard_pending_generation",
    "UPDATE generations SET state = 4 WHERE job_id = $1 AND generation = $2 AND state = 2"};

inline constexpr Statement kRetireCurrentGeneration{
    "retire_current_generation",
    "UPDATE generations SET state = 3 WHERE job_id = $1 AND state = 1"};

inline constexpr Statement kPromotePendingGeneration{
    "promote_pending_generation",
    "UPDATE generations SET state = 1, committed_at = now() "
    "WHERE job_id = $1 AND generation = $2 AND state = 2 RETURNING generation"};

inline constexpr Statement kAdvanceJob{
    "advance_job",
    "UPDATE jobs j SET generation = $2, state = CASE WHEN EXISTS (SELECT 1 FROM "
    "generation_ranks r JOIN hosts h ON h.id = r.host_id WHERE r.job_id = j.id AND "
    "r.generation = $2 AND h.state = 2) THEN 3 ELSE 1 END, updated_at = now() WHERE j.id = $1"};

// $1 job, $2 the operation being committed: one more layout epoch unless the
// operation is a checkpoint (kind 4), which keeps the layout and its world.
inline constexpr Statement kBumpLayoutEpoch{
    "bump_layout_epoch",
    "UPDATE jobs SET layout_epoch = layout_epoch + 1 WHERE id = $1 AND EXISTS (SELECT 1 "
    "FROM operations o WHERE o.id = $2 AND o.kind <> 4)"};

// $3 ranks, $4 packed checksums in hex.
inline constexpr Statement kStoreRankChecksums{
    "store_rank_checksums",
    "UPDATE generation_ranks r SET checksums = decode(c.hex, 'hex') "
    "FROM unnest($3::integer[], $4::text[]) AS c(rank, hex) "
    "WHERE r.job_id = $1 AND r.generation = $2 AND r.rank = c.rank"};

inline constexpr Statement kSelectRankChecksums{
    "select_rank_checksums",
    "SELECT rank, checksums FROM generation_ranks WHERE job_id = $1 AND generation = $2 "
    "AND checksums IS NOT NULL ORDER BY rank"};

inline constexpr Statement kGenerationsToRelease{
    "generations_to_release",
    "SELECT g.job_id, g.generation FROM generations g WHERE g.state = 3 AND EXISTS (SELECT 1 "
    "FROM generation_ranks r WHERE r.host_id = $1 AND r.job_id = g.job_id AND "
    "r.generation = g.generation) ORDER BY g.job_id, g.generation"};

inline constexpr Statement kGenerationsToDiscard{
    "generations_to_discard",
    "SELECT g.job_id, g.generation FROM generations g WHERE g.state = 4 AND EXISTS (SELECT 1 "
    "FROM generation_ranks r WHERE r.host_id = $1 AND r.job_id = g.job_id AND "
    "r.generation = g.generation) ORDER BY g.job_id, g.generation"};

// ---- Idempotency (pg_idempotency.cc) ---------------------------------------
// $1 the caller's tenants (the key's scope, migrations/0012), $2 the key.

inline constexpr Statement kSelectIdempotencyKey{
    "select_idempotency_key",
    "SELECT method, request_hash, resource_id FROM idempotency_keys WHERE tenants = $1::text[] "
    "AND key = $2"};

inline constexpr Statement kClaimIdempotencyKey{
    "claim_idempotency_key",
    "INSERT INTO idempotency_keys (tenants, key, method, request_hash, resource_id, job_id) "
    "VALUES ($1::text[], $2, $3, $4, $5, NULLIF($6, '')) ON CONFLICT (tenants, key) DO NOTHING "
    "RETURNING key"};

// ---- Operations ------------------------------------------------------------

// The columns OperationFromRow (pg_codec.h) reads.
#define RESHARD_PG_OPERATION_COLUMNS                                                        \
  "o.id, o.job_id, o.kind, o.state, o.from_generation, o.to_generation, o.error, o.stats, " \
  "o.bytes_done, o.bytes_total, o.idempotency_key, reshard_unix_ms(o.created_at), "         \
  "reshard_unix_ms(o.updated_at), o.target_layout, o.lost_hosts, o.lost_ranks, "            \
  "o.stop_free, reshard_unix_ms(o.prepared_at), reshard_unix_ms(o.cutover_at), "            \
  "o.cutover_operation_id, reshard_unix_ms(o.workers_prepared_at), "                        \
  "reshard_unix_ms(o.agents_prepared_at), o.prepared_from_generation, o.bytes_precopied, "  \
  "o.bytes_skipped_unchanged, o.queued_behind_operation_id, o.step_boundary, "              \
  "o.step_boundary_deadline_unix_ms, o.step_boundary_checkpoint_id, "                       \
  "o.step_boundary_timeout_ms, o.version, o.prediction, reshard_unix_ms(o.planned_at), "    \
  "o.deadline_unix_ms, o.deadline_abort "

inline constexpr Statement kSelectOperation{
    "select_operation", "SELECT " RESHARD_PG_OPERATION_COLUMNS "FROM operations o WHERE o.id = $1"};

inline constexpr Statement kSelectOperationWithPlan{
    "select_operation_with_plan", "SELECT " RESHARD_PG_OPERATION_COLUMNS
                                  ", o.plan, o.skipped_steps FROM operations o WHERE o.id = $1"};

inline constexpr Statement kListOperationsForJob{
    "list_operations_for_job", "SELECT " RESHARD_PG_OPERATION_COLUMNS
                               "FROM operations o WHERE o.job_id = $1 ORDER BY o.seq DESC"};

inline constexpr Statement kListActiveOperations{
    "list_active_operations",
    "SELECT id FROM operations WHERE " RESHARD_SQL_OP_ACTIVE("") " ORDER BY seq"};

// Columns 2.. are what the meeting rule reads (pg_meeting.cc, ActiveOperation).
inline constexpr Statement kActiveOperationOfJob{
    "active_operation_of_job",
    "SELECT id, state, kind, stop_free, step_boundary, COALESCE(queued_behind_operation_id, ''), "
    "COALESCE(step_boundary_checkpoint_id, ''), to_generation FROM operations "
    "WHERE job_id = $1 AND " RESHARD_SQL_OP_ACTIVE("") " ORDER BY seq"};

// $10.. (migrations/0013): the checkpoint it is queued behind ('' none),
// its step boundary (StepBoundary), that one's timeout and deadline; in the
// row from the start, as the one-active-operation index reads them.
inline constexpr Statement kInsertOperation{
    "insert_operation",
    "INSERT INTO operations (id, job_id, kind, state, from_generation, to_generation, "
    "target_layout, lost_hosts, lost_ranks, idempotency_key, queued_behind_operation_id, "
    "step_boundary, step_boundary_timeout_ms, step_boundary_deadline_unix_ms) "
    "VALUES ($1, $2, $3, " RESHARD_SQL_OP_PENDING
    ", $4, $5, $6, $7::text[], $8::integer[], $9, NULLIF($10, ''), "
    "$11::smallint, $12::bigint, $13::bigint)"};

inline constexpr Statement kLockOperation{
    "lock_operation",
    "SELECT job_id, state, from_generation, to_generation, target_layout FROM operations "
    "WHERE id = $1 FOR UPDATE"};

inline constexpr Statement kOperationState{"operation_state",
                                           "SELECT state FROM operations WHERE id = $1"};

// What the operation's phase is read from (OpFacts, in its order).
inline constexpr Statement kOperationFacts{
    "operation_facts",
    "SELECT state, stop_free, prepared_from_generation > 0, agents_prepared_at IS NOT NULL, "
    "cutover_operation_id IS NOT NULL, queued_behind_operation_id IS NOT NULL, "
    "step_boundary = 1 FROM operations WHERE id = $1"};

// Compare-and-set: only from state $2. Each optional field has a "set" flag.
inline constexpr Statement kTransitionOperation{
    "transition_operation",
    "UPDATE operations SET state = $3::smallint, "
    "plan = CASE WHEN $4::boolean THEN $5::bytea ELSE plan END, "
    "stats = CASE WHEN $6::boolean THEN $7::bytea ELSE stats END, "
    "error = CASE WHEN $8::boolean THEN $9::text ELSE error END, "
    "bytes_total = CASE WHEN $10::boolean THEN $11::bigint ELSE bytes_total END, "
    "prediction = CASE WHEN $12::boolean THEN $13::bytea ELSE prediction END, "
    "planned_at = CASE WHEN $4::boolean THEN now() ELSE planned_at END, "
    "updated_at = now(), "
    "finished_at = CASE WHEN $3::smallint IN " RESHARD_SQL_OP_TERMINAL_LIST
    " THEN now() ELSE finished_at END "
    "WHERE id = $1 AND state = $2::smallint RETURNING job_id, to_generation"};

inline constexpr Statement kSetOperationTransferring{
    "set_operation_transferring",
    "UPDATE operations SET state = " RESHARD_SQL_OP_TRANSFERRING
    ", updated_at = now() WHERE id = $1"};

inline constexpr Statement kFinishCommittedOperation{
    "finish_committed_operation",
    "UPDATE operations SET state = " RESHARD_SQL_OP_COMMITTED
    ", updated_at = now(), finished_at = now() WHERE id = $1"};

inline constexpr Statement kUpdateOperationBytesDone{
    "update_operation_bytes_done",
    "UPDATE operations SET bytes_done = (SELECT coalesce(sum(bytes_done), 0) FROM "
    "operation_hosts WHERE operation_id = $1), updated_at = now() WHERE id = $1"};

inline constexpr Statement kOperationsOnHosts{
    "operations_on_hosts",
    "SELECT o.id FROM operations o WHERE " RESHARD_SQL_OP_ACTIVE("o.") " AND EXISTS (SELECT 1 FROM "
    "operation_hosts oh WHERE oh.operation_id = o.id AND oh.host_id = ANY($1::text[])) "
    "ORDER BY o.seq"};

// ---- Per-host progress -----------------------------------------------------

// $2 host ids, $3 states, $4 bytes done, $5 bytes total, $6 errors, $7 progress times.
inline constexpr Statement kInsertOperationHosts{
    "insert_operation_hosts",
    "INSERT INTO operation_hosts (operation_id, host_id, state, bytes_done, bytes_total, error, "
    "progress_unix_ms) SELECT $1, h.host_id, h.state, h.bytes_done, h.bytes_total, h.error, "
    "h.progress FROM unnest($2::text[], $3::smallint[], $4::bigint[], $5::bigint[], $6::text[], "
    "$7::bigint[]) AS h(host_id, state, bytes_done, bytes_total, error, progress)"};

// A host's DONE (3) or FAILED (4) is final, and so is PREPARED (5) in the
// prepare phase: a late RUNNING report keeps it.
// A report without a total keeps the one recorded. Progress ($7, the time) is
// a change of state or of bytes_done; the same report again is none. A report
// without a route ($9 empty) keeps the stored route and its reason.
inline constexpr Statement kUpdateHostProgress{
    "update_host_progress",
    "UPDATE operation_hosts SET state = CASE WHEN state IN (3, 4, 5) AND $3::smallint NOT IN "
    "(3, 4, 5) THEN state ELSE $3::smallint END, bytes_done = $4, bytes_total = CASE WHEN "
    "$5::bigint > 0 THEN $5::bigint ELSE bytes_total END, error = $6, updated_at = now(), "
    "progress_unix_ms = CASE WHEN state <> $3::smallint OR bytes_done <> $4::bigint THEN "
    "$7::bigint ELSE progress_unix_ms END, waiting_on = $8, route = CASE WHEN $9::text = '' "
    "THEN route ELSE $9::text END, route_reason = CASE WHEN $9::text = '' THEN route_reason "
    "ELSE $10::text END "
    "WHERE operation_id = $1 AND host_id = $2 RETURNING host_id"};

inline constexpr Statement kSelectHostProgress{
    "select_host_progress",
    "SELECT host_id, state, bytes_done, bytes_total, error, progress_unix_ms, waiting_on, route, "
    "route_reason FROM operation_hosts "
    "WHERE operation_id = $1 ORDER BY host_id"};

inline constexpr Statement kAssignedOperations{
    "assigned_operations",
    "SELECT o.id FROM operation_hosts oh JOIN operations o ON o.id = oh.operation_id "
    "WHERE oh.host_id = $1 AND ((" RESHARD_SQL_OP_IS_TRANSFERRING("o.")
    " AND oh.state NOT IN (3, 4)) OR "
    "(" RESHARD_SQL_OP_AGENTS_PREPARE("o.") " AND oh.state IN (1, 2))) ORDER BY o.seq"};

// $1 host ids: one notification each, delivered at commit (PgListener).
inline constexpr Statement kNotifyTasks{
    "notify_tasks",
    "SELECT pg_notify('reshard_tasks', h) FROM unnest($1::text[]) AS h"};

// ---- Hosts -----------------------------------------------------------------

inline constexpr Statement kUpsertHost{
    "upsert_host",
    "INSERT INTO hosts (id, address, info, state, epoch, last_heartbeat_unix_ms, "
    "lease_expires_unix_ms) VALUES ($1, $2, $3, 1, 1, $4, $5) ON CONFLICT (id) DO UPDATE SET "
    "address = EXCLUDED.address, info = EXCLUDED.info, state = 1, epoch = hosts.epoch + 1, "
    "last_heartbeat_unix_ms = EXCLUDED.last_heartbeat_unix_ms, "
    "lease_expires_unix_ms = EXCLUDED.lease_expires_unix_ms, registered_at = now(), "
    "leaves_unix_ms = CASE WHEN hosts.leaves_unix_ms > $4 THEN hosts.leaves_unix_ms ELSE 0 END "
    "RETURNING epoch"};

// A host notice: when the host goes (0: none).
inline constexpr Statement kSetHostLeaves{
    "set_host_leaves", "UPDATE hosts SET leaves_unix_ms = $2 WHERE id = $1 RETURNING id"};

inline constexpr Statement kHeartbeatHost{
    "heartbeat_host",
    "UPDATE hosts SET last_heartbeat_unix_ms = $3, lease_expires_unix_ms = $4 "
    "WHERE id = $1 AND epoch = $2 AND state = 1 RETURNING id"};

inline constexpr Statement kHostEpochState{"host_epoch_state",
                                           "SELECT epoch, state FROM hosts WHERE id = $1"};

// The columns HostFromRow (pg_codec.h) reads.
#define RESHARD_PG_HOST_COLUMNS \
  "info, state, last_heartbeat_unix_ms, lease_expires_unix_ms, leaves_unix_ms "

// ---- Bearer tokens (migrations/0004) ----------------------------------------

// The columns TokenFromRow (pg_auth.cc) reads.
#define RESHARD_PG_TOKEN_COLUMNS \
  "id, name, role, tenants, created_by, created_unix_ms, expires_unix_ms, revoked_unix_ms "

inline constexpr Statement kInsertToken{
    "insert_token",
    "INSERT INTO auth_tokens (id, secret_sha256, name, role, tenants, created_by, "
    "created_unix_ms, expires_unix_ms) VALUES ($1, $2, $3, $4, $5::text[], $6, $7, $8)"};
inline constexpr Statement kSelectTokenByHash{"select_token_by_hash",
                                              "SELECT " RESHARD_PG_TOKEN_COLUMNS
                                              "FROM auth_tokens WHERE secret_sha256 = $1"};
inline constexpr Statement kRevokeToken{
    "revoke_token",
    "UPDATE auth_tokens SET revoked_unix_ms = COALESCE(revoked_unix_ms, $2) WHERE id = $1 "
    "RETURNING " RESHARD_PG_TOKEN_COLUMNS};
inline constexpr Statement kListTokens{
    "list_tokens", "SELECT " RESHARD_PG_TOKEN_COLUMNS "FROM auth_tokens ORDER BY id"};

// ---- Cluster secrets (migrations/0006) ---------------------------------------

inline constexpr Statement kInsertClusterSecret{
    "insert_cluster_secret",
    "INSERT INTO cluster_secrets (name, secret) VALUES ($1, $2) ON CONFLICT (name) DO NOTHING"};
inline constexpr Statement kSelectClusterSecret{
    "select_cluster_secret", "SELECT secret FROM cluster_secrets WHERE name = $1"};

inline constexpr Statement kListHosts{"list_hosts",
                                      "SELECT " RESHARD_PG_HOST_COLUMNS "FROM hosts ORDER BY id"};
inline constexpr Statement kHostStates{"host_states", "SELECT id, state FROM hosts"};
inline constexpr Statement kHostRegistrations{
    "host_registrations", "SELECT count(*), COALESCE(sum(epoch), 0) FROM hosts"};
inline constexpr Statement kGetHosts{"get_hosts",
                                     "SELECT " RESHARD_PG_HOST_COLUMNS
                                     "FROM hosts WHERE id = ANY($1::text[]) ORDER BY id"};

inline constexpr Statement kSelectHost{
    "select_host", "SELECT " RESHARD_PG_HOST_COLUMNS "FROM hosts WHERE id = $1"};

// Marks the hosts LOST and, for every job whose current generation places a
// rank on one, records it in job_lost_hosts (in the same statement).
inline constexpr Statement kExpiredLeases{
    "expired_leases",
    "SELECT id FROM hosts WHERE state = 1 AND lease_expires_unix_ms < $1 ORDER BY id"};

inline constexpr Statement kExpireLeases{
    "expire_leases",
    "WITH expired AS (UPDATE hosts SET state = 2 WHERE state = 1 AND lease_expires_unix_ms < $1 "
    "RETURNING id), marked AS (INSERT INTO job_lost_hosts (job_id, host_id) SELECT DISTINCT "
    "r.job_id, r.host_id FROM generation_ranks r JOIN jobs j ON j.id = r.job_id AND "
    "j.generation = r.generation JOIN expired e ON e.id = r.host_id ON CONFLICT DO NOTHING) "
    "SELECT id FROM expired"};

inline constexpr Statement kJobsOnHosts{
    "jobs_on_hosts",
    "SELECT DISTINCT r.job_id FROM generation_ranks r JOIN jobs j ON j.id = r.job_id AND "
    "j.generation = r.generation WHERE r.host_id = ANY($1::text[]) ORDER BY r.job_id"};

// ---- Retention (issue 9, defect 10; pg_retention.cc) -------------------------
// Each deletes at most $N rows, oldest first. "Retired before" = a newer
// generation of the job committed before the cutoff; the newest $keep
// RETIRED generations of a job are kept (the OFFSET subquery finds the
// (keep+1)-th newest through the generations primary key).

// $1 keep, $2 min age ms, $3 batch rows.
inline constexpr Statement kPruneRetiredGenerations{
    "prune_retired_generations",
    "DELETE FROM generations d USING (SELECT g.job_id, g.generation FROM generations g "
    "WHERE g.state = 3 AND g.generation <= (SELECT n.generation FROM generations n WHERE "
    "n.job_id = g.job_id AND n.state = 3 ORDER BY n.generation DESC OFFSET $1::integer LIMIT 1) "
    "AND EXISTS (SELECT 1 FROM generations c WHERE c.job_id = g.job_id AND c.generation > "
    "g.generation AND c.committed_at < now() - $2::bigint * interval '1 millisecond') "
    "ORDER BY g.job_id, g.generation LIMIT $3::integer) v "
    "WHERE d.job_id = v.job_id AND d.generation = v.generation AND d.state = 3"};

// $1 min age ms, $2 batch rows. Age: since the operation that built it
// ended (its creation when that row is gone).
inline constexpr Statement kPruneDiscardedGenerations{
    "prune_discarded_generations",
    "DELETE FROM generations d USING (SELECT g.job_id, g.generation FROM generations g "
    "WHERE g.state = 4 AND coalesce((SELECT o.finished_at FROM operations o WHERE o.id = "
    "g.operation_id), g.created_at) < now() - $1::bigint * interval '1 millisecond' "
    "ORDER BY g.job_id, g.generation LIMIT $2::integer) v "
    "WHERE d.job_id = v.job_id AND d.generation = v.generation AND d.state = 4"};

// $1 keep, $2 min age ms, $3 batch rows. Only COMMITTED/ABORTED/FAILED
// (4, 5, 6); their idempotency keys go with them (a retry then finds
// nothing, which is right a week later).
inline constexpr Statement kPruneOperations{
    "prune_operations",
    "WITH v AS (SELECT o.id FROM operations o WHERE " RESHARD_SQL_OP_TERMINAL("o.")
    " AND o.finished_at < "
    "now() - $2::bigint * interval '1 millisecond' AND o.seq <= (SELECT n.seq FROM operations n "
    "WHERE n.job_id = o.job_id ORDER BY n.seq DESC OFFSET $1::integer LIMIT 1) "
    "ORDER BY o.finished_at LIMIT $3::integer), "
    "k AS (DELETE FROM idempotency_keys i USING v WHERE i.resource_id = v.id AND i.job_id IS NOT "
    "NULL) DELETE FROM operations d USING v WHERE d.id = v.id AND " RESHARD_SQL_OP_TERMINAL("d.")};

// ---- Liveness: deleted jobs, lost hosts of jobs (issue 9) --------------------

// Of the job ids $1, those without a row (ids are never reused: deleted).
inline constexpr Statement kDeletedJobs{
    "deleted_jobs",
    "SELECT h.id FROM unnest($1::text[]) WITH ORDINALITY AS h(id, ord) WHERE NOT EXISTS "
    "(SELECT 1 FROM jobs j WHERE j.id = h.id) ORDER BY h.ord"};

// Of the (job, generation) pairs $1, $2 (text arrays), those that are not a
// CURRENT (1) or PENDING (2) generation.
inline constexpr Statement kStaleGenerations{
    "stale_generations",
    "SELECT m.job_id, m.generation FROM unnest($1::text[], $2::text[]::bigint[]) WITH ORDINALITY "
    "AS m(job_id, generation, ord) WHERE NOT EXISTS (SELECT 1 FROM generations g WHERE g.job_id "
    "= m.job_id AND g.generation = m.generation AND g.state IN (1, 2)) ORDER BY m.ord"};

inline constexpr Statement kJobsLostOnHost{
    "jobs_lost_on_host", "SELECT job_id FROM job_lost_hosts WHERE host_id = $1 ORDER BY job_id"};

inline constexpr Statement kClearJobLostHost{
    "clear_job_lost_host", "DELETE FROM job_lost_hosts WHERE job_id = $1 AND host_id = $2"};

// A commit replaces the generation whose hosts were lost.
inline constexpr Statement kClearJobLostHosts{"clear_job_lost_hosts",
                                              "DELETE FROM job_lost_hosts WHERE job_id = $1"};

// ACTIVE (1) <-> DEGRADED (3) by whether the job has lost hosts.
inline constexpr Statement kSettleJobLiveness{
    "settle_job_liveness",
    "UPDATE jobs j SET state = CASE WHEN " RESHARD_PG_JOB_HAS_LOST_HOSTS
    " THEN 3 ELSE 1 END, updated_at = now() WHERE j.id = $1 AND j.state IN (1, 3) "
    "RETURNING j.state"};

/// Every statement above, to prepare on each connection.
const std::vector<Statement>& AllStatements();

}  // namespace reshard::coordinator::pg
