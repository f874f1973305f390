-- reshard-coordinator schema, version 1. See docs/coordinator.md.
--
-- Conventions:
--   * Enums are SMALLINT holding the proto numbers (reshard.v1.JobState,
--     OperationState, HostState, HostTaskState, DType, BlobScope) or, for
--     generations, store.h's GenerationState.
--   * Protos that only the coordinator reads back whole (Layout,
--     PartitionSpec, TransferPlan, PlanStats, Host) are serialized BYTEA.
--   * Times the database sets are TIMESTAMPTZ; times that come from the
--     coordinator's injected clock (host leases) are BIGINT unix milliseconds.
--   * Everything under a job goes with it: ON DELETE CASCADE from jobs.
--
-- Applied in one transaction by the migrator, which records it in
-- schema_migrations. Never edit this file once landed; add 0002_*.sql.

-- Read by the migrator before anything else (a database without it is at
-- version 0). Every later migration is recorded here by the migrator.
CREATE TABLE schema_migrations (
  version    INTEGER     PRIMARY KEY,
  name       TEXT        NOT NULL,
  applied_at TIMESTAMPTZ NOT NULL DEFAULT now()
);

-- Milliseconds since the Unix epoch, as the API reports times.
CREATE FUNCTION reshard_unix_ms(t TIMESTAMPTZ) RETURNS BIGINT
  LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
  AS $$ SELECT floor(extract(epoch FROM t) * 1000)::bigint $$;

-- Hosts and their agents' leases.
CREATE TABLE hosts (
  id                     TEXT        PRIMARY KEY,
  address                TEXT        NOT NULL,
  -- reshard.v1.Host without state / last heartbeat / lease (columns below).
  info                   BYTEA       NOT NULL,
  state                  SMALLINT    NOT NULL CHECK (state IN (1, 2)),  -- HostState
  epoch                  BIGINT      NOT NULL CHECK (epoch > 0),
  last_heartbeat_unix_ms BIGINT      NOT NULL,
  lease_expires_unix_ms  BIGINT      NOT NULL,
  registered_at          TIMESTAMPTZ NOT NULL DEFAULT now()
);
-- ExpireLeases scans only live hosts.
CREATE INDEX hosts_alive_by_lease ON hosts (lease_expires_unix_ms) WHERE state = 1;

CREATE TABLE jobs (
  id           TEXT        PRIMARY KEY,
  tenant       TEXT        NOT NULL,
  name         TEXT        NOT NULL,
  state        SMALLINT    NOT NULL CHECK (state BETWEEN 1 AND 4),  -- JobState
  generation   BIGINT      NOT NULL CHECK (generation > 0),         -- current one
  num_layers   INTEGER     NOT NULL,
  tensor_count INTEGER     NOT NULL,
  total_bytes  BIGINT      NOT NULL,
  created_at   TIMESTAMPTZ NOT NULL DEFAULT now(),
  updated_at   TIMESTAMPTZ NOT NULL DEFAULT now(),
  CONSTRAINT jobs_tenant_name_key UNIQUE (tenant, name)
);
-- ListJobs: WHERE tenant = ? [AND state = ?] AND id > ? ORDER BY id.
CREATE INDEX jobs_by_tenant_state_id ON jobs (tenant, state, id);
-- ListJobs with only a state filter.
CREATE INDEX jobs_by_state_id ON jobs (state, id);

-- The PTC: one row per tensor (a 175B job has ~4,600) and per blob.
CREATE TABLE ptc_tensors (
  job_id         TEXT     NOT NULL REFERENCES jobs (id) ON DELETE CASCADE,
  idx            INTEGER  NOT NULL,  -- position in Ptc.tensors
  name           TEXT     NOT NULL,
  dtype          SMALLINT NOT NULL,  -- DType
  shape          BIGINT[] NOT NULL,
  partition_spec BYTEA    NOT NULL,  -- reshard.v1.PartitionSpec
  PRIMARY KEY (job_id, idx),
  CONSTRAINT ptc_tensors_job_name_key UNIQUE (job_id, name)
);

CREATE TABLE ptc_blobs (
  job_id     TEXT     NOT NULL REFERENCES jobs (id) ON DELETE CASCADE,
  idx        INTEGER  NOT NULL,  -- position in Ptc.blobs
  name       TEXT     NOT NULL,
  size_bytes BIGINT   NOT NULL,
  scope      SMALLINT NOT NULL,  -- BlobScope
  PRIMARY KEY (job_id, idx),
  CONSTRAINT ptc_blobs_job_name_key UNIQUE (job_id, name)
);

-- One (config, placement, shard set) of a job. Generation numbers are never
-- reused within a job, so (job, generation) names one set of agent buffers.
CREATE TABLE generations (
  job_id       TEXT        NOT NULL REFERENCES jobs (id) ON DELETE CASCADE,
  generation   BIGINT      NOT NULL CHECK (generation > 0),
  layout       BYTEA       NOT NULL,  -- reshard.v1.Layout
  tp           INTEGER     NOT NULL,
  pp           INTEGER     NOT NULL,
  dp           INTEGER     NOT NULL,
  world        INTEGER     NOT NULL,
  -- 1 CURRENT, 2 PENDING, 3 RETIRED, 4 DISCARDED (store.h GenerationState).
  state        SMALLINT    NOT NULL CHECK (state BETWEEN 1 AND 4),
  operation_id TEXT,  -- the operation that built it; NULL for generation 1
  created_at   TIMESTAMPTZ NOT NULL DEFAULT now(),
  committed_at TIMESTAMPTZ,
  PRIMARY KEY (job_id, generation)
);
CREATE UNIQUE INDEX generations_one_current_per_job ON generations (job_id) WHERE state = 1;
CREATE UNIQUE INDEX generations_one_pending_per_job ON generations (job_id) WHERE state = 2;
-- Heartbeat's release / discard lists.
CREATE INDEX generations_to_free ON generations (state, job_id, generation) WHERE state IN (3, 4);

