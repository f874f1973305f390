// MemoryStore: construction and what every part shares (views of jobs and
// operations as PgStore reads them, generations, idempotency keys, audit
// rows, versions). The Store methods live in one file per aggregate, as
// PgStore's: memory_jobs.cc, memory_operations.cc and memory_prepare.cc,
// memory_hosts.cc, memory_auth.cc, memory_retention.cc.
#include "services/coordinator/store/memory_store.h"

#include <algorithm>
#include <chrono>
#include <set>

#include "absl/strings/str_cat.h"
#include "planner/layout.h"
#include "services/coordinator/store/memory_store_internal.h"
#include "services/coordinator/store/store_checks.h"

namespace reshard::coordinator {
namespace mem {

absl::Status JobNotFound(absl::string_view job_id) {
  return absl::NotFoundError(absl::StrCat("job \"", job_id, "\" not found"));
}

absl::Status OperationNotFound(absl::string_view operation_id) {
  return absl::NotFoundError(absl::StrCat("operation \"", operation_id, "\" not found"));
}

absl::StatusOr<std::vector<std::string>> RankHosts(const v1::Layout& layout,
                                                   absl::string_view what) {
  const int tp = layout.config().tp(), pp = layout.config().pp(), dp = layout.config().dp();
  const int cp = std::max(layout.config().cp(), 1);
  const int world = tp * pp * dp * cp;
  const std::vector<v1::DeviceSlot> slots = planner::ExpandPlacement(layout.placement());
  if (world <= 0 || static_cast<int64_t>(slots.size()) != world) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": placement has ", slots.size(),
                                                   " ranks but tp x pp x dp x cp is ", tp, " x ",
                                                   pp, " x ", dp, " x ", cp));
  }
  std::vector<std::string> hosts;
  hosts.reserve(slots.size());
  for (const v1::DeviceSlot& slot : slots) {
    if (absl::Status s = CheckText(absl::StrCat(what, " host"), slot.host()); !s.ok()) return s;
    hosts.push_back(slot.host());
  }
  return hosts;
}

std::vector<std::string> HostIds(const std::vector<HostProgress>& hosts) {
  std::vector<std::string> ids;
  for (const HostProgress& h : hosts) ids.push_back(h.host_id);
  return ids;
}

}  // namespace mem

MemoryStore::MemoryStore(MemoryStoreOptions options) : options_(std::move(options)) {}
MemoryStore::~MemoryStore() = default;

