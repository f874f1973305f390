// MemoryStore: hosts and their leases, the lost hosts of jobs, bearer tokens,
// cluster secrets, the audit trail and retention (as pg_hosts.cc,
// pg_tokens.cc, pg_audit.cc, pg_retention.cc).
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
  h.info = host;
  h.info.clear_state();
  h.info.clear_last_heartbeat_unix_ms();
  h.info.clear_lease_expires_unix_ms();
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

absl::StatusOr<std::vector<v1::ShardChecksum>> MemoryStore::GetGenerationChecksums(
    const std::string& job_id, int64_t generation) {
  std::lock_guard<CallLock> l(mu_);
  std::vector<v1::ShardChecksum> sums;
  const Job* job = FindJob(job_id);
  if (job == nullptr) return sums;
  auto g = job->generations.find(generation);
  if (g == job->generations.end()) return sums;
  for (const auto& [rank, list] : g->second.checksums) {
    sums.insert(sums.end(), list.begin(), list.end());
  }
  return sums;
}

// ---- Bearer tokens and cluster secrets -----------------------------------------

absl::Status MemoryStore::CreateToken(const TokenRecord& token, const std::string& secret_sha256) {
  if (absl::Status s = CheckNewToken(token); !s.ok()) return s;
  if (token.role != "admin" && token.role != "scheduler" && token.role != "viewer") {
    return absl::InternalError(absl::StrCat("token role \"", token.role,
                                            "\" violates auth_tokens_role_check"));
  }
  std::lock_guard<CallLock> l(mu_);
  for (const auto& [id, t] : tokens_) {
    if (id == token.id || t.secret_sha256 == secret_sha256) {
      return absl::AlreadyExistsError(absl::StrCat(
          "token ", id == token.id ? absl::StrCat("\"", id, "\"") : "with that secret",
          " already exists"));
    }
  }
  TokenRecord stored = token;
  stored.revoked_unix_ms.reset();
  tokens_[token.id] = Token{std::move(stored), secret_sha256};
  Tx tx;
  WriteAudit(tx, "", "", token.id);
  Commit(tx);
  return absl::OkStatus();
}

absl::StatusOr<TokenRecord> MemoryStore::FindToken(const std::string& secret_sha256) {
  std::lock_guard<CallLock> l(mu_);
  for (const auto& [id, t] : tokens_) {
    if (t.secret_sha256 == secret_sha256) return t.record;
  }
  return absl::NotFoundError("no such token");
}

absl::StatusOr<TokenRecord> MemoryStore::RevokeToken(const std::string& id, int64_t now_unix_ms) {
  std::lock_guard<CallLock> l(mu_);
  auto it = tokens_.find(id);
  if (it == tokens_.end()) return absl::NotFoundError(absl::StrCat("token \"", id, "\" not found"));
  if (!it->second.record.revoked_unix_ms.has_value()) {
    it->second.record.revoked_unix_ms = now_unix_ms;
  }
  Tx tx;
  WriteAudit(tx, "", "", id);
  Commit(tx);
  return it->second.record;
}

absl::StatusOr<std::vector<TokenRecord>> MemoryStore::ListTokens() {
  std::lock_guard<CallLock> l(mu_);
  std::vector<TokenRecord> out;
  for (const auto& [id, t] : tokens_) out.push_back(t.record);
  return out;
}

absl::StatusOr<std::string> MemoryStore::GetOrCreateClusterSecret(const std::string& name,
                                                                  const std::string& candidate) {
  std::lock_guard<CallLock> l(mu_);
  auto it = cluster_secrets_.find(name);
  if (it != cluster_secrets_.end()) return it->second;
  if (candidate.size() != 32) {
    return absl::InternalError(absl::StrCat("cluster secret \"", name, "\": ", candidate.size(),
                                            " bytes violates length(secret) = 32"));
  }
  cluster_secrets_[name] = candidate;
  return candidate;
}

// ---- Audit ----------------------------------------------------------------------

absl::Status MemoryStore::AppendAudit(const AuditRecord& record) {
  std::lock_guard<CallLock> l(mu_);
  AuditRecord r = record;
  InsertAudit(r);
  return absl::OkStatus();
}

absl::StatusOr<AuditPage> MemoryStore::ListAudit(const AuditQuery& query) {
  if (absl::Status s = CheckAuditQuery(query); !s.ok()) return s;
  std::lock_guard<CallLock> l(mu_);
  AuditPage page;
  for (auto it = audit_.rbegin(); it != audit_.rend(); ++it) {
    const AuditRecord& r = it->second;
    if (query.before_id != 0 && r.id >= query.before_id) continue;
    if (!query.tenants.empty() &&
        std::find(query.tenants.begin(), query.tenants.end(), r.tenant) == query.tenants.end()) {
      continue;
    }
    if (!query.job_id.empty() && r.job_id != query.job_id) continue;
    if (r.at_unix_ms < query.since_unix_ms) continue;
    if (static_cast<int>(page.records.size()) == query.page_size) {
      page.next_before_id = page.records.back().id;
      break;
    }
    page.records.push_back(r);
  }
  return page;
}

