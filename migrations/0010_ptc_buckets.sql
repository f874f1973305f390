-- Issue 13 (docs/partitioning.md): what the first PTC tables did not carry:
-- the PTC's bucket groups (DP_BUCKET: Megatron's distributed optimizer, FSDP
-- flat parameters) and which blobs are regenerable.
CREATE TABLE ptc_buckets (
  job_id TEXT    NOT NULL REFERENCES jobs (id) ON DELETE CASCADE,
  idx    INTEGER NOT NULL,  -- position in Ptc.buckets
  spec   BYTEA   NOT NULL,  -- reshard.v1.BucketGroup
  PRIMARY KEY (job_id, idx)
);

ALTER TABLE ptc_blobs ADD COLUMN regenerable BOOLEAN NOT NULL DEFAULT false;
