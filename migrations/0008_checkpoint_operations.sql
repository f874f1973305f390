-- Checkpoint operations (OPERATION_KIND_CHECKPOINT = 4): a new generation on
-- the same layout that the job's workers publish at a step boundary
-- (docs/coordinator.md, "Checkpoints"). Only the kind's range changes.
ALTER TABLE operations DROP CONSTRAINT operations_kind_check;
ALTER TABLE operations ADD CONSTRAINT operations_kind_check CHECK (kind BETWEEN 1 AND 4);
-- A checkpoint may carry the step boundary whose state the workers publish:
-- its commit sets the new generation's dataset state to it in the same
-- transaction (docs/data.md). NULL: no step (every other operation).
ALTER TABLE operations ADD COLUMN step BIGINT CHECK (step >= 0);
ALTER TABLE operations ADD COLUMN step_cursor BIGINT CHECK (step_cursor >= 0);