// ---- Retention ------------------------------------------------------------------

absl::StatusOr<PrunedRows> MemoryStore::PruneRetention(const RetentionPolicy& policy) {
  if (absl::Status s = CheckRetentionPolicy(policy); !s.ok()) return s;
  std::lock_guard<CallLock> l(mu_);
  const int64_t now = Now();
  PrunedRows pruned;
  // RETIRED beyond the newest `keep`, once a newer generation committed
  // before the cutoff; by job and number.
  int64_t budget = policy.batch_rows;
  for (auto& [job_id, job] : jobs_) {
    std::vector<int64_t> retired;
    for (const auto& [n, g] : job.generations) {
      if (g.state == GenerationState::kRetired) retired.push_back(n);
    }
    if (static_cast<int64_t>(retired.size()) <= policy.keep_retired_generations) continue;
    const int64_t newest_pruned =
        retired[retired.size() - 1 - static_cast<size_t>(policy.keep_retired_generations)];
    for (int64_t n : retired) {
      if (budget == 0 || n > newest_pruned) break;
      bool superseded = false;
      for (auto c = job.generations.upper_bound(n); c != job.generations.end(); ++c) {
        superseded = superseded || (c->second.committed_unix_ms.has_value() &&
                                    *c->second.committed_unix_ms < now - policy.retired_min_age_ms);
      }
      if (!superseded) continue;
      job.generations.erase(n);
      job.dataset_states.erase(n);
      for (auto f = job.rank_failures.begin(); f != job.rank_failures.end();) {
        f = f->first.first == n ? job.rank_failures.erase(f) : std::next(f);
      }
      --budget;
      ++pruned.generations;
    }
  }
  // DISCARDED once the operation that built it ended (its creation when gone).
  budget = policy.batch_rows;
  for (auto& [job_id, job] : jobs_) {
    for (auto g = job.generations.begin(); g != job.generations.end() && budget > 0;) {
      int64_t since = g->second.created_unix_ms;
      if (const Operation* op = FindOperation(g->second.operation_id)) {
        if (op->finished_unix_ms.has_value()) since = *op->finished_unix_ms;
      }
      if (g->second.state != GenerationState::kDiscarded ||
          since >= now - policy.discarded_min_age_ms) {
        ++g;
        continue;
      }
      job.dataset_states.erase(g->first);
      g = job.generations.erase(g);
      --budget;
      ++pruned.generations;
    }
  }
  // Finished operations beyond the newest `keep` of their job, oldest finished first.
  std::vector<std::pair<int64_t, std::string>> candidates;  // (finished, id)
  for (const auto& [job_id, job] : jobs_) {
    const std::vector<const Operation*> ops = OperationsOfJob(job_id);
    if (static_cast<int64_t>(ops.size()) <= policy.keep_operations) continue;
    const int64_t newest_pruned_seq =
        ops[ops.size() - 1 - static_cast<size_t>(policy.keep_operations)]->seq;
    for (const Operation* op : ops) {
      if (op->seq > newest_pruned_seq || !IsTerminalState(op->row.state())) continue;
      if (!op->finished_unix_ms.has_value() ||
          *op->finished_unix_ms >= now - policy.operation_min_age_ms) {
        continue;
      }
      candidates.emplace_back(*op->finished_unix_ms, op->row.id());
    }
  }
  std::sort(candidates.begin(), candidates.end());
  if (static_cast<int64_t>(candidates.size()) > policy.batch_rows) {
    candidates.resize(static_cast<size_t>(policy.batch_rows));
  }
  for (const auto& [finished, id] : candidates) {
    for (auto k = keys_.begin(); k != keys_.end();) {
      k = k->second.resource_id == id && !k->second.job_id.empty() ? keys_.erase(k)
                                                                    : std::next(k);
    }
    DeleteOperation(id);
    ++pruned.operations;
  }
  // Audit rows older than the age, oldest first.
  for (auto a = audit_.begin(); a != audit_.end() && pruned.audit < policy.batch_rows;) {
    if (a->second.at_unix_ms >= now - policy.audit_min_age_ms) {
      ++a;
      continue;
    }
    a = audit_.erase(a);
    ++pruned.audit;
  }
  return pruned;
}

}  // namespace reshard::coordinator