-- rank -> (host, device) of a generation, so that host queries are SQL. The
-- checksums of the rank's shards (reported by its agent when the generation
-- is built) are packed into one BYTEA: 20 bytes per shard, little-endian
-- (int32 plan item, uint64 checksum, int64 bytes). Never one row per shard:
-- a 175B job has ~300k shards per generation.
CREATE TABLE generation_ranks (
  job_id     TEXT    NOT NULL,
  generation BIGINT  NOT NULL,
  rank       INTEGER NOT NULL,
  host_id    TEXT    NOT NULL,  -- not a foreign key: layouts may name unregistered hosts
  device     INTEGER NOT NULL,
  checksums  BYTEA,
  PRIMARY KEY (job_id, generation, rank),
  FOREIGN KEY (job_id, generation) REFERENCES generations (job_id, generation) ON DELETE CASCADE
);
-- JobsOnHosts, lost hosts of a job, release / discard lists.
CREATE INDEX generation_ranks_by_host ON generation_ranks (host_id, job_id, generation);

CREATE TABLE operations (
  id              TEXT        PRIMARY KEY,
  seq             BIGINT      GENERATED ALWAYS AS IDENTITY,  -- creation order
  job_id          TEXT        NOT NULL REFERENCES jobs (id) ON DELETE CASCADE,
  kind            SMALLINT    NOT NULL CHECK (kind BETWEEN 1 AND 3),   -- OperationKind
  state           SMALLINT    NOT NULL CHECK (state BETWEEN 1 AND 6),  -- OperationState
  from_generation BIGINT      NOT NULL,
  to_generation   BIGINT      NOT NULL,
  target_layout   BYTEA       NOT NULL,  -- reshard.v1.Layout
  lost_hosts      TEXT[]      NOT NULL DEFAULT '{}',
  lost_ranks      INTEGER[]   NOT NULL DEFAULT '{}',
  plan            BYTEA,                 -- reshard.v1.TransferPlan, once PLANNED
  stats           BYTEA,                 -- reshard.v1.PlanStats, once PLANNED
  error           TEXT        NOT NULL DEFAULT '',
  bytes_done      BIGINT      NOT NULL DEFAULT 0,
  bytes_total     BIGINT      NOT NULL DEFAULT 0,
  idempotency_key TEXT        NOT NULL DEFAULT '',
  created_at      TIMESTAMPTZ NOT NULL DEFAULT now(),
  updated_at      TIMESTAMPTZ NOT NULL DEFAULT now(),
  finished_at     TIMESTAMPTZ
);
-- At most one active (PENDING, PLANNED, TRANSFERRING) operation per job.
CREATE UNIQUE INDEX operations_one_active_per_job ON operations (job_id) WHERE state IN (1, 2, 3);
-- Idempotency keys are global (idempotency_keys below); an operation carries
-- at most one and a key names at most one operation.
CREATE UNIQUE INDEX operations_idempotency_key ON operations (idempotency_key)
  WHERE idempotency_key <> '';
CREATE INDEX operations_by_job ON operations (job_id, seq);
CREATE INDEX operations_active ON operations (seq) WHERE state IN (1, 2, 3);

-- Each host's part of a TRANSFERRING (or finished) operation.
CREATE TABLE operation_hosts (
  operation_id TEXT        NOT NULL REFERENCES operations (id) ON DELETE CASCADE,
  host_id      TEXT        NOT NULL,
  state        SMALLINT    NOT NULL CHECK (state BETWEEN 1 AND 4),  -- HostTaskState
  bytes_done   BIGINT      NOT NULL DEFAULT 0,
  bytes_total  BIGINT      NOT NULL DEFAULT 0,
  error        TEXT        NOT NULL DEFAULT '',
  updated_at   TIMESTAMPTZ NOT NULL DEFAULT now(),
  PRIMARY KEY (operation_id, host_id)
);
CREATE INDEX operation_hosts_by_host ON operation_hosts (host_id, operation_id);

-- Idempotency keys of mutating calls (RegisterJob, Resize, Migrate,
-- RecoverFromFailure, DeleteJob, CancelOperation): the first call's method,
-- request hash and resulting resource. Rows of a job go with it; rows
-- without a job_id (a DeleteJob's key) outlive it.
CREATE TABLE idempotency_keys (
  key          TEXT        PRIMARY KEY,
  method       TEXT        NOT NULL,
  request_hash BYTEA       NOT NULL,
  resource_id  TEXT        NOT NULL,
  job_id       TEXT        REFERENCES jobs (id) ON DELETE CASCADE,
  created_at   TIMESTAMPTZ NOT NULL DEFAULT now()
);
