// Store::HeartbeatHosts' and AssignedOperationsOfHosts' defaults: the per-host
// methods one by one (a store that has nothing better, such as the in-memory
// one).
#include <utility>

#include "services/coordinator/store/store.h"
#include "services/coordinator/store/store_checks.h"

namespace reshard::coordinator {

absl::StatusOr<std::vector<HostHeartbeatResult>> Store::HeartbeatHosts(
    const std::vector<HostHeartbeat>& beats) {
  std::vector<HostHeartbeatResult> results(beats.size());
  for (size_t i = 0; i < beats.size(); ++i) {
    const HostHeartbeat& beat = beats[i];
    HostHeartbeatResult& result = results[i];
    result.status = CheckHeartbeat(beat);  // a bad beat is refused alone
    if (!result.status.ok()) continue;
    result.status =
        Heartbeat(beat.host_id, beat.epoch, beat.now_unix_ms, beat.lease_expires_unix_ms);
    if (absl::IsNotFound(result.status) || absl::IsFailedPrecondition(result.status)) continue;
    if (!result.status.ok()) return result.status;
    absl::StatusOr<std::vector<std::string>> assigned = AssignedOperations(beat.host_id);
    if (!assigned.ok()) return assigned.status();
    result.assigned_operations = *std::move(assigned);
    absl::StatusOr<std::vector<v1::GenerationRef>> release = GenerationsToRelease(beat.host_id);
    if (!release.ok()) return release.status();
    result.release = *std::move(release);
    absl::StatusOr<std::vector<v1::GenerationRef>> discard = GenerationsToDiscard(beat.host_id);
    if (!discard.ok()) return discard.status();
    result.discard = *std::move(discard);
    absl::StatusOr<std::vector<std::string>> deleted = DeletedJobs(beat.held_jobs);
    if (!deleted.ok()) return deleted.status();
    result.deleted_jobs = *std::move(deleted);
  }
  return results;
}

absl::StatusOr<std::map<std::string, std::vector<std::string>>> Store::AssignedOperationsOfHosts(
    const std::vector<std::string>& host_ids) {
  std::map<std::string, std::vector<std::string>> assigned;
  for (const std::string& host : host_ids) {
    if (!CheckText("host id", host).ok()) continue;  // no such host: none assigned
    absl::StatusOr<std::vector<std::string>> ops = AssignedOperations(host);
    if (!ops.ok()) return ops.status();
    assigned[host] = *std::move(ops);
  }
  return assigned;
}

}  // namespace reshard::coordinator
