-- Two-phase (stop-free) reconfiguration (docs/coordinator.md, "Stop-free
-- reconfiguration"): a resize or migrate that waits in PLANNED, the old
-- layout training on, until its new workers are warm (prepared_at) and the
-- old ones cut over at a step boundary with a checkpoint (cutover_at,
-- cutover_operation_id), whose generation becomes its source.
ALTER TABLE operations ADD COLUMN stop_free BOOLEAN NOT NULL DEFAULT false;
ALTER TABLE operations ADD COLUMN prepared_at TIMESTAMPTZ;
ALTER TABLE operations ADD COLUMN cutover_at TIMESTAMPTZ;
ALTER TABLE operations ADD COLUMN cutover_operation_id TEXT;
