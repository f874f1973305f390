-- Idempotency keys are scoped to the caller's tenants (issue 19, defect 7;
-- docs/coordinator.md, "Idempotency"). Before, one key was one row for the
-- whole cluster: a key another tenant had used answered INVALID_ARGUMENT
-- naming that tenant's method, and a tenant could squat another's
-- predictable keys. Now a row is (tenants, key), `tenants` being the
-- caller's tenants, sorted; '{}' is the scope of a caller without tenants
-- (an admin). A key is looked up and claimed only in the caller's scope.
ALTER TABLE idempotency_keys ADD COLUMN tenants TEXT[];
-- Existing rows: a row of a job (every call but a finished DeleteJob) goes
-- to that job's tenant. Its caller was a scheduler of that tenant (then its
-- retry still finds the first result) or an admin (whose retry now runs as
-- a new call and meets the checks that guard against a duplicate anyway:
-- expected_generation, the job's (tenant, name), the job being gone); either
-- way the row only ever answers calls on that tenant's own job.
UPDATE idempotency_keys i SET tenants = ARRAY[j.tenant] FROM jobs j WHERE i.job_id = j.id;
-- A DeleteJob's row outlives its job, so its tenant is unknown: the admin's
-- scope, where no tenant can reach it (a tenant's retry of such a delete
-- answers NotFound: the job is gone).
UPDATE idempotency_keys SET tenants = '{}' WHERE tenants IS NULL;
ALTER TABLE idempotency_keys ALTER COLUMN tenants SET NOT NULL;
ALTER TABLE idempotency_keys DROP CONSTRAINT idempotency_keys_pkey;
ALTER TABLE idempotency_keys ADD PRIMARY KEY (tenants, key);
-- Operations of two scopes may carry the same key; within a scope
-- idempotency_keys still lets a key name one resource.
DROP INDEX operations_idempotency_key;
