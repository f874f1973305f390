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
#include "services/coordinator/logic/advise_api.h"
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
  if (policy.has_advise() && policy.allowed_size() > 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ".allowed and ", field,
                     ".advise exclude one another: list the layouts, or let the advisor choose"));
  }
  if (policy.spare_hosts_size() > kMaxPolicySpares) {
    return absl::InvalidArgumentError(absl::StrCat(field, ".spare_hosts has ",
                                                   policy.spare_hosts_size(), " hosts; at most ",
                                                   kMaxPolicySpares));
  }
  for (int i = 0; i < policy.allowed_size(); ++i) {
    const v1::ParallelConfig& c = policy.allowed(i);
    if (c.tp() < 1 || c.pp() < 1 || c.dp() < 1) {
      return absl::InvalidArgumentError(absl::StrCat(field, ".allowed[", i, "] is tp ", c.tp(),
                                                     " pp ", c.pp(), " dp ", c.dp(),
                                                     "; each must be >= 1"));
    }
  }
  return CheckSpareHosts(absl::StrCat(field, ".spare_hosts"), policy.spare_hosts());
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

namespace {

// Every slot of `spares`: its accelerators, or without any as many device
// indexes as the job has ranks on one host.
void AppendSpareSlots(const std::vector<Spare>& spares, int per_host,
                      std::vector<v1::DeviceSlot>* slots) {
  for (const Spare& s : spares) {
    std::vector<int> devices = s.devices;
    if (devices.empty()) {
      for (int d = 0; d < per_host; ++d) devices.push_back(d);
    }
    for (int d : devices) {
      v1::DeviceSlot slot;
      slot.set_host(s.host);
      slot.set_device(d);
      slots->push_back(std::move(slot));
    }
  }
}

// Among the policy's allowed configs, the one with the most ranks that fit
// `devices` within min_devices and max_devices (the first listed on a tie).
std::optional<v1::ParallelConfig> PickAllowed(const v1::ElasticPolicy& p, int64_t devices) {
  std::optional<v1::ParallelConfig> best;
  for (const v1::ParallelConfig& c : p.allowed()) {
    const int64_t world = planner::WorldSize(c);
    if (world > devices || world < std::max(1, p.min_devices())) continue;
    if (p.max_devices() > 0 && world > p.max_devices()) continue;
    if (!best.has_value() || world > planner::WorldSize(*best)) best = c;
  }
  return best;
}

// The devices a policy may use of `at_hand`: at most max_devices.
int GpusWithin(const v1::ElasticPolicy& p, size_t at_hand) {
  const int64_t n = static_cast<int64_t>(at_hand);
  return static_cast<int>(p.max_devices() > 0 ? std::min<int64_t>(n, p.max_devices()) : n);
}

// The hosts of `slots`, in order.
std::vector<std::string> HostsOf(const std::vector<v1::DeviceSlot>& slots) {
  std::vector<std::string> hosts;
  for (const v1::DeviceSlot& s : slots) {
    if (std::find(hosts.begin(), hosts.end(), s.host()) == hosts.end()) hosts.push_back(s.host());
  }
  return hosts;
}

// `config` on the first of `slots`, in order.
v1::Layout Placed(const v1::ParallelConfig& config, const std::vector<v1::DeviceSlot>& slots) {
  v1::Layout l;
  *l.mutable_config() = config;
  const int64_t world = planner::WorldSize(config);
  for (int64_t r = 0; r < world; ++r) *l.mutable_placement()->add_ranks() = slots[r];
  return l;
}

// The hosts `target` adds to `current`, in order.
std::vector<std::string> NewHosts(const v1::Layout& current, const v1::Layout& target) {
  std::set<std::string> had;
  for (const v1::DeviceSlot& s : planner::ExpandPlacement(current.placement()))
    had.insert(s.host());
  std::vector<std::string> added;
  for (const v1::DeviceSlot& s : planner::ExpandPlacement(target.placement())) {
    if (had.insert(s.host()).second) added.push_back(s.host());
  }
  return added;
}

}  // namespace

