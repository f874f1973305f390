-- The layout epoch (issue 20; Job.layout_epoch): how many reconfigurations
-- (resize, migrate, recover; not checkpoints) the job has committed. A
-- training world is started at an epoch and keeps it until the next
-- reconfiguration, so the world a stop-free operation warms up (epoch + 1)
-- and the one that trains meanwhile never share a rendezvous port
-- (`reshard run`, docs/pytorch.md "The launcher"). A counter, not a count of
-- operations: retention prunes finished operations. Never edit once landed.
ALTER TABLE jobs ADD COLUMN layout_epoch bigint NOT NULL DEFAULT 0;
