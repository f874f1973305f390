-- Rank failures (issue 20; ReportRankFailure, docs/security.md "Worker
-- tokens"): a training process (the job's worker token) or a scheduler says
-- that a rank of the job's current generation died, so the job's watchers
-- learn of it in seconds instead of at the host's lease expiry. One row per
-- (job, generation, rank): a repeated report replaces the reason and time.
-- Job.failed_ranks lists the current generation's rows; rows go with their
-- generation (retention, DeleteJob). Never edit once landed.
CREATE TABLE rank_failures (
  job_id      text        NOT NULL,
  generation  bigint      NOT NULL,
  rank        integer     NOT NULL CHECK (rank >= 0),
  reason      text        NOT NULL,
  reported_by text        NOT NULL,
  reported_at timestamptz NOT NULL DEFAULT now(),
  PRIMARY KEY (job_id, generation, rank),
  FOREIGN KEY (job_id, generation) REFERENCES generations (job_id, generation) ON DELETE CASCADE
);