std::string PolicyEngine::Heal(const v1::Job& job) {
  const v1::ElasticPolicy& policy = job.policy();
  absl::StatusOr<std::vector<Spare>> spares = FreeSpares(*store_, job);
  if (!spares.ok()) {
    return absl::StrCat("heal: the spares could not be read: ", spares.status().message());
  }
  const std::string lost_text = absl::StrJoin(job.lost_hosts(), ", ");
  const int min = std::max(1, policy.min_devices());
  // The devices at hand: the survivors', then the free spares'.
  std::vector<v1::DeviceSlot> slots;
  for (const v1::DeviceSlot& s : planner::ExpandPlacement(job.layout().placement())) {
    if (std::find(job.lost_hosts().begin(), job.lost_hosts().end(), s.host()) ==
        job.lost_hosts().end()) {
      slots.push_back(s);
    }
  }
  AppendSpareSlots(*spares, RanksPerHost(job.layout()), &slots);
  v1::RecoverFromFailureRequest request;
  request.set_job_id(job.id());
  request.set_expected_generation(job.generation());
  for (const std::string& h : job.lost_hosts()) request.add_lost_hosts(h);
  request.set_accept_degraded(policy.accept_degraded());
  if (policy.has_advise()) {
    // The advisor's best layout for those devices (RecoverFromFailure with
    // choose: every move priced as a recovery from the survivors).
    const int gpus = GpusWithin(policy, slots.size());
    const std::vector<std::string> hosts = HostsOf(slots);
    if (gpus < min) {
      return absl::StrCat("waiting: ", lost_text, " lost; the survivors and free spares hold ",
                          slots.size(), " devices, below min_devices ", min);
    }
    *request.mutable_choose() = AdviceRequest(policy.advise(), job.id(), gpus, hosts);
    const std::string reason = absl::StrCat("policy heal: ", lost_text,
                                            " lost; recovering onto the advisor's best layout "
                                            "for ",
                                            gpus, " devices on ", absl::StrJoin(hosts, ", "));
    return Act(job, "RecoverFromFailure", OperationKey("heal", job), reason,
               [&](const std::string& key) {
                 request.set_idempotency_key(key);
                 return api_->RecoverFromFailure(request);
               });
  }
  v1::Layout target;
  std::string how;
  if (policy.allowed_size() > 0) {
    // The allowed layout with the most ranks on those devices.
    std::optional<v1::ParallelConfig> config = PickAllowed(policy, slots.size());
    if (!config.has_value()) {
      return absl::StrCat("waiting: ", lost_text, " lost; the survivors and free spares hold ",
                          slots.size(), " devices and no allowed layout fits them (min_devices ",
                          min, ")");
    }
    target = Placed(*config, slots);
    const std::vector<std::string> added = NewHosts(job.layout(), target);
    how = added.empty()
              ? "onto the survivors as an allowed layout"
              : absl::StrCat("onto the survivors and spare", added.size() > 1 ? "s " : " ",
                             absl::StrJoin(added, ", "), " as an allowed layout");
  } else {
    // Each lost host's ranks onto a free spare while there is one, the
    // rest onto the survivors.
    target = job.layout();
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
      onto.push_back(absl::StrCat(absl::StrJoin(left, ", "), " onto the survivors"));
    }
    how = absl::StrJoin(onto, "; ");
  }
  const int64_t world = planner::WorldSize(target.config());
  if (world < min) {
    return absl::StrCat("waiting: ", lost_text, " lost; the survivors and free spares hold ", world,
                        " devices (", LayoutText(target), "), below min_devices ", min);
  }
  *request.mutable_target() = target;
  const std::string reason = absl::StrCat("policy heal: ", lost_text, " lost; recovering ", how,
                                          " (", LayoutText(target), ")");
  return Act(job, "RecoverFromFailure", OperationKey("heal", job), reason,
             [&](const std::string& key) {
               request.set_idempotency_key(key);
               return api_->RecoverFromFailure(request);
             });
}

