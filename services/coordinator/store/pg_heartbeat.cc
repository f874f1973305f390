// PgStore::HeartbeatHosts: a batch of heartbeats in one transaction of five
// statements whatever its size (docs/coordinator.md, "Agent calls: no thread
// per agent, heartbeats in batches"): one UPDATE of every lease, the epochs
// of the hosts it refused, and each list the agents are told as one query
// over all the batch's hosts.
#include <map>
#include <set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "services/coordinator/store/pg_codec.h"
#include "services/coordinator/store/pg_heartbeat_statements.h"
#include "services/coordinator/store/pg_statements.h"
#include "services/coordinator/store/pg_store.h"
#include "services/coordinator/store/pg_store_internal.h"
#include "services/coordinator/store/store_checks.h"

namespace reshard::coordinator {

namespace pg {

absl::Status HeartbeatRefusal(const std::string& host_id, int64_t epoch, bool found,
                              int64_t latest) {
  if (!found) return absl::NotFoundError(absl::StrCat("host \"", host_id, "\" not found"));
  if (latest != epoch) {
    return absl::FailedPreconditionError(
        absl::StrCat("host \"", host_id, "\": heartbeat for epoch ", epoch,
                     " but the latest registration is epoch ", latest, "; register again"));
  }
  return absl::FailedPreconditionError(
      absl::StrCat("host \"", host_id, "\" was marked LOST (lease expired); register again"));
}

}  // namespace pg

namespace {

// Rows of kAssignedOperationsOfHosts: (host, operation), by host and seq.
std::map<std::string, std::vector<std::string>> AssignedByHost(const pqxx::result& rows) {
  std::map<std::string, std::vector<std::string>> assigned;
  for (const pqxx::row& row : rows) assigned[row[0].c_str()].emplace_back(row[1].c_str());
  return assigned;
}

}  // namespace

absl::StatusOr<std::map<std::string, std::vector<std::string>>> PgStore::AssignedOperationsOfHosts(
    const std::vector<std::string>& host_ids) {
  using Assigned = std::map<std::string, std::vector<std::string>>;
  // An id PostgreSQL cannot store names no host and has none assigned; it
  // must not fail the other hosts' read (task polls are read in batches).
  std::vector<std::string> storable;
  for (const std::string& id : host_ids) {
    if (pg::CheckText("host id", id).ok()) storable.push_back(id);
  }
  if (storable.empty()) return Assigned();
  const std::string id_array = pg::TextArray(storable);
  return pg::TransactFor<Assigned>(*pool_, "AssignedOperationsOfHosts", [&](pg::PgTx& tx) {
    return absl::StatusOr<Assigned>(AssignedByHost(tx.Exec(pg::kAssignedOperationsOfHosts, id_array)));
  });
}

absl::StatusOr<std::vector<HostHeartbeatResult>> PgStore::HeartbeatHosts(
    const std::vector<HostHeartbeat>& beats) {
  using Results = std::vector<HostHeartbeatResult>;
  if (beats.empty()) return Results();
  // A beat PostgreSQL cannot store is refused alone (its result's status);
  // the batch is the others' (docs/coordinator.md: a host's own refusal
  // stays its own).
  Results checked(beats.size());
  std::vector<size_t> valid;  // indices of the beats sent to the database
  std::vector<std::string> ids;
  std::vector<int64_t> epochs, nows, leases;
  std::set<std::string> held;
  for (size_t i = 0; i < beats.size(); ++i) {
    const HostHeartbeat& beat = beats[i];
    checked[i].status = CheckHeartbeat(beat);
    if (!checked[i].status.ok()) continue;
    valid.push_back(i);
    held.insert(beat.held_jobs.begin(), beat.held_jobs.end());
    ids.push_back(beat.host_id);
    epochs.push_back(beat.epoch);
    nows.push_back(beat.now_unix_ms);
    leases.push_back(beat.lease_expires_unix_ms);
  }
  if (valid.empty()) return checked;
  const std::string id_array = pg::TextArray(ids);
  const std::string held_array = pg::TextArray({held.begin(), held.end()});
  return pg::TransactFor<Results>(*pool_, "HeartbeatHosts", [&](pg::PgTx& tx) -> absl::StatusOr<Results> {
    Results results = checked;
    std::set<std::pair<std::string, int64_t>> leased;  // (host, epoch) updated
    for (const pqxx::row& row : tx.Exec(pg::kHeartbeatHosts, id_array, pg::IntArray(epochs),
                                        pg::IntArray(nows), pg::IntArray(leases))) {
      leased.emplace(row[0].c_str(), row[1].as<int64_t>());
    }
    std::set<std::string> alive;  // hosts at least one beat renewed
    bool refused = false;
    for (size_t i : valid) {
      if (leased.count({beats[i].host_id, beats[i].epoch}) != 0) {
        alive.insert(beats[i].host_id);
      } else {
        refused = true;
      }
    }
    if (refused) {
      std::map<std::string, int64_t> latest;
      for (const pqxx::row& row : tx.Exec(pg::kHostsEpochState, id_array)) {
        latest[row[0].c_str()] = row[1].as<int64_t>();
      }
      for (size_t i : valid) {
        const HostHeartbeat& beat = beats[i];
        if (leased.count({beat.host_id, beat.epoch}) != 0) continue;
        auto it = latest.find(beat.host_id);
        results[i].status = pg::HeartbeatRefusal(beat.host_id, beat.epoch, it != latest.end(),
                                                 it == latest.end() ? 0 : it->second);
      }
    }
    if (alive.empty()) return results;
    const std::string alive_array = pg::TextArray({alive.begin(), alive.end()});
    std::map<std::string, std::vector<std::string>> assigned =
        AssignedByHost(tx.Exec(pg::kAssignedOperationsOfHosts, alive_array));
    std::map<std::string, std::vector<v1::GenerationRef>> release, discard;
    for (const pqxx::row& row : tx.Exec(pg::kGenerationsToDropOfHosts, alive_array)) {
      v1::GenerationRef ref;
      ref.set_job_id(row[1].c_str());
      ref.set_generation(row[2].as<int64_t>());
      auto& to = row[3].as<int>() == 3 ? release : discard;
      to[row[0].c_str()].push_back(std::move(ref));
    }
    std::set<std::string> deleted;
    if (!held.empty()) {
      for (const pqxx::row& row : tx.Exec(pg::kDeletedJobs, held_array)) {
        deleted.insert(row[0].c_str());
      }
    }
    for (size_t i : valid) {
      const HostHeartbeat& beat = beats[i];
      HostHeartbeatResult& result = results[i];
      if (!result.status.ok()) continue;
      result.assigned_operations = assigned[beat.host_id];
      result.release = release[beat.host_id];
      result.discard = discard[beat.host_id];
      for (const std::string& job : beat.held_jobs) {  // in the order given, as DeletedJobs
        if (deleted.count(job) != 0) result.deleted_jobs.push_back(job);
      }
    }
    return results;
  });
}

}  // namespace reshard::coordinator
