#include "services/coordinator/logic/policy_engine.h"

#include <algorithm>
#include <map>
#include <set>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "advisor/advisor.h"
#include "common/log.h"
#include "planner/layout.h"
#include "planner/survivor.h"
#include "services/coordinator/logic/error_text.h"
#include "services/coordinator/logic/operation_states.h"
#include "services/coordinator/logic/redundancy.h"
#include "services/coordinator/logic/request_checks.h"
#include "services/coordinator/logic/spares.h"
#include "services/coordinator/store/audit.h"

namespace reshard::coordinator {

absl::Status CheckPolicy(const v1::ElasticPolicy& policy, absl::string_view field) {
  if (policy.min_devices() < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ".min_devices is ", policy.min_devices(), "; it must be >= 0"));
  }
  if (policy.max_devices() < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ".max_devices is ", policy.max_devices(), "; it must be >= 0"));
  }
  if (policy.max_devices() > 0 && policy.max_devices() < policy.min_devices()) {
    return absl::InvalidArgumentError(absl::StrCat(field, ".max_devices ", policy.max_devices(),
                                                   " is below min_devices ", policy.min_devices()));
  }
  if (!v1::ElasticPolicy::GrowAt_IsValid(policy.grow_at())) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ".grow_at is ", policy.grow_at(), ", not a GrowAt"));
  }
  if (policy.spare_hosts_size() > kMaxPolicySpares) {
    return absl::InvalidArgumentError(absl::StrCat(field, ".spare_hosts has ",
                                                   policy.spare_hosts_size(), " hosts; at most ",
                                                   kMaxPolicySpares));
  }
  std::set<std::string> seen;
  for (const std::string& h : policy.spare_hosts()) {
    if (absl::Status s = RequireNonEmpty(absl::StrCat(field, ".spare_hosts[]"), h); !s.ok()) {
      return s;
    }
    if (!seen.insert(h).second) {
      return absl::InvalidArgumentError(
          absl::StrCat(field, ".spare_hosts names \"", h, "\" twice"));
    }
  }
  return absl::OkStatus();
}

PolicyEngine::PolicyEngine(StorePtr store, SchedulerApi* api, const Clock* clock, Options options)
    : store_(std::move(store)), api_(api), clock_(clock), options_(options) {}

absl::Status PolicyEngine::MaybePass(bool force) {
  const int64_t now = clock_->NowUnixMs();
  if (!force && last_pass_ms_ != 0 && now - last_pass_ms_ < options_.period_ms) {
    return absl::OkStatus();
  }
  last_pass_ms_ = now;
  absl::StatusOr<std::vector<std::string>> jobs = store_->JobsWithPolicy();
  if (!jobs.ok()) return jobs.status();
  absl::Status first;
  for (const std::string& id : *jobs) {
    absl::Status s = Apply(id);
    if (!s.ok()) {
      RESHARD_LOG(WARNING) << "job=" << id << " policy not applied: " << s;
      if (first.ok()) first = s;
    }
  }
  return first;
}

absl::Status PolicyEngine::Apply(const std::string& job_id) {
  absl::StatusOr<v1::Job> job = store_->GetJob(job_id, /*include_ptc=*/false);
  if (absl::IsNotFound(job.status())) return absl::OkStatus();  // deleted since the listing
  if (!job.ok()) return job.status();
  if (!job->has_policy() || !job->active_operation_id().empty()) return absl::OkStatus();
  const v1::ElasticPolicy& policy = job->policy();
  std::string status;
  if (!job->lost_hosts().empty()) {
    status = policy.heal() ? Heal(*job)
                           : absl::StrCat("not healing: ", absl::StrJoin(job->lost_hosts(), ", "),
                                          " lost and the policy does not heal");
  } else if (job->state() == v1::JOB_STATE_ACTIVE && policy.grow()) {
    status = Grow(*job);
  }
  if (status.empty()) return absl::OkStatus();  // nothing to do: the last status stands
  return store_->SetPolicyStatus(job_id, TruncateError(status));
}