std::string PolicyEngine::Grow(const v1::Job& job) {
  const v1::ElasticPolicy& policy = job.policy();
  absl::StatusOr<std::vector<Spare>> spares = FreeSpares(*store_, job);
  if (!spares.ok()) {
    return absl::StrCat("grow: the spares could not be read: ", spares.status().message());
  }
  if (spares->empty()) return "";
  const v1::ParallelConfig& config = job.layout().config();
  const int64_t world = planner::WorldSize(config);
  std::vector<v1::DeviceSlot> slots = planner::ExpandPlacement(job.layout().placement());
  AppendSpareSlots(*spares, RanksPerHost(job.layout()), &slots);
  v1::Layout target;
  if (policy.has_advise()) {
    // The advisor's best layout for the job's and the free spares' devices,
    // if it has more ranks than the job.
    const int gpus = GpusWithin(policy, slots.size());
    if (gpus <= world) return "";
    const std::vector<std::string> hosts = HostsOf(slots);
    const std::string asked =
        absl::StrCat(OperationKey("grow", job), ":", absl::StrJoin(hosts, ","), ":", gpus);
    if (auto it = declined_.find(job.id()); it != declined_.end() && it->second.first == asked) {
      return it->second.second;
    }
    absl::StatusOr<v1::AdviseResponse> advice =
        api_->Advise(AdviceRequest(policy.advise(), job.id(), gpus, hosts));
    std::string declined;
    if (!advice.ok()) {
      declined = absl::StrCat("grow: the advisor cannot advise on ", gpus,
                              " devices: ", advice.status().message());
    } else if (advice->best() < 0) {
      declined = absl::StrCat("grow: no layout on ", gpus,
                              " devices completes a step within the advice's horizon");
    } else {
      target = advice->candidates(advice->best()).layout();
      if (planner::WorldSize(target.config()) <= world) {
        declined = absl::StrCat("grow: the advisor's best layout for ", gpus, " devices (",
                                LayoutText(target), ") has no more than the job's ", world,
                                " ranks: not grown");
      }
    }
    if (!declined.empty()) {
      declined_[job.id()] = {asked, declined};
      return declined;
    }
  } else if (policy.allowed_size() > 0) {
    std::optional<v1::ParallelConfig> chosen = PickAllowed(policy, slots.size());
    if (!chosen.has_value() || planner::WorldSize(*chosen) <= world) return "";
    target = Placed(*chosen, slots);
  } else {
    // dp grows, the same tp, pp and cp: whole replicas onto the new slots.
    const int64_t group = world / std::max(1, config.dp());
    int64_t dp = static_cast<int64_t>(slots.size()) / group;
    if (policy.max_devices() > 0) dp = std::min<int64_t>(dp, policy.max_devices() / group);
    if (dp <= config.dp()) return "";  // no room for another replica
    v1::ParallelConfig grown = config;
    grown.set_dp(static_cast<int32_t>(dp));
    grown.set_dp_shard(advisor::KeptDpShard(&job.layout(), static_cast<int>(dp)));
    target = Placed(grown, slots);
  }
  const std::vector<std::string> used = NewHosts(job.layout(), target);
  v1::ResizeRequest request;
  request.set_job_id(job.id());
  request.set_expected_generation(job.generation());
  *request.mutable_config() = target.config();
  *request.mutable_placement() = target.placement();
  request.set_at_step_boundary(policy.grow_at() == v1::ElasticPolicy::GROW_AT_STEP_BOUNDARY);
  request.set_stop_free(policy.grow_at() == v1::ElasticPolicy::GROW_STOP_FREE);
  const std::string reason = absl::StrCat(
      "policy grow: onto free spare", used.size() > 1 ? "s " : " ", absl::StrJoin(used, ", "), "; ",
      world, " -> ", planner::WorldSize(target.config()), " devices, dp ", config.dp(), " -> ",
      target.config().dp(), " (", policy.has_advise() ? "the advisor's best: " : "",
      LayoutText(target), ") ",
      policy.grow_at() == v1::ElasticPolicy::GROW_AT_STEP_BOUNDARY ? "at the next step boundary"
      : policy.grow_at() == v1::ElasticPolicy::GROW_STOP_FREE      ? "stop-free"
                                                                   : "now");
  return Act(job, "Resize", OperationKey("grow", job), reason, [&](const std::string& key) {
    request.set_idempotency_key(key);
    return api_->Resize(request);
  });
}

}  // namespace reshard::coordinator
