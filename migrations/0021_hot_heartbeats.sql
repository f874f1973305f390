-- Heartbeats as HOT updates (issue 32, item 2; docs/coordinator.md, "Capacity:
-- what is read per call at 10,000 hosts"). 10,000 hosts renew their leases
-- about 3,000 times a second. The partial index on lease_expires_unix_ms made
-- every renewal a non-HOT update (an indexed column changed): a new entry in
-- every index of hosts per heartbeat, and the leader's expired-lease query,
-- which walked that index for `lease_expires_unix_ms < now`, read every dead
-- entry since the last vacuum (6.5 million index entries a second measured at
-- 10,000 hosts). Without it, a renewal changes no indexed column and leaves
-- room on its page (fillfactor 50), so PostgreSQL updates in place and prunes
-- the old versions as it goes; the expired-lease query reads the hosts table
-- itself (one row per host). Never edit once landed.
DROP INDEX IF EXISTS hosts_alive_by_lease;
ALTER TABLE hosts SET (fillfactor = 50);