int64_t MemoryStore::Now() const {
  if (options_.now_unix_ms) return options_.now_unix_ms();
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

void MemoryStore::TouchJob(Job& job) {
  job.row.set_updated_unix_ms(Now());
  AdvanceVersion(job);
}

void MemoryStore::TouchOperation(Operation& op) {
  op.row.set_updated_unix_ms(Now());
  AdvanceVersion(op);
}

void MemoryStore::TouchJobOf(const Operation& op) {
  if (Job* job = FindJob(op.row.job_id())) AdvanceVersion(*job);
}

void MemoryStore::Commit(Tx& tx) {
  for (AuditRecord& r : tx.audit) {
    AuditRecord* current = AuditScope::Current();
    InsertAudit(r);
    if (current != nullptr) {
      *current = r;
      current->committed = true;
    }
  }
  tx.audit.clear();
}

void MemoryStore::TellTasks(const std::vector<std::string>& host_ids) const {
  if (options_.on_tasks_changed && !host_ids.empty()) options_.on_tasks_changed(host_ids);
}

MemoryStore::Job* MemoryStore::FindJob(const std::string& job_id) {
  auto it = jobs_.find(job_id);
  return it == jobs_.end() ? nullptr : &it->second;
}

MemoryStore::Operation* MemoryStore::FindOperation(const std::string& operation_id) {
  auto it = operations_.find(operation_id);
  return it == operations_.end() ? nullptr : &it->second;
}

absl::StatusOr<MemoryStore::Operation*> MemoryStore::OperationWithRows(
    const std::string& operation_id, const std::vector<HostProgress>& hosts) {
  if (absl::Status s = CheckHostRows(operation_id, hosts, /*check_states=*/false); !s.ok()) {
    return s;
  }
  Operation* op = FindOperation(operation_id);
  if (op == nullptr) return mem::OperationNotFound(operation_id);
  return op;
}

std::vector<const MemoryStore::Operation*> MemoryStore::OperationsOfJob(
    const std::string& job_id) const {
  std::vector<const Operation*> ops;
  for (const auto& [seq, id] : operation_seq_) {
    const Operation& op = operations_.at(id);
    if (op.row.job_id() == job_id) ops.push_back(&op);
  }
  return ops;
}

std::vector<const MemoryStore::Operation*> MemoryStore::ActiveOperationsOfJob(
    const std::string& job_id) const {
  std::vector<const Operation*> ops;
  for (const Operation* op : OperationsOfJob(job_id)) {
    if (IsActiveState(op->row.state())) ops.push_back(op);
  }
  return ops;
}

bool MemoryStore::HostLost(const std::string& host_id) const {
  auto it = hosts_.find(host_id);
  return it != hosts_.end() && it->second.state == v1::HOST_STATE_LOST;
}

bool MemoryStore::JobHasLostHosts(const Job& job) const {
  if (!job.lost_hosts.empty()) return true;
  auto g = job.generations.find(job.row.generation());
  if (g == job.generations.end()) return false;
  for (const std::string& h : g->second.rank_hosts) {
    if (HostLost(h)) return true;
  }
  return false;
}

void MemoryStore::SettleJobState(Job& job) {
  job.row.set_state(JobHasLostHosts(job) ? v1::JOB_STATE_DEGRADED : v1::JOB_STATE_ACTIVE);
  TouchJob(job);
}

void MemoryStore::KeepReconfiguring(Job& job) {
  if (job.row.state() != v1::JOB_STATE_ACTIVE) return;
  if (ActiveOperationsOfJob(job.row.id()).empty()) return;
  job.row.set_state(v1::JOB_STATE_RECONFIGURING);
  TouchJob(job);
}

void MemoryStore::TouchJobsOnHost(const std::string& host_id) {
  for (auto& [id, job] : jobs_) {
    auto g = job.generations.find(job.row.generation());
    if (g == job.generations.end()) continue;
    const std::vector<std::string>& hosts = g->second.rank_hosts;
    if (std::find(hosts.begin(), hosts.end(), host_id) != hosts.end()) {
      AdvanceVersion(job);
    }
  }
}

v1::Job MemoryStore::JobView(const Job& job) const {
  v1::Job out = job.row;
  auto g = job.generations.find(job.row.generation());
  std::set<std::string> lost = job.lost_hosts;
  if (g != job.generations.end()) {
    *out.mutable_layout() = g->second.layout;
    for (const std::string& h : g->second.rank_hosts) {
      if (HostLost(h)) lost.insert(h);
    }
  }
  for (const std::string& h : lost) out.add_lost_hosts(h);
  const std::vector<const Operation*> ops = OperationsOfJob(job.row.id());
  for (const Operation* op : ops) {
    if (IsActiveState(op->row.state())) {
      out.set_active_operation_id(op->row.id());
      break;
    }
  }
  // Waits for its step boundary and is not queued behind an active checkpoint.
  for (const Operation* op : ops) {
    if (op->row.state() != v1::OPERATION_STATE_PENDING ||
        op->row.step_boundary() != v1::STEP_BOUNDARY_WAITING) {
      continue;
    }
    auto behind = operations_.find(op->row.queued_behind_operation_id());
    if (behind != operations_.end() && IsActiveState(behind->second.row.state())) continue;
    out.set_step_boundary_operation_id(op->row.id());
    break;
  }
  auto d = job.dataset_states.find(job.row.generation());
  if (d != job.dataset_states.end()) *out.mutable_dataset_state() = d->second;
  for (const auto& [key, failure] : job.rank_failures) {
    if (key.first == job.row.generation()) *out.add_failed_ranks() = failure;
  }
  return out;
}

OperationRecord MemoryStore::OperationView(const Operation& op, bool include_plan) const {
  OperationRecord record;
  record.op = op.row;
  SetDerivedFields(&record.op);
  record.lost_hosts = op.lost_hosts;
  record.lost_ranks = op.lost_ranks;
  if (include_plan) {
    record.plan = op.plan;
    record.skipped_steps = op.skipped_steps;
  }
  return record;
}

int64_t MemoryStore::MaxGeneration(const Job& job) const {
  return job.generations.empty() ? 0 : job.generations.rbegin()->first;
}

absl::Status MemoryStore::CheckNewGeneration(const Job& job, int64_t generation,
                                             const v1::Layout& layout, GenerationState state,
                                             const std::string& operation_id,
                                             const std::string& what) const {
  absl::StatusOr<std::vector<std::string>> hosts = mem::RankHosts(layout, what);
  if (!hosts.ok()) return hosts.status();
  if (job.generations.count(generation) > 0) {
    return absl::AlreadyExistsError(absl::StrCat("job \"", job.row.id(), "\" has generation ",
                                                 generation, " already"));
  }
  for (const auto& [n, g] : job.generations) {
    const bool taken =
        state == GenerationState::kCurrent ||
        (state == GenerationState::kPending && g.operation_id == operation_id);
    if (g.state == state && taken) {
      return absl::AlreadyExistsError(absl::StrCat("job \"", job.row.id(), "\" has a ",
                                                   state == GenerationState::kCurrent
                                                       ? "current"
                                                       : "pending",
                                                   " generation (", n, ") already"));
    }
  }
  return absl::OkStatus();
}

void MemoryStore::InsertGeneration(Job& job, int64_t generation, const v1::Layout& layout,
                                   GenerationState state, const std::string& operation_id) {
  Generation& g = job.generations[generation];
  g.layout = layout;
  g.state = state;
  g.operation_id = operation_id;
  g.rank_hosts = *mem::RankHosts(layout, "layout");  // checked by CheckNewGeneration
  g.created_unix_ms = Now();
}

absl::Status MemoryStore::InsertPendingGeneration(const Operation& op) {
  Job* job = FindJob(op.row.job_id());
  if (job == nullptr) return mem::JobNotFound(op.row.job_id());
  const int64_t generation = op.row.to_generation();
  if (absl::Status s = CheckNewGeneration(*job, generation, op.row.target_layout(),
                                          GenerationState::kPending, op.row.id(), "target");
      !s.ok()) {
    return s;
  }
  InsertGeneration(*job, generation, op.row.target_layout(), GenerationState::kPending,
                   op.row.id());
  return absl::OkStatus();
}

void MemoryStore::DiscardPendingGeneration(Job& job, int64_t generation) {
  auto g = job.generations.find(generation);
  if (g != job.generations.end() && g->second.state == GenerationState::kPending) {
    g->second.state = GenerationState::kDiscarded;
  }
}

void MemoryStore::WriteAudit(Tx& tx, const std::string& job_id, const std::string& operation_id,
                             const std::string& target) {
  AuditRecord* current = AuditScope::Current();
  if (current == nullptr) return;
  AuditRecord r = SucceededAudit(*current, job_id, operation_id, target);
  // The tenant and job as the row would take them now (a delete removes the job).
  std::string job = r.job_id;
  if (job.empty() && !r.operation_id.empty()) {
    if (const Operation* op = FindOperation(r.operation_id)) job = op->row.job_id();
  }
  r.job_id = job;
  if (r.tenant.empty()) {
    if (const Job* j = FindJob(job)) r.tenant = j->row.tenant();
  }
  tx.audit.push_back(std::move(r));
}

void MemoryStore::InsertAudit(AuditRecord& r) {
  if (r.job_id.empty() && !r.operation_id.empty()) {
    if (const Operation* op = FindOperation(r.operation_id)) r.job_id = op->row.job_id();
  }
  if (r.tenant.empty()) {
    if (const Job* j = FindJob(r.job_id)) r.tenant = j->row.tenant();
  }
  auto field = [](const std::string& s) { return Storable(s, kMaxAuditFieldBytes); };
  r.identity = field(r.identity);
  r.role = field(r.role);
  r.tenant = field(r.tenant);
  r.method = field(r.method);
  r.job_id = field(r.job_id);
  r.operation_id = field(r.operation_id);
  r.target = field(r.target);
  r.idempotency_key = field(r.idempotency_key);
  r.code = field(r.code);
  r.message = Storable(r.message, kMaxAuditMessageBytes);
  r.id = ++next_audit_id_;
  r.at_unix_ms = Now();
  r.committed = true;
  audit_[r.id] = r;
}

absl::StatusOr<std::optional<std::string>> MemoryStore::FindKey(const Idempotency& idem) const {
  if (absl::Status s = CheckKeyScope(idem); !s.ok()) return s;
  auto it = keys_.find({idem.tenants, idem.key});
  std::optional<KeyUse> first;
  if (it != keys_.end()) {
    first = KeyUse{it->second.method, it->second.request_hash, it->second.resource_id};
  }
  return ReplayOf(idem, first);
}

bool MemoryStore::ClaimKey(const Idempotency& idem, const std::string& resource_id,
                           const std::string& job_id) {
  return keys_
      .emplace(std::make_pair(idem.tenants, idem.key),
               KeyRow{idem.method, idem.request_hash, resource_id, job_id})
      .second;
}

absl::StatusOr<std::optional<std::string>> MemoryStore::LookupIdempotencyKey(
    const Idempotency& idem) {
  using Found = std::optional<std::string>;
  if (idem.key.empty()) return Found();
  if (absl::Status s = mem::CheckText("idempotency key", idem.key); !s.ok()) return s;
  std::lock_guard<CallLock> l(mu_);
  return FindKey(idem);
}

}  // namespace reshard::coordinator
