-- The cost of an operation before it starts (issue 35; docs/scheduler.md,
-- "The cost of an operation"): the coordinator's prediction, stored when the
-- operation is planned (a CostPrediction message), and when that was, so
-- that the operation's actual seconds (planned -> committed) can be set
-- beside it. Never edit once landed.
ALTER TABLE operations
  ADD COLUMN prediction bytea,
  ADD COLUMN planned_at timestamptz;
