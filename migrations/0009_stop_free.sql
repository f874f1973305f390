-- Two-phase (stop-free) reconfiguration (docs/coordinator.md, "Stop-free
-- reconfiguration"): a resize or migrate that waits in PLANNED, the old
-- layout training on, until its new workers are warm (prepared_at) and the
-- old ones cut over at a step boundary with a checkpoint (cutover_at,
-- cutover_operation_id), whose generation becomes its source.
ALTER TABLE operations ADD COLUMN stop_free BOOLEAN NOT NULL DEFAULT false;
ALTER TABLE operations ADD COLUMN prepared_at TIMESTAMPTZ;
ALTER TABLE operations ADD COLUMN cutover_at TIMESTAMPTZ;
ALTER TABLE operations ADD COLUMN cutover_operation_id TEXT;
-- A stop-free operation waiting in PLANNED shares its job with the
-- checkpoint that cuts it over; the store lets only that checkpoint in
-- (CreateOperation). Every other active operation is still alone.
DROP INDEX operations_one_active_per_job;
CREATE UNIQUE INDEX operations_one_active_per_job ON operations (job_id)
  WHERE state IN (1, 2, 3) AND NOT (stop_free AND state = 2);
