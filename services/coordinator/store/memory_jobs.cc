// MemoryStore: the jobs aggregate (job_store.h): jobs, their PTCs, dataset
// steps, rank failures and generations' checksums (as pg_jobs.cc,
// pg_dataset_state.cc, pg_rank_failures.cc).
#include <algorithm>
#include <set>

#include "absl/strings/str_cat.h"
#include "common/rpc/enum_name.h"
#include "services/coordinator/store/memory_store.h"
#include "services/coordinator/store/memory_store_internal.h"
#include "services/coordinator/store/state_memory.h"
#include "services/coordinator/store/store_checks.h"

namespace reshard::coordinator {
namespace {

// The PTC as PgStore stores and returns it (ptc_tensors, ptc_blobs,
// ptc_buckets): only the fields it keeps.
v1::Ptc StoredPtc(const v1::Ptc& ptc) {
  v1::Ptc out;
  out.set_num_layers(ptc.num_layers());
  for (const v1::TensorSpec& t : ptc.tensors()) {
    v1::TensorSpec* s = out.add_tensors();
    s->set_name(t.name());
    s->set_dtype(t.dtype());
    *s->mutable_shape() = t.shape();
    *s->mutable_partition() = t.partition();
  }
  for (const v1::BlobSpec& b : ptc.blobs()) {
    v1::BlobSpec* s = out.add_blobs();
    s->set_name(b.name());
    s->set_size_bytes(b.size_bytes());
    s->set_scope(b.scope());
    s->set_regenerable(b.regenerable());
  }
  *out.mutable_buckets() = ptc.buckets();
  return out;
}

// CheckPtc, then the names' uniqueness (PgStore's primary keys).
absl::StatusOr<int64_t> PtcBytes(const v1::Ptc& ptc) {
  absl::StatusOr<int64_t> total = CheckPtc(ptc);
  if (!total.ok()) return total;
  std::set<std::string> tensors, blobs;
  for (const v1::TensorSpec& t : ptc.tensors()) {
    if (!tensors.insert(t.name()).second) {
      return absl::AlreadyExistsError(absl::StrCat("tensor \"", t.name(), "\" listed twice"));
    }
  }
  for (const v1::BlobSpec& b : ptc.blobs()) {
    if (!blobs.insert(b.name()).second) {
      return absl::AlreadyExistsError(absl::StrCat("blob \"", b.name(), "\" listed twice"));
    }
  }
  return total;
}

}  // namespace

absl::StatusOr<v1::Job> MemoryStore::CreateJob(const std::string& job_id, const v1::JobSpec& spec,
                                               const Idempotency& idem,
                                               const v1::DatasetState* dataset_state) {
  if (absl::Status s = CheckNewJob(job_id, spec, idem); !s.ok()) return s;
  absl::StatusOr<int64_t> total_bytes = PtcBytes(spec.ptc());
  if (!total_bytes.ok()) return total_bytes.status();
  absl::StatusOr<std::vector<std::string>> ranks = mem::RankHosts(spec.layout(), "layout");
  if (!ranks.ok()) return ranks.status();

  std::lock_guard<CallLock> l(mu_);
  Tx tx;
  auto replay = [&](const std::string& first) -> absl::StatusOr<v1::Job> {
    Job* job = FindJob(first);
    if (job == nullptr) return mem::JobNotFound(first);
    WriteAudit(tx, first, "");
    Commit(tx);
    return JobView(*job);
  };
  if (!idem.key.empty()) {
    absl::StatusOr<std::optional<std::string>> first = FindKey(idem);
    if (!first.ok()) return first.status();
    if (first->has_value()) return replay(**first);
  }
  for (const auto& [id, job] : jobs_) {
    if (job.row.tenant() == spec.tenant() && job.row.name() == spec.name()) {
      return absl::AlreadyExistsError(absl::StrCat("job \"", spec.name(), "\" of tenant \"",
                                                   spec.tenant(), "\" already exists"));
    }
  }
  if (jobs_.count(job_id) > 0) {
    return absl::AlreadyExistsError(absl::StrCat("job \"", job_id, "\" already exists"));
  }
  const int64_t now = Now();
  Job& job = jobs_[job_id];
  job.row.set_id(job_id);
  job.row.set_tenant(spec.tenant());
  job.row.set_name(spec.name());
  job.row.set_state_memory(StoredStateMemory(spec.state_memory()));
  job.row.set_state(v1::JOB_STATE_ACTIVE);
  job.row.set_generation(1);
  job.row.set_tensor_count(spec.ptc().tensors_size());
  job.row.set_total_bytes(*total_bytes);
  job.row.set_created_unix_ms(now);
  if (spec.has_policy()) *job.row.mutable_policy() = spec.policy();
  job.ptc = StoredPtc(spec.ptc());
  InsertGeneration(job, 1, spec.layout(), GenerationState::kCurrent, "");
  if (dataset_state != nullptr) {
    v1::DatasetState d = *dataset_state;
    d.set_committed_generation(1);
    d.set_committed_unix_ms(now);
    job.dataset_states[1] = std::move(d);
  }
  if (!idem.key.empty()) ClaimKey(idem, job_id, job_id);
  TouchJob(job);
  WriteAudit(tx, job_id, "");
  Commit(tx);
  return JobView(job);
}

absl::StatusOr<v1::Job> MemoryStore::GetJob(const std::string& job_id, bool include_ptc) {
  std::lock_guard<CallLock> l(mu_);
  const Job* job = FindJob(job_id);
  if (job == nullptr) return mem::JobNotFound(job_id);
  v1::Job out = JobView(*job);
  if (include_ptc) *out.mutable_ptc() = job->ptc;
  return out;
}

absl::StatusOr<v1::Ptc> MemoryStore::GetPtc(const std::string& job_id) {
  std::lock_guard<CallLock> l(mu_);
  const Job* job = FindJob(job_id);
  if (job == nullptr) return mem::JobNotFound(job_id);
  return job->ptc;
}

absl::StatusOr<JobPage> MemoryStore::ListJobs(const ListJobsQuery& query) {
  constexpr int kMaxPageSize = 10000;
  const int page_size = query.page_size <= 0
                            ? 100
                            : (query.page_size > kMaxPageSize ? kMaxPageSize : query.page_size);
  std::lock_guard<CallLock> l(mu_);
  JobPage page;
  for (auto it = jobs_.upper_bound(query.after_job_id); it != jobs_.end(); ++it) {
    const v1::Job& row = it->second.row;
    if (!query.tenant.empty() && row.tenant() != query.tenant) continue;
    if (query.state != v1::JOB_STATE_UNSPECIFIED && row.state() != query.state) continue;
    if (static_cast<int>(page.jobs.size()) == page_size) {
      page.next_after_job_id = page.jobs.back().id();
      break;
    }
    page.jobs.push_back(JobView(it->second));
  }
  return page;
}

absl::Status MemoryStore::DeleteJob(const std::string& job_id, const Idempotency& idem) {
  if (absl::Status s = mem::CheckText("idempotency key", idem.key); !s.ok()) return s;
  std::lock_guard<CallLock> l(mu_);
  if (!idem.key.empty()) {
    absl::StatusOr<std::optional<std::string>> first = FindKey(idem);
    if (!first.ok()) return first.status();
    if (first->has_value()) return absl::OkStatus();  // a retry: done before
  }
  Job* job = FindJob(job_id);
  if (job == nullptr) return mem::JobNotFound(job_id);
  const std::vector<const Operation*> active = ActiveOperationsOfJob(job_id);
  if (!active.empty()) {
    return absl::FailedPreconditionError(
        absl::StrCat("job \"", job_id, "\" has active operation \"", active[0]->row.id(), "\" (",
                     rpc::EnumShortName(active[0]->row.state()), ")"));
  }
  Tx tx;
  WriteAudit(tx, job_id, "");
  std::vector<std::string> ops;
  for (const Operation* op : OperationsOfJob(job_id)) ops.push_back(op->row.id());
  for (const std::string& id : ops) DeleteOperation(id);
  // Keys that name the job go with it (idempotency_keys.job_id cascades).
  for (auto it = keys_.begin(); it != keys_.end();) {
    it = it->second.job_id == job_id ? keys_.erase(it) : std::next(it);
  }
  jobs_.erase(job_id);
  if (!idem.key.empty()) ClaimKey(idem, job_id, "");
  Commit(tx);
  return absl::OkStatus();
}

absl::Status MemoryStore::SetJobState(const std::string& job_id, v1::JobState state) {
  if (state == v1::JOB_STATE_UNSPECIFIED) {
    return absl::InvalidArgumentError(
        absl::StrCat("job \"", job_id, "\": cannot set state JOB_STATE_UNSPECIFIED"));
  }
  std::lock_guard<CallLock> l(mu_);
  Job* job = FindJob(job_id);
  if (job == nullptr) return mem::JobNotFound(job_id);
  job->row.set_state(state);
  TouchJob(*job);
  return absl::OkStatus();
}

absl::StatusOr<v1::Job> MemoryStore::SetJobPolicy(const std::string& job_id,
                                                  const v1::ElasticPolicy* policy) {
  std::lock_guard<CallLock> l(mu_);
  Job* job = FindJob(job_id);
  if (job == nullptr) return mem::JobNotFound(job_id);
  Tx tx;
  if (policy == nullptr) {
    job->row.clear_policy();
  } else {
    *job->row.mutable_policy() = *policy;
  }
  TouchJob(*job);
  WriteAudit(tx, job_id, "");
  Commit(tx);
  return JobView(*job);
}

absl::Status MemoryStore::SetPolicyStatus(const std::string& job_id, const std::string& status) {
  std::lock_guard<CallLock> l(mu_);
  Job* job = FindJob(job_id);
  if (job == nullptr) return mem::JobNotFound(job_id);
  if (job->row.policy_status() == status) return absl::OkStatus();
  job->row.set_policy_status(status);
  TouchJob(*job);
  return absl::OkStatus();
}

absl::StatusOr<std::vector<std::string>> MemoryStore::JobsWithPolicy() {
  std::lock_guard<CallLock> l(mu_);
  std::vector<std::string> ids;
  for (const auto& [id, job] : jobs_) {
    if (job.row.has_policy()) ids.push_back(id);
  }
  return ids;
}

absl::StatusOr<std::vector<std::pair<v1::JobState, int64_t>>> MemoryStore::CountJobsByState() {
  std::lock_guard<CallLock> l(mu_);
  std::map<int, int64_t> counts;
  for (const auto& [id, job] : jobs_) ++counts[job.row.state()];
  std::vector<std::pair<v1::JobState, int64_t>> out;
  for (const auto& [state, n] : counts) out.emplace_back(static_cast<v1::JobState>(state), n);
  return out;
}

std::optional<PendingCheckpoint> MemoryStore::PendingCheckpointOf(const std::string& job_id) const {
  for (const Operation* op : ActiveOperationsOfJob(job_id)) {
    if (op->row.kind() != v1::OPERATION_KIND_CHECKPOINT) continue;
    PendingCheckpoint pending;
    pending.operation_id = op->row.id();
    pending.state = rpc::EnumShortName(op->row.state());
    pending.to_generation = op->row.to_generation();
    if (op->step.has_value()) {
      StepCommit step;
      step.job_id = job_id;
      step.generation = pending.to_generation;
      step.step = *op->step;
      step.cursor = op->step_cursor.value_or(0);
      pending.step = std::move(step);
    }
    return pending;
  }
  return std::nullopt;
}

absl::StatusOr<v1::DatasetState> MemoryStore::CommitStep(const StepCommit& commit) {
  if (absl::Status s = mem::CheckText("job id", commit.job_id); !s.ok()) return s;
  if (absl::Status s = mem::CheckText("layout_fingerprint", commit.layout_fingerprint); !s.ok()) {
    return s;
  }
  std::lock_guard<CallLock> l(mu_);
  Job* job = FindJob(commit.job_id);
  if (job == nullptr) return mem::JobNotFound(commit.job_id);
  const int64_t current = job->row.generation();
  auto committed = job->dataset_states.find(current);
  if (committed == job->dataset_states.end()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "job \"", commit.job_id,
        "\" has no dataset state: register it with RegisterJobRequest.dataset_state"));
  }
  StepCommitVerdict verdict;
  if (absl::Status s = CheckStepCommit(committed->second, current, commit, &verdict); !s.ok()) {
    return s;
  }
  if (verdict == StepCommitVerdict::kApply) {
    if (absl::Status s =
            CheckNoPendingCheckpoint(commit, current, PendingCheckpointOf(commit.job_id));
        !s.ok()) {
      return s;
    }
  }
  Tx tx;
  WriteAudit(tx, commit.job_id, "", absl::StrCat("step ", commit.step));
  if (verdict == StepCommitVerdict::kApply) {
    v1::DatasetState& d = committed->second;
    d.set_cursor(commit.cursor);
    d.set_step(commit.step);
    d.set_committed_generation(current);
    d.set_committed_unix_ms(Now());
    TouchJob(*job);
  }
  Commit(tx);
  return committed->second;
}

