-- Where a job's workers keep its state (JobSpec.state_memory; docs/coordinator.md,
-- "Where a job's state lives"): 1 HOST, 2 DEVICE (StateMemory; UNSPECIFIED is
-- stored as HOST). Fixed at RegisterJob; every HostTask of the job carries it
-- (device_resident). Jobs registered before this migration kept host state.
-- Never edit once landed.
ALTER TABLE jobs
  ADD COLUMN state_memory SMALLINT NOT NULL DEFAULT 1 CHECK (state_memory BETWEEN 1 AND 2);
