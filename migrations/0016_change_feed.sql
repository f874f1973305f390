-- The change feed (issue 21; docs/coordinator.md, "Change feed"). Every
-- committed change to what GetJob or GetOperation shows gives the job or
-- operation a new `version` and sends a notification on the channel
-- reshard_changes ('j:<job id>' or 'o:<operation id>'), delivered to every
-- replica's listener at commit. The triggers below are the one place that
-- says what a change is, so no statement can forget to announce one.
--
-- Versions come from one sequence and are taken by BEFORE triggers, which
-- PostgreSQL runs with the row already locked: a row's next version is taken
-- only after its previous writer committed, so one job's (or operation's)
-- versions grow in commit order and a watch can resume from the last one it
-- saw. What a job shows but other tables hold (its operations' states, lost
-- hosts, dataset state, rank failures, the state of its hosts) bumps the
-- job's row ("touch"). Never edit once landed.
CREATE SEQUENCE change_versions;

ALTER TABLE jobs ADD COLUMN version bigint NOT NULL DEFAULT 0;
ALTER TABLE operations ADD COLUMN version bigint NOT NULL DEFAULT 0;
UPDATE jobs SET version = nextval('change_versions');
UPDATE operations SET version = nextval('change_versions');

-- A new version for every inserted or updated job or operation row.
CREATE FUNCTION reshard_take_version() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  NEW.version := nextval('change_versions');
  RETURN NEW;
END $$;

CREATE TRIGGER jobs_version BEFORE INSERT OR UPDATE ON jobs
  FOR EACH ROW EXECUTE FUNCTION reshard_take_version();
CREATE TRIGGER operations_version BEFORE INSERT OR UPDATE ON operations
  FOR EACH ROW EXECUTE FUNCTION reshard_take_version();

-- Announcements. PostgreSQL folds equal payloads of one transaction into one.
CREATE FUNCTION reshard_announce_job() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  IF TG_OP = 'DELETE' THEN
    PERFORM pg_notify('reshard_changes', 'j:' || OLD.id);
  ELSE
    PERFORM pg_notify('reshard_changes', 'j:' || NEW.id);
  END IF;
  RETURN NULL;
END $$;

CREATE TRIGGER jobs_announce AFTER INSERT OR UPDATE OR DELETE ON jobs
  FOR EACH ROW EXECUTE FUNCTION reshard_announce_job();

-- An operation's change, and its job's when the job shows it (a new
-- operation, a state, a step boundary or a queue place: Job.active_operation_id
-- and Job.step_boundary_operation_id).
CREATE FUNCTION reshard_announce_operation() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  PERFORM pg_notify('reshard_changes', 'o:' || NEW.id);
  IF TG_OP = 'INSERT' OR OLD.state IS DISTINCT FROM NEW.state
     OR OLD.step_boundary IS DISTINCT FROM NEW.step_boundary
     OR OLD.queued_behind_operation_id IS DISTINCT FROM NEW.queued_behind_operation_id THEN
    UPDATE jobs SET version = version WHERE id = NEW.job_id;
  END IF;
  RETURN NULL;
END $$;

CREATE TRIGGER operations_announce AFTER INSERT OR UPDATE ON operations
  FOR EACH ROW EXECUTE FUNCTION reshard_announce_operation();

-- Rows of other tables that a job shows: touch the job.
CREATE FUNCTION reshard_touch_job() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  UPDATE jobs SET version = version WHERE id = NEW.job_id;
  RETURN NULL;
END $$;

CREATE TRIGGER rank_failures_touch AFTER INSERT OR UPDATE ON rank_failures
  FOR EACH ROW EXECUTE FUNCTION reshard_touch_job();
CREATE TRIGGER dataset_states_touch AFTER INSERT OR UPDATE ON dataset_states
  FOR EACH ROW EXECUTE FUNCTION reshard_touch_job();
CREATE TRIGGER job_lost_hosts_touch AFTER INSERT ON job_lost_hosts
  FOR EACH ROW EXECUTE FUNCTION reshard_touch_job();

-- A host that changes state (LOST, back) changes Job.lost_hosts of the jobs
-- whose current generation has ranks on it.
CREATE FUNCTION reshard_touch_jobs_of_host() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  UPDATE jobs j SET version = version
   WHERE EXISTS (SELECT 1 FROM generation_ranks r
                  WHERE r.host_id = NEW.id AND r.job_id = j.id AND r.generation = j.generation);
  RETURN NULL;
END $$;

CREATE TRIGGER hosts_touch_jobs AFTER UPDATE OF state ON hosts
  FOR EACH ROW WHEN (OLD.state IS DISTINCT FROM NEW.state)
  EXECUTE FUNCTION reshard_touch_jobs_of_host();
