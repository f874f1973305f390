// MemoryStore: retention (Store::PruneRetention, as pg_retention.cc).
#include <algorithm>

#include "absl/strings/str_cat.h"
#include "services/coordinator/store/memory_store.h"
#include "services/coordinator/store/memory_store_internal.h"
#include "services/coordinator/store/store_checks.h"

namespace reshard::coordinator {

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
      k = k->second.resource_id == id && !k->second.job_id.empty() ? keys_.erase(k) : std::next(k);
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
