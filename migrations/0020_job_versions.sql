-- Versions per job and per operation (issue 31, defect 8; docs/coordinator.md,
-- "Change feed"). Migration 0016 took every version from one sequence shared
-- by all tenants, so the gap between two versions of a tenant's own job told
-- it how many changes other tenants had committed meanwhile. Now each job
-- (and each operation) row counts its own changes: a transaction that
-- changes the row, however many times it writes it, advances its version by
-- exactly 1. The BEFORE trigger still runs with the row locked, so a row's
-- next version is taken only after its previous writer committed: a key's
-- versions grow by one per committed change, in commit order, on every
-- replica, and a watch resumes from the last one it saw as before.
--
-- Rows keep the version they have (a watch that saw it resumes across the
-- upgrade); each later change adds 1 to it. `version_xact` is the
-- transaction that last advanced the row (NULL: none since this migration).
-- Never edit once landed.
ALTER TABLE jobs ADD COLUMN version_xact xid8;
ALTER TABLE operations ADD COLUMN version_xact xid8;

CREATE OR REPLACE FUNCTION reshard_take_version() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  IF TG_OP = 'INSERT' THEN
    NEW.version := 1;
  ELSIF OLD.version_xact IS NOT DISTINCT FROM pg_current_xact_id() THEN
    NEW.version := OLD.version;  -- the same change, written again
  ELSE
    NEW.version := OLD.version + 1;
  END IF;
  NEW.version_xact := pg_current_xact_id();
  RETURN NEW;
END $$;

DROP SEQUENCE change_versions;
