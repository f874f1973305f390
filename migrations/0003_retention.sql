-- Indexes for the retention policy's pruning (docs/coordinator.md,
-- "Retention"; services/coordinator/store/pg_retention.cc). Never edit once
-- landed.

-- prune_operations: finished operations, oldest first.
CREATE INDEX operations_finished_by_time ON operations (finished_at) WHERE state IN (4, 5, 6);
-- prune_operations removes a pruned operation's idempotency keys.
CREATE INDEX idempotency_keys_by_resource ON idempotency_keys (resource_id);
