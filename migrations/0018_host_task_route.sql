-- The route of each host's task (issue 23; docs/coordinator.md, "The route
-- of each host's task"): how the agent moves the task's bytes ("host",
-- "device-direct", "device-comm nccl", "host-staged", ...) and, for a
-- fallback, why. Reported by the agent with every ReportProgress; an empty
-- report keeps what is stored. Shown in GetOperation's Operation.hosts.
-- Never edit once landed.
ALTER TABLE operation_hosts
  ADD COLUMN route text NOT NULL DEFAULT '',
  ADD COLUMN route_reason text NOT NULL DEFAULT '';