namespace {

// The job's free spares: offered by its policy, ALIVE, and used by no
// job's current generation.
absl::StatusOr<std::vector<Spare>> FreeSpares(Store& store, const v1::Job& job) {
  absl::StatusOr<std::vector<Spare>> alive = AliveSpares(store, job.policy().spare_hosts());
  if (!alive.ok()) return alive.status();
  std::vector<Spare> free;
  for (Spare& s : *alive) {
    absl::StatusOr<std::vector<std::string>> users = store.JobsOnHosts({s.host});
    if (!users.ok()) return users.status();
    if (users->empty()) free.push_back(std::move(s));
  }
  return free;
}

// The most ranks the job has on one host: what a spare without
// accelerators (host memory only) takes.
int RanksPerHost(const v1::Layout& layout) {
  std::map<std::string, int> count;
  int most = 1;
  for (const v1::DeviceSlot& s : planner::ExpandPlacement(layout.placement())) {
    most = std::max(most, ++count[s.host()]);
  }
  return most;
}

// The key of `action` on the job's generation under its policy as it is
// now: a pass asks once; a changed policy (SetPolicy) asks again.
std::string OperationKey(absl::string_view action, const v1::Job& job) {
  uint64_t h = 1469598103934665603ull;  // FNV-1a of the policy's bytes: stable everywhere
  for (const unsigned char c : job.policy().SerializeAsString()) {
    h = (h ^ c) * 1099511628211ull;
  }
  return absl::StrCat(kPolicyKeyPrefix, action, ":", job.id(), ":", job.generation(), ":",
                      absl::Hex(h, absl::kZeroPad16));
}

}  // namespace

template <typename Create>
std::string PolicyEngine::Act(const v1::Job& job, const std::string& method, const std::string& key,
                              const std::string& reason, Create create) {
  // A pass after the first for this generation looks at what it started.
  if (auto it = acted_.find(job.id()); it != acted_.end() && it->second.key == key) {
    absl::StatusOr<OperationRecord> op = store_->GetOperation(it->second.operation_id, false);
    if (!op.ok() || op->op.state() == v1::OPERATION_STATE_COMMITTED) return "";
    if (IsFinal(op->op.state())) {
      return absl::StrCat(reason, ": operation ", op->op.id(), " ended ",
                          v1::OperationState_Name(op->op.state()), ": ", op->op.error(),
                          "; not retried for generation ", job.generation());
    }
    return "";
  }
  AuditRecord record;
  record.identity = "policy";
  record.role = "policy";
  record.method = method;
  record.job_id = job.id();
  record.idempotency_key = key;
  record.message = reason;
  absl::StatusOr<v1::Operation> op;
  {
    AuditScope scope(&record);
    op = create(key);
  }
  if (!op.ok() || !record.committed) {
    record.code = absl::StatusCodeToString(op.status().code());
    if (!op.ok()) record.message = absl::StrCat(reason, ": ", op.status().message());
    if (absl::Status s = store_->AppendAudit(record); !s.ok()) {
      RESHARD_LOG(WARNING) << "job=" << job.id() << " audit row of the policy's " << method
                           << " not written: " << s;
    }
  }
  if (!op.ok()) {
    RESHARD_LOG(WARNING) << "job=" << job.id() << " " << reason << ": refused: " << op.status();
    // Refused before anything was made: the next generation may fare better,
    // this one is not asked again.
    acted_[job.id()] = {key, ""};
    return absl::StrCat(reason, ": refused: ", op.status().message());
  }
  acted_[job.id()] = {key, op->id()};
  RESHARD_LOG(INFO) << "job=" << job.id() << " operation=" << op->id() << " " << reason;
  return absl::StrCat(reason, " (operation ", op->id(), ")");
}

std::string PolicyEngine::Heal(const v1::Job& job) {
  const v1::ElasticPolicy& policy = job.policy();
  absl::StatusOr<std::vector<Spare>> spares = FreeSpares(*store_, job);
  if (!spares.ok())
    return absl::StrCat("heal: the spares could not be read: ", spares.status().message());
  // Each lost host's ranks onto a free spare while there is one, the rest
  // onto the survivors.
  v1::Layout target = job.layout();
  std::vector<std::string> onto, left;
  std::vector<bool> taken(spares->size(), false);
  for (const std::string& lost : job.lost_hosts()) {
    bool placed = false;
    for (size_t i = 0; i < spares->size() && !placed; ++i) {
      if (taken[i]) continue;
      if (std::optional<v1::Layout> t = OntoSpare(target, lost, (*spares)[i])) {
        target = *std::move(t);
        taken[i] = placed = true;
        onto.push_back(absl::StrCat(lost, " onto spare ", (*spares)[i].host));
      }
    }
    if (!placed) left.push_back(lost);
  }
  if (!left.empty()) {
    absl::StatusOr<v1::Layout> survivors = planner::SurvivorLayout(target, left, {});
    if (!survivors.ok()) {
      return absl::StrCat("waiting: ", absl::StrJoin(left, ", "),
                          " lost and no free spare takes its ranks; the survivors cannot hold "
                          "the job: ",
                          survivors.status().message());
    }
    target = *std::move(survivors);
  }
  const int64_t world = planner::WorldSize(target.config());
  const int min = std::max(1, policy.min_devices());
  if (world < min) {
    return absl::StrCat("waiting: ", absl::StrJoin(job.lost_hosts(), ", "),
                        " lost; the survivors and free spares hold ", world, " devices (",
                        LayoutText(target), "), below min_devices ", min);
  }
  v1::RecoverFromFailureRequest request;
  request.set_job_id(job.id());
  request.set_expected_generation(job.generation());
  for (const std::string& h : job.lost_hosts()) request.add_lost_hosts(h);
  *request.mutable_target() = target;
  request.set_accept_degraded(policy.accept_degraded());
  std::vector<std::string> how = onto;
  if (!left.empty()) how.push_back(absl::StrCat(absl::StrJoin(left, ", "), " onto the survivors"));
  const std::string reason =
      absl::StrCat("policy heal: ", absl::StrJoin(job.lost_hosts(), ", "), " lost; recovering ",
                   absl::StrJoin(how, "; "), " (", LayoutText(target), ")");
  return Act(job, "RecoverFromFailure", OperationKey("heal", job), reason,
             [&](const std::string& key) {
               request.set_idempotency_key(key);
               return api_->RecoverFromFailure(request);
             });
}

