-- A new operation is announced as such (issue 21; docs/coordinator.md,
-- "Change feed"): besides 'o:<id>', its insert sends 'n:<id>' on
-- reshard_changes, so that the leader, on whichever replica, plans it at
-- once instead of at its next tick (an operation's task reaches its agents
-- only once planned). The rest of reshard_announce_operation is 0016's.
-- Never edit once landed.
CREATE OR REPLACE FUNCTION reshard_announce_operation() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  PERFORM pg_notify('reshard_changes', 'o:' || NEW.id);
  IF TG_OP = 'INSERT' THEN
    PERFORM pg_notify('reshard_changes', 'n:' || NEW.id);
  END IF;
  IF TG_OP = 'INSERT' OR OLD.state IS DISTINCT FROM NEW.state
     OR OLD.step_boundary IS DISTINCT FROM NEW.step_boundary
     OR OLD.queued_behind_operation_id IS DISTINCT FROM NEW.queued_behind_operation_id THEN
    UPDATE jobs SET version = version WHERE id = NEW.job_id;
  END IF;
  RETURN NULL;
END $$;
