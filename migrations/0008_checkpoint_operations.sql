-- Checkpoint operations (OPERATION_KIND_CHECKPOINT = 4): a new generation on
-- the same layout that the job's workers publish at a step boundary
-- (docs/coordinator.md, "Checkpoints"). Only the kind's range changes.
ALTER TABLE operations DROP CONSTRAINT operations_kind_check;
ALTER TABLE operations ADD CONSTRAINT operations_kind_check CHECK (kind BETWEEN 1 AND 4);
