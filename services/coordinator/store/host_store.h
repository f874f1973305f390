// The hosts aggregate of the Store (store.h): registered hosts, their
// epochs and leases, and what a host's presence or loss means for the jobs
// whose ranks it holds (liveness: lost hosts of jobs, generations its agent
// may free or must drop, jobs deleted under it). PgStore (pg_hosts.cc) and
// MemoryStore (memory_hosts.cc) implement it.
#pragma once

#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "reshard/v1/agent.pb.h"
#include "reshard/v1/coordinator.pb.h"

namespace reshard::coordinator {

class HostStore {
 public:
  virtual ~HostStore() = default;

  // ---- Hosts ---------------------------------------------------------------
  /// Inserts or replaces a host (state ALIVE, lease until
  /// `lease_expires_unix_ms`); returns its new epoch (1, 2, ...).
  [[nodiscard]] virtual absl::StatusOr<int64_t> RegisterHost(const v1::Host& host,
                                                             int64_t now_unix_ms,
                                                             int64_t lease_expires_unix_ms) = 0;
  /// Extends the lease. NotFound for an unknown host; FailedPrecondition when
  /// `epoch` is not the latest (an older agent process) or the host was
  /// marked LOST (the agent must register again).
  [[nodiscard]] virtual absl::Status Heartbeat(const std::string& host_id, int64_t epoch,
                                               int64_t now_unix_ms,
                                               int64_t lease_expires_unix_ms) = 0;
  [[nodiscard]] virtual absl::StatusOr<std::vector<v1::Host>> ListHosts() = 0;
  /// Every registered host's state, by id: what the operation driver reads
  /// each tick (not the hosts' addresses). The default reads ListHosts; a
  /// store reads two columns.
  [[nodiscard]] virtual absl::StatusOr<std::map<std::string, v1::HostState>> HostStates() {
    absl::StatusOr<std::vector<v1::Host>> all = ListHosts();
    if (!all.ok()) return all.status();
    std::map<std::string, v1::HostState> states;
    for (const v1::Host& h : *all) states.emplace(h.host_id(), h.state());
    return states;
  }
  /// The registered hosts among `host_ids`, ordered by id (an unknown id is
  /// absent): what a task names as its peers, without reading every host.
  /// The default filters ListHosts; a store answers from its index.
  [[nodiscard]] virtual absl::StatusOr<std::vector<v1::Host>> GetHosts(
      const std::vector<std::string>& host_ids) {
    absl::StatusOr<std::vector<v1::Host>> all = ListHosts();
    if (!all.ok()) return all.status();
    const std::set<std::string> wanted(host_ids.begin(), host_ids.end());
    std::vector<v1::Host> hosts;
    for (v1::Host& h : *all) {
      if (wanted.count(h.host_id()) > 0) hosts.push_back(std::move(h));
    }
    return hosts;
  }
  [[nodiscard]] virtual absl::StatusOr<v1::Host> GetHost(const std::string& host_id) = 0;
  /// A host notice: the host goes at `leaves_unix_ms` (0: no notice;
  /// Host.leaves_unix_ms). A registration before that time keeps it, one
  /// after clears it. NotFound for an unknown host.
  [[nodiscard]] virtual absl::Status SetHostLeaves(const std::string& host_id,
                                                   int64_t leaves_unix_ms) = 0;
  /// Moves whenever a host registers (a new host, or a new epoch of one) and
  /// at no other time (heartbeats and lease expiry leave it): a cache of what
  /// hosts register (their capacity, logic/capacity.h) is current while it
  /// holds. The number of hosts and the sum of their epochs.
  struct RegistrationsMark {
    int64_t hosts = 0;
    int64_t epochs = 0;
    bool operator==(const RegistrationsMark& o) const {
      return hosts == o.hosts && epochs == o.epochs;
    }
  };
  [[nodiscard]] virtual absl::StatusOr<RegistrationsMark> HostRegistrations() = 0;
  /// ALIVE hosts whose lease ended before `now_unix_ms`, by id; changes
  /// nothing (the leader judges them first: logic/lease_judge.h).
  [[nodiscard]] virtual absl::StatusOr<std::vector<std::string>> ExpiredLeases(
      int64_t now_unix_ms) = 0;
  /// Marks ALIVE hosts whose lease ended before `now_unix_ms` LOST and
  /// returns their ids.
  [[nodiscard]] virtual absl::StatusOr<std::vector<std::string>> ExpireLeases(
      int64_t now_unix_ms) = 0;
  /// Active operations that involve any of `host_ids` (as a progress row).
  [[nodiscard]] virtual absl::StatusOr<std::vector<std::string>> OperationsOnHosts(
      const std::vector<std::string>& host_ids) = 0;
  /// Jobs whose current generation places a rank on any of `host_ids`.
  [[nodiscard]] virtual absl::StatusOr<std::vector<std::string>> JobsOnHosts(
      const std::vector<std::string>& host_ids) = 0;
  /// Generations an agent on `host_id` may free (RETIRED) or must drop
  /// (DISCARDED), among jobs whose generations placed ranks on that host.
  [[nodiscard]] virtual absl::StatusOr<std::vector<v1::GenerationRef>> GenerationsToRelease(
      const std::string& host_id) = 0;
  [[nodiscard]] virtual absl::StatusOr<std::vector<v1::GenerationRef>> GenerationsToDiscard(
      const std::string& host_id) = 0;

  // ---- Liveness: deleted jobs, lost hosts of jobs (issue 9) -----------------
  /// Of `job_ids`, those that do not exist (job ids are never reused, so:
  /// deleted), in the order given.
  [[nodiscard]] virtual absl::StatusOr<std::vector<std::string>> DeletedJobs(
      const std::vector<std::string>& job_ids) = 0;
  /// Jobs that count `host_id` among their lost hosts (persisted when the
  /// host's lease expired while it held a rank of the job's current
  /// generation; cleared by RestoreLostHost or a commit).
  [[nodiscard]] virtual absl::StatusOr<std::vector<std::string>> JobsLostOnHost(
      const std::string& host_id) = 0;
  /// `host_id` is no longer lost for `job_id` (it came back with the job's
  /// shards intact); the job returns from DEGRADED to ACTIVE when no lost
  /// host is left.
  [[nodiscard]] virtual absl::Status RestoreLostHost(const std::string& job_id,
                                                     const std::string& host_id) = 0;
  /// An ACTIVE or DEGRADED job becomes DEGRADED when it has lost hosts, else
  /// ACTIVE; other states are kept. Returns the state it has now.
  [[nodiscard]] virtual absl::StatusOr<v1::JobState> SettleJobLiveness(
      const std::string& job_id) = 0;
  /// Of `held` (generations an agent holds buffers of), those that are not a
  /// CURRENT or PENDING generation (RETIRED, DISCARDED, pruned, or of a
  /// deleted job), in order: the agent may drop them.
  [[nodiscard]] virtual absl::StatusOr<std::vector<v1::GenerationRef>> StaleGenerations(
      const std::vector<v1::GenerationRef>& held) = 0;
};

}  // namespace reshard::coordinator
