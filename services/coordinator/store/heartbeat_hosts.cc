// Store::HeartbeatHosts' and OperationStore::AssignedOperationsOfHosts'
// defaults: the per-host methods one by one (a store that has nothing better,
// such as the in-memory one).
#include <utility>

#include "services/coordinator/store/store.h"
#include "services/coordinator/store/store_checks.h"

namespace reshard::coordinator {

namespace {

// A failure of the store itself (it cannot be reached, a conflict retried
// past its limit, a broken invariant) is the whole batch's answer; anything
// else a per-host method says is about that beat alone (docs/coordinator.md:
// one host's bad beat never changes another's answer).
bool IsStoreFailure(const absl::Status& status) {
  switch (status.code()) {
    case absl::StatusCode::kUnavailable:
    case absl::StatusCode::kAborted:
    case absl::StatusCode::kDeadlineExceeded:
    case absl::StatusCode::kResourceExhausted:
    case absl::StatusCode::kInternal:
    case absl::StatusCode::kDataLoss:
    case absl::StatusCode::kUnknown:
    case absl::StatusCode::kCancelled:
      return true;
    default:
      return false;
  }
}

// One beat's answer from the per-host methods; a store failure is returned,
// any other refusal is the beat's status.
absl::Status AnswerBeat(Store& store, const HostHeartbeat& beat, HostHeartbeatResult& result) {
  result.status = CheckHeartbeat(beat);  // a bad beat is refused alone
  if (!result.status.ok()) return absl::OkStatus();
  result.status =
      store.Heartbeat(beat.host_id, beat.epoch, beat.now_unix_ms, beat.lease_expires_unix_ms);
  if (!result.status.ok()) return IsStoreFailure(result.status) ? result.status : absl::OkStatus();
  auto own = [&](const absl::Status& s) {
    if (!IsStoreFailure(s)) {
      result = HostHeartbeatResult();
      result.status = s;
    }
    return IsStoreFailure(s) ? s : absl::OkStatus();
  };
  absl::StatusOr<std::vector<std::string>> assigned = store.AssignedOperations(beat.host_id);
  if (!assigned.ok()) return own(assigned.status());
  absl::StatusOr<std::vector<v1::GenerationRef>> release = store.GenerationsToRelease(beat.host_id);
  if (!release.ok()) return own(release.status());
  absl::StatusOr<std::vector<v1::GenerationRef>> discard = store.GenerationsToDiscard(beat.host_id);
  if (!discard.ok()) return own(discard.status());
  absl::StatusOr<std::vector<std::string>> deleted = store.DeletedJobs(beat.held_jobs);
  if (!deleted.ok()) return own(deleted.status());
  result.assigned_operations = *std::move(assigned);
  result.release = *std::move(release);
  result.discard = *std::move(discard);
  result.deleted_jobs = *std::move(deleted);
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::vector<HostHeartbeatResult>> Store::HeartbeatHosts(
    const std::vector<HostHeartbeat>& beats) {
  std::vector<HostHeartbeatResult> results(beats.size());
  for (size_t i = 0; i < beats.size(); ++i) {
    if (absl::Status failed = AnswerBeat(*this, beats[i], results[i]); !failed.ok()) return failed;
  }
  return results;
}

absl::StatusOr<std::map<std::string, std::vector<std::string>>>
OperationStore::AssignedOperationsOfHosts(const std::vector<std::string>& host_ids) {
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
