-- The audit trail (issue 11 item 6; docs/security.md, "Audit"): one row per
-- mutating call, written in the same transaction as the call's effect when
-- it succeeds, in its own transaction when it is refused or fails. Never
-- holds a secret: messages are status messages (which never contain one),
-- cut to 512 bytes. Pruned by the leader's retention loop
-- (--retention-audit-age-ms). Never edit once landed.
CREATE TABLE audit_log (
  id              bigserial PRIMARY KEY,
  at_unix_ms      bigint NOT NULL,
  identity        text NOT NULL,   -- certificate common name or "token:<id> (<name>)"; "" unauthenticated
  role            text NOT NULL,   -- "" when unauthenticated
  tenant          text NOT NULL,   -- the job's tenant; "" when the call names none
  method          text NOT NULL,   -- RPC method, e.g. "Resize"
  job_id          text NOT NULL,
  operation_id    text NOT NULL,
  target          text NOT NULL,   -- what else the call names: a token id, a host id
  idempotency_key text NOT NULL,
  code            text NOT NULL,   -- "OK", "PERMISSION_DENIED", ...
  message         text NOT NULL
);
-- ListAudit pages newest first, by tenant or not; pruning goes oldest first.
CREATE INDEX audit_log_by_time ON audit_log (at_unix_ms);
CREATE INDEX audit_log_by_tenant ON audit_log (tenant, id);
CREATE INDEX audit_log_by_job ON audit_log (job_id, id) WHERE job_id <> '';
