-- Elastic policies (issue 35; docs/scheduler.md, "Elastic policies"): a
-- job's policy (an ElasticPolicy message; NULL: none) and what the leader's
-- policy engine did last or waits for. Never edit once landed.
ALTER TABLE jobs
  ADD COLUMN policy bytea,
  ADD COLUMN policy_status text NOT NULL DEFAULT '';
