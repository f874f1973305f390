-- Bearer tokens for people and schedulers (issue 11; docs/security.md).
-- Only a SHA-256 of each token's secret is stored; the secret is shown once,
-- when an admin creates the token. Never edit once landed.
CREATE TABLE auth_tokens (
  id            text PRIMARY KEY,          -- public part of the token, shown in lists
  secret_sha256 bytea NOT NULL UNIQUE,
  name          text NOT NULL,
  role          text NOT NULL CHECK (role IN ('admin', 'scheduler', 'viewer')),
  tenants       text[] NOT NULL DEFAULT '{}',
  created_by    text NOT NULL,
  created_unix_ms bigint NOT NULL,
  expires_unix_ms bigint NOT NULL,
  revoked_unix_ms bigint                   -- NULL while valid
);
