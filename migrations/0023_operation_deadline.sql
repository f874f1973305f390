-- "This layout by that deadline" (issue 35; docs/scheduler.md, "Deadlines"):
-- the request's deadline (coordinator clock, unix ms; 0: none) and whether
-- the operation aborts past it (else it continues). Set when the operation
-- is created; the driver reads them. Never edit once landed.
ALTER TABLE operations
  ADD COLUMN deadline_unix_ms bigint NOT NULL DEFAULT 0,
  ADD COLUMN deadline_abort boolean NOT NULL DEFAULT false;
