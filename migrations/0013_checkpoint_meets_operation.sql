-- A checkpoint and an operation that meet (docs/coordinator.md, "Checkpoints
-- and operations"): a reconfiguration requested while a checkpoint is in
-- flight is queued behind it, and a stop-the-world one may wait for the job's
-- next step boundary. No new operation state: such an operation is PENDING
-- and these columns say what it waits for. Never edit once landed.
--   queued_behind_operation_id  the checkpoint it waits for (NULL: none);
--                               its to_generation is 0 while set
--   step_boundary               Operation.step_boundary (StepBoundary): 0 not
--                               asked, 1 WAITING, 2 CHECKPOINTING, 3 REACHED,
--                               4 TIMED_OUT, 5 CHECKPOINT_ENDED
--   step_boundary_timeout_ms    how long it waits once it may (its request's)
--   step_boundary_deadline_unix_ms  WAITING until then (coordinator clock);
--                               0 while queued
--   step_boundary_checkpoint_id the checkpoint that named it
ALTER TABLE operations
  ADD COLUMN queued_behind_operation_id     TEXT,
  ADD COLUMN step_boundary                  SMALLINT NOT NULL DEFAULT 0
    CHECK (step_boundary BETWEEN 0 AND 5),
  ADD COLUMN step_boundary_timeout_ms       BIGINT   NOT NULL DEFAULT 0
    CHECK (step_boundary_timeout_ms >= 0),
  ADD COLUMN step_boundary_deadline_unix_ms BIGINT   NOT NULL DEFAULT 0,
  ADD COLUMN step_boundary_checkpoint_id    TEXT;
-- A PENDING operation that waits (queued, or for its step boundary) shares
-- its job with the checkpoint it waits for, as a PLANNED stop-free one does
-- with its cut-over (0009). The job's row lock (CreateOperation) is the guard.
DROP INDEX operations_one_active_per_job;
CREATE UNIQUE INDEX operations_one_active_per_job ON operations (job_id)
  WHERE state IN (1, 2, 3) AND NOT (stop_free AND state = 2)
    AND NOT (state = 1 AND (queued_behind_operation_id IS NOT NULL OR step_boundary = 1));
