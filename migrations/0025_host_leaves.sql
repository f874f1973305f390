-- Host notices mark the host (issue 35; docs/scheduler.md, "Host notices"):
-- when it goes away (coordinator clock, unix ms; 0: no notice). A leaving
-- host is no spare and no new layout places ranks on it; a registration
-- after that time clears it. Never edit once landed.
ALTER TABLE hosts
  ADD COLUMN leaves_unix_ms BIGINT NOT NULL DEFAULT 0;
