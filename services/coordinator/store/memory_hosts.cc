// MemoryStore: the hosts aggregate (host_store.h): hosts and their leases,
// the lost hosts of jobs and what agents free or drop (as pg_hosts.cc).
#include <algorithm>

#include "absl/strings/str_cat.h"
#include "services/coordinator/store/memory_store.h"
#include "services/coordinator/store/memory_store_internal.h"
#include "services/coordinator/store/store_checks.h"

namespace reshard::coordinator {
namespace {

using Ids = std::vector<std::string>;

absl::Status HostNotFound(const std::string& host_id) {
  return absl::NotFoundError(absl::StrCat("host \"", host_id, "\" not found"));
}

absl::Status CheckIds(const char* what, const Ids& ids) {
  for (const std::string& id : ids) {
    if (absl::Status s = mem::CheckText(what, id); !s.ok()) return s;
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<int64_t> MemoryStore::RegisterHost(const v1::Host& host, int64_t now_unix_ms,
                                                  int64_t lease_expires_unix_ms) {
  if (absl::Status s = CheckNewHost(host); !s.ok()) return s;
  std::lock_guard<CallLock> l(mu_);
  HostRecord& h = hosts_[host.host_id()];
  const bool was_lost = h.state == v1::HOST_STATE_LOST;
  // A notice still ahead stays; one whose time has passed is over.
  const int64_t leaves = h.info.leaves_unix_ms() > now_unix_ms ? h.info.leaves_unix_ms() : 0;
  h.info = host;
  h.info.clear_state();
  h.info.clear_last_heartbeat_unix_ms();
  h.info.clear_lease_expires_unix_ms();
  h.info.set_leaves_unix_ms(leaves);
  h.state = v1::HOST_STATE_ALIVE;
  ++h.epoch;
  h.last_heartbeat_unix_ms = now_unix_ms;
  h.lease_expires_unix_ms = lease_expires_unix_ms;
  if (was_lost) TouchJobsOnHost(host.host_id());  // no longer lost on its jobs
  Tx tx;
  WriteAudit(tx, "", "", host.host_id());
  Commit(tx);
  return h.epoch;
}

absl::Status MemoryStore::Heartbeat(const std::string& host_id, int64_t epoch, int64_t now_unix_ms,
                                    int64_t lease_expires_unix_ms) {
  std::lock_guard<CallLock> l(mu_);
  auto it = hosts_.find(host_id);
  if (it == hosts_.end()) return HostNotFound(host_id);
  HostRecord& h = it->second;
  if (h.epoch != epoch) {
    return absl::FailedPreconditionError(
        absl::StrCat("host \"", host_id, "\": heartbeat for epoch ", epoch,
                     " but the latest registration is epoch ", h.epoch, "; register again"));
  }
  if (h.state != v1::HOST_STATE_ALIVE) {
    return absl::FailedPreconditionError(
        absl::StrCat("host \"", host_id, "\" was marked LOST (lease expired); register again"));
  }
  h.last_heartbeat_unix_ms = now_unix_ms;
  h.lease_expires_unix_ms = lease_expires_unix_ms;
  return absl::OkStatus();
}

namespace {

v1::Host HostView(const v1::Host& info, v1::HostState state, int64_t heartbeat, int64_t lease) {
  v1::Host host = info;
  host.set_state(state);
  host.set_last_heartbeat_unix_ms(heartbeat);
  host.set_lease_expires_unix_ms(lease);
  return host;
}

}  // namespace

absl::StatusOr<std::vector<v1::Host>> MemoryStore::ListHosts() {
  std::lock_guard<CallLock> l(mu_);
  std::vector<v1::Host> hosts;
  for (const auto& [id, h] : hosts_) {
    hosts.push_back(HostView(h.info, h.state, h.last_heartbeat_unix_ms, h.lease_expires_unix_ms));
  }
  return hosts;
}

absl::StatusOr<v1::Host> MemoryStore::GetHost(const std::string& host_id) {
  std::lock_guard<CallLock> l(mu_);
  auto it = hosts_.find(host_id);
  if (it == hosts_.end()) return HostNotFound(host_id);
  const HostRecord& h = it->second;
  return HostView(h.info, h.state, h.last_heartbeat_unix_ms, h.lease_expires_unix_ms);
}

absl::Status MemoryStore::SetHostLeaves(const std::string& host_id, int64_t leaves_unix_ms) {
  std::lock_guard<CallLock> l(mu_);
  auto it = hosts_.find(host_id);
  if (it == hosts_.end()) return HostNotFound(host_id);
  it->second.info.set_leaves_unix_ms(leaves_unix_ms);
  return absl::OkStatus();
}

absl::StatusOr<Store::RegistrationsMark> MemoryStore::HostRegistrations() {
  std::lock_guard<CallLock> l(mu_);
  RegistrationsMark mark;
  for (const auto& [id, h] : hosts_) {
    ++mark.hosts;
    mark.epochs += h.epoch;
  }
  return mark;
}

absl::StatusOr<std::vector<std::string>> MemoryStore::ExpiredLeases(int64_t now_unix_ms) {
  std::lock_guard<CallLock> l(mu_);
  Ids expired;
  for (const auto& [id, h] : hosts_) {
    if (h.state == v1::HOST_STATE_ALIVE && h.lease_expires_unix_ms < now_unix_ms) {
      expired.push_back(id);
    }
  }
  return expired;  // by id (hosts_ is ordered)
}

absl::StatusOr<std::vector<std::string>> MemoryStore::ExpireLeases(int64_t now_unix_ms) {
  std::lock_guard<CallLock> l(mu_);
  Ids expired;
  for (auto& [id, h] : hosts_) {
    if (h.state != v1::HOST_STATE_ALIVE || h.lease_expires_unix_ms >= now_unix_ms) continue;
    h.state = v1::HOST_STATE_LOST;
    expired.push_back(id);
  }
  for (const std::string& host : expired) {
    for (auto& [job_id, job] : jobs_) {
      auto g = job.generations.find(job.row.generation());
      if (g == job.generations.end()) continue;
      const Ids& ranks = g->second.rank_hosts;
      if (std::find(ranks.begin(), ranks.end(), host) == ranks.end()) continue;
      job.lost_hosts.insert(host);
      AdvanceVersion(job);
    }
  }
  return expired;  // by id (hosts_ is ordered)
}

absl::StatusOr<std::vector<std::string>> MemoryStore::OperationsOnHosts(const Ids& host_ids) {
  if (host_ids.empty()) return Ids();
  if (absl::Status s = CheckIds("host id", host_ids); !s.ok()) return s;
  std::lock_guard<CallLock> l(mu_);
  Ids ids;
  for (const auto& [seq, id] : operation_seq_) {
    const Operation& op = operations_.at(id);
    if (!IsActiveState(op.row.state())) continue;
    for (const std::string& h : host_ids) {
      if (op.hosts.count(h) > 0) {
        ids.push_back(id);
        break;
      }
    }
  }
  return ids;
}

absl::StatusOr<std::vector<std::string>> MemoryStore::JobsOnHosts(const Ids& host_ids) {
  if (host_ids.empty()) return Ids();
  if (absl::Status s = CheckIds("host id", host_ids); !s.ok()) return s;
  std::lock_guard<CallLock> l(mu_);
  Ids jobs;
  for (const auto& [job_id, job] : jobs_) {
    auto g = job.generations.find(job.row.generation());
    if (g == job.generations.end()) continue;
    const Ids& ranks = g->second.rank_hosts;
    for (const std::string& h : host_ids) {
      if (std::find(ranks.begin(), ranks.end(), h) != ranks.end()) {
        jobs.push_back(job_id);
        break;
      }
    }
  }
  return jobs;
}

absl::StatusOr<Ids> MemoryStore::DeletedJobs(const Ids& job_ids) {
  if (job_ids.empty()) return Ids();
  if (absl::Status s = CheckIds("job id", job_ids); !s.ok()) return s;
  std::lock_guard<CallLock> l(mu_);
  Ids deleted;
  for (const std::string& id : job_ids) {
    if (jobs_.count(id) == 0) deleted.push_back(id);
  }
  return deleted;
}

absl::StatusOr<std::vector<v1::GenerationRef>> MemoryStore::StaleGenerations(
    const std::vector<v1::GenerationRef>& held) {
  std::vector<v1::GenerationRef> stale;
  for (const v1::GenerationRef& g : held) {
    if (absl::Status s = mem::CheckText("job id", g.job_id()); !s.ok()) return s;
  }
  std::lock_guard<CallLock> l(mu_);
  for (const v1::GenerationRef& ref : held) {
    bool live = false;
    if (const Job* job = FindJob(ref.job_id())) {
      auto g = job->generations.find(ref.generation());
      live = g != job->generations.end() && (g->second.state == GenerationState::kCurrent ||
                                             g->second.state == GenerationState::kPending);
    }
    if (!live) stale.push_back(ref);
  }
  return stale;
}

absl::StatusOr<Ids> MemoryStore::JobsLostOnHost(const std::string& host_id) {
  if (absl::Status s = mem::CheckText("host id", host_id); !s.ok()) return s;
  std::lock_guard<CallLock> l(mu_);
  Ids jobs;
  for (const auto& [job_id, job] : jobs_) {
    if (job.lost_hosts.count(host_id) > 0) jobs.push_back(job_id);
  }
  return jobs;
}

absl::Status MemoryStore::RestoreLostHost(const std::string& job_id, const std::string& host_id) {
  std::lock_guard<CallLock> l(mu_);
  Job* job = FindJob(job_id);
  if (job == nullptr) return mem::JobNotFound(job_id);
  if (job->lost_hosts.erase(host_id) > 0) AdvanceVersion(*job);
  if (job->row.state() == v1::JOB_STATE_ACTIVE || job->row.state() == v1::JOB_STATE_DEGRADED) {
    SettleJobState(*job);
  }
  return absl::OkStatus();
}

absl::StatusOr<v1::JobState> MemoryStore::SettleJobLiveness(const std::string& job_id) {
  std::lock_guard<CallLock> l(mu_);
  Job* job = FindJob(job_id);
  if (job == nullptr) return mem::JobNotFound(job_id);
  if (job->row.state() == v1::JOB_STATE_ACTIVE || job->row.state() == v1::JOB_STATE_DEGRADED) {
    SettleJobState(*job);
  }
  return job->row.state();
}

// ---- What an agent frees or drops -------------------------------------------

std::vector<v1::GenerationRef> MemoryStore::GenerationsIn(GenerationState state,
                                                          const std::string& host_id) const {
  std::vector<v1::GenerationRef> refs;
  for (const auto& [job_id, job] : jobs_) {
    for (const auto& [n, g] : job.generations) {
      if (g.state != state) continue;
      if (std::find(g.rank_hosts.begin(), g.rank_hosts.end(), host_id) == g.rank_hosts.end()) {
        continue;
      }
      v1::GenerationRef ref;
      ref.set_job_id(job_id);
      ref.set_generation(n);
      refs.push_back(std::move(ref));
    }
  }
  return refs;
}

absl::StatusOr<std::vector<v1::GenerationRef>> MemoryStore::GenerationsToRelease(
    const std::string& host_id) {
  std::lock_guard<CallLock> l(mu_);
  return GenerationsIn(GenerationState::kRetired, host_id);
}

absl::StatusOr<std::vector<v1::GenerationRef>> MemoryStore::GenerationsToDiscard(
    const std::string& host_id) {
  std::lock_guard<CallLock> l(mu_);
  return GenerationsIn(GenerationState::kDiscarded, host_id);
}

}  // namespace reshard::coordinator
