-- Dataset state (issue 12; docs/data.md): the dataset descriptor, the sample
-- order, the global batch and the cursor of a job, one row per generation
-- that has one. RegisterJob writes generation 1's row; CommitStep updates the
-- current generation's row (cursor, step, committed_generation); committing
-- an operation copies the row to the new generation in the same transaction
-- (pg_transfer.cc), so a resize, migrate or recover carries it. Rows go with
-- their generation (retention, DeleteJob). Never edit once landed.
CREATE TABLE dataset_states (
  job_id               text        NOT NULL,
  generation           bigint      NOT NULL,
  dataset_id           text        NOT NULL,
  num_samples          bigint      NOT NULL CHECK (num_samples >= 1),
  dataset_fingerprint  text        NOT NULL,
  seed                 bigint      NOT NULL,  -- the uint64 seed's bits, two's complement
  shuffle              smallint    NOT NULL CHECK (shuffle BETWEEN 0 AND 2),  -- SampleShuffle
  block_size           bigint      NOT NULL CHECK (block_size >= 0),
  global_batch         bigint      NOT NULL CHECK (global_batch >= 1),
  sample_cursor        bigint      NOT NULL CHECK (sample_cursor >= 0),
  step                 bigint      NOT NULL CHECK (step >= 0),
  layout_fingerprint   text        NOT NULL,
  committed_generation bigint      NOT NULL,  -- the generation of the last CommitStep
  committed_at         timestamptz NOT NULL DEFAULT now(),
  PRIMARY KEY (job_id, generation),
  FOREIGN KEY (job_id, generation) REFERENCES generations (job_id, generation) ON DELETE CASCADE
);
