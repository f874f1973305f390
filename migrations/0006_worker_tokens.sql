-- The coordinator's secret keys (issue 11 items 4 and 5; docs/security.md).
-- One row, 'master': 32 random bytes written by the first coordinator that
-- starts (INSERT ... ON CONFLICT DO NOTHING, so replicas agree). Worker
-- tokens (HMAC of the job id) and per-operation transfer secrets (HMAC of
-- the operation id) are derived from it under separate labels, so neither is
-- stored. Readable only by the coordinator's database role. Never edit once
-- landed.
CREATE TABLE cluster_secrets (
  name   text PRIMARY KEY,
  secret bytea NOT NULL CHECK (length(secret) = 32)
);
