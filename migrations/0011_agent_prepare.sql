-- Agents prepare a stop-free operation (docs/coordinator.md, "Agents
-- prepare"): while the operation waits in PLANNED, every host of its plan
-- pre-copies the new layout from prepared_from_generation into the buffers
-- of the operation's to_generation (inserted PENDING when the prepare
-- starts) and reports PREPARED (HostTaskState 5) with the checksums of the
-- old shards it read (operation_prepared_sources). The operation is
-- prepared (prepared_at) once the workers (MarkPrepared,
-- workers_prepared_at) and every agent (agents_prepared_at) are: the later
-- of the two. At the cut-over, the steps whose source shard did not change
-- since are skipped (skipped_steps, plan step indexes ascending).
ALTER TABLE operations
  ADD COLUMN workers_prepared_at      TIMESTAMPTZ,
  ADD COLUMN agents_prepared_at       TIMESTAMPTZ,
  ADD COLUMN prepared_from_generation BIGINT    NOT NULL DEFAULT 0,
  ADD COLUMN bytes_precopied          BIGINT    NOT NULL DEFAULT 0,
  ADD COLUMN bytes_skipped_unchanged  BIGINT    NOT NULL DEFAULT 0,
  ADD COLUMN skipped_steps            INTEGER[] NOT NULL DEFAULT '{}';
-- Before this migration prepared_at was MarkPrepared's time alone, and
-- agents did not prepare: an active stop-free operation counts its agents
-- prepared (nothing to wait for) and keeps its prepared_at; its
-- prepared_from_generation stays 0, so its transfer moves the whole plan
-- and its cut-over takes the next generation number (it reserved none).
UPDATE operations SET workers_prepared_at = prepared_at WHERE prepared_at IS NOT NULL;
UPDATE operations SET agents_prepared_at = now() WHERE stop_free AND state IN (1, 2);

-- The sealed checksum of every old shard (item, rank of
-- prepared_from_generation) a host read during its prepare. A source rank
-- lives on one host, so (operation, item, rank) names one row.
CREATE TABLE operation_prepared_sources (
  operation_id TEXT    NOT NULL REFERENCES operations (id) ON DELETE CASCADE,
  item         INTEGER NOT NULL,
  rank         INTEGER NOT NULL,
  host_id      TEXT    NOT NULL,
  checksum     BIGINT  NOT NULL,  -- the uint64 checksum, bit for bit
  bytes        BIGINT  NOT NULL,
  PRIMARY KEY (operation_id, item, rank)
);

-- A host row is in the prepare phase while its operation is PLANNED and in
-- the transfer phase once it is TRANSFERRING (the operation's state is the
-- phase marker); PREPARED (5) ends the first. bytes_precopied: what the
-- host's prepare wrote (its bytes_total of the prepare phase).
ALTER TABLE operation_hosts DROP CONSTRAINT operation_hosts_state_check;
ALTER TABLE operation_hosts ADD CONSTRAINT operation_hosts_state_check
  CHECK (state BETWEEN 1 AND 5);
ALTER TABLE operation_hosts ADD COLUMN bytes_precopied BIGINT NOT NULL DEFAULT 0;

-- A prepared stop-free operation's generation is PENDING from its prepare
-- on, and its cut-over checkpoint's generation is PENDING beside it: one
-- pending generation per operation, not per job.
DROP INDEX generations_one_pending_per_job;
CREATE UNIQUE INDEX generations_one_pending_per_operation ON generations (job_id, operation_id)
  WHERE state = 2;