absl::StatusOr<v1::RankFailure> MemoryStore::RecordRankFailure(const RankFailureReport& report) {
  if (absl::Status s = mem::CheckText("job id", report.job_id); !s.ok()) return s;
  if (absl::Status s = mem::CheckText("reason", report.reason); !s.ok()) return s;
  std::lock_guard<CallLock> l(mu_);
  Job* job = FindJob(report.job_id);
  if (job == nullptr) return mem::JobNotFound(report.job_id);
  const int64_t current = job->row.generation();
  if (current != report.generation) {
    return absl::AbortedError(absl::StrCat("job \"", report.job_id, "\" is at generation ",
                                           current, ", not ", report.generation,
                                           " any more; retry"));
  }
  if (report.rank < 0) {
    return absl::InternalError(absl::StrCat("rank ", report.rank, " violates rank >= 0"));
  }
  Tx tx;
  WriteAudit(tx, report.job_id, "",
             absl::StrCat("rank ", report.rank, ": ", mem::CutUtf8(report.reason, 200)));
  v1::RankFailure& f = job->rank_failures[{report.generation, report.rank}];
  f.set_rank(report.rank);
  f.set_generation(report.generation);
  f.set_reason(report.reason);
  f.set_reported_by(report.reported_by);
  f.set_reported_unix_ms(Now());
  TouchJob(*job);
  Commit(tx);
  return f;
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

}  // namespace reshard::coordinator