std::string PolicyEngine::Grow(const v1::Job& job) {
  const v1::ElasticPolicy& policy = job.policy();
  absl::StatusOr<std::vector<Spare>> spares = FreeSpares(*store_, job);
  if (!spares.ok())
    return absl::StrCat("grow: the spares could not be read: ", spares.status().message());
  if (spares->empty()) return "";
  const v1::ParallelConfig& config = job.layout().config();
  const int64_t world = planner::WorldSize(config);
  const int64_t group = world / std::max(1, config.dp());  // ranks per data-parallel replica
  std::vector<v1::DeviceSlot> slots = planner::ExpandPlacement(job.layout().placement());
  const int per_host = RanksPerHost(job.layout());
  for (const Spare& s : *spares) {
    std::vector<int> devices = s.devices;
    if (devices.empty()) {
      for (int d = 0; d < per_host; ++d) devices.push_back(d);
    }
    for (int d : devices) {
      v1::DeviceSlot slot;
      slot.set_host(s.host);
      slot.set_device(d);
      slots.push_back(std::move(slot));
    }
  }
  int64_t dp = static_cast<int64_t>(slots.size()) / group;
  if (policy.max_devices() > 0) dp = std::min<int64_t>(dp, policy.max_devices() / group);
  if (dp <= config.dp()) return "";  // no room for another replica
  v1::Layout target;
  *target.mutable_config() = config;
  target.mutable_config()->set_dp(static_cast<int32_t>(dp));
  target.mutable_config()->set_dp_shard(advisor::KeptDpShard(&job.layout(), static_cast<int>(dp)));
  std::vector<std::string> used;  // the spares the new ranks take
  const int64_t before =
      static_cast<int64_t>(planner::ExpandPlacement(job.layout().placement()).size());
  for (int64_t r = 0; r < dp * group; ++r) {
    *target.mutable_placement()->add_ranks() = slots[r];
    if (r >= before && (used.empty() || used.back() != slots[r].host())) {
      used.push_back(slots[r].host());
    }
  }
  v1::ResizeRequest request;
  request.set_job_id(job.id());
  request.set_expected_generation(job.generation());
  *request.mutable_config() = target.config();
  *request.mutable_placement() = target.placement();
  request.set_at_step_boundary(policy.grow_at() == v1::ElasticPolicy::GROW_AT_STEP_BOUNDARY);
  request.set_stop_free(policy.grow_at() == v1::ElasticPolicy::GROW_STOP_FREE);
  const std::string reason = absl::StrCat(
      "policy grow: onto free spare", used.size() > 1 ? "s " : " ", absl::StrJoin(used, ", "),
      "; dp ", config.dp(), " -> ", dp, " (", LayoutText(target), ") ",
      policy.grow_at() == v1::ElasticPolicy::GROW_AT_STEP_BOUNDARY ? "at the next step boundary"
      : policy.grow_at() == v1::ElasticPolicy::GROW_STOP_FREE      ? "stop-free"
                                                                   : "now");
  return Act(job, "Resize", OperationKey("grow", job), reason, [&](const std::string& key) {
    request.set_idempotency_key(key);
    return api_->Resize(request);
  });
}

}  // namespace reshard::coordinator
