-- Liveness of operations and lost hosts of jobs (issue 9, defects 4 and 6).
-- See docs/coordinator.md, "Operations" and "Hosts and leases".

-- When a host's task last made progress (its state or bytes_done changed),
-- in unix ms of the coordinator's clock; the driver aborts an operation
-- whose unfinished task made none for the stall timeout. waiting_on is what
-- the agent last said the task waits on.
ALTER TABLE operation_hosts
  ADD COLUMN progress_unix_ms BIGINT NOT NULL DEFAULT 0,
  ADD COLUMN waiting_on       TEXT   NOT NULL DEFAULT '';

-- Hosts a job counts as lost: written when a host of the job's current
-- generation loses its lease, removed when the host registers again with the
-- job's shards intact (checksums verified) or when an operation commits a
-- new generation. A host that came back empty stays named here.
CREATE TABLE job_lost_hosts (
  job_id  TEXT NOT NULL REFERENCES jobs (id) ON DELETE CASCADE,
  host_id TEXT NOT NULL,
  PRIMARY KEY (job_id, host_id)
);
CREATE INDEX job_lost_hosts_by_host ON job_lost_hosts (host_id, job_id);
