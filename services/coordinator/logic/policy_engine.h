// Elastic policies (docs/scheduler.md, "Elastic policies"): what the leader
// does for a job by itself. Each pass looks at every job with a policy
// (ElasticPolicy) that has no active operation:
//  - heal: a host of its current generation is lost: RecoverFromFailure,
//    the lost host's ranks onto a free spare, else onto the survivors, never
//    below min_devices (else the job waits DEGRADED and says why);
//  - grow: free spares: Resize, dp grown onto them up to max_devices, at the
//    job's next step boundary, stop-free, or now (grow_at).
// The operations are made through SchedulerApi, so every check a
// scheduler's call meets applies, and each is audited (identity "policy")
// with its reason. Each action's idempotency key names the job's generation:
// a pass repeats nothing, and an action that failed is not retried for that
// generation (Job.policy_status says so). A scheduler's own call supersedes
// a policy's operation in flight (SchedulerApi cancels it).
#pragma once

#include <cstdint>
#include <map>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "reshard/v1/coordinator.pb.h"
#include "reshard/v1/ptc.pb.h"
#include "services/coordinator/clock.h"
#include "services/coordinator/logic/scheduler_api.h"
#include "services/coordinator/store/store.h"

namespace reshard::coordinator {

/// The idempotency keys of the policy's own operations start with this.
inline constexpr absl::string_view kPolicyKeyPrefix = "policy:";
inline bool IsPolicyKey(absl::string_view key) {
  return key.substr(0, kPolicyKeyPrefix.size()) == kPolicyKeyPrefix;
}

/// InvalidArgument naming the field and value: min_devices or max_devices
/// negative, max below min, a spare host empty, too long or named twice,
/// more spares than kMaxPolicySpares, an unknown grow_at.
[[nodiscard]] absl::Status CheckPolicy(const v1::ElasticPolicy& policy, absl::string_view field);

inline constexpr int kMaxPolicySpares = 4096;

class PolicyEngine {
 public:
  struct Options {
    int64_t period_ms = 1000;  // least time between two passes
  };
  /// `store`, `api` and `clock` outlive the engine.
  PolicyEngine(StorePtr store, SchedulerApi* api, const Clock* clock, Options options);

  /// One pass over the jobs with a policy when the period has passed since
  /// the last (always with `force`). The leader's: LeaderLoop calls it after
  /// each driver tick. The first error is returned; every job is looked at.
  absl::Status MaybePass(bool force = false);

 private:
  absl::Status Apply(const std::string& job_id);
  // The job is DEGRADED (lost hosts) and its policy heals: the status.
  std::string Heal(const v1::Job& job);
  // The job is ACTIVE and its policy grows: the status ("" when nothing to do).
  std::string Grow(const v1::Job& job);
  // The action's operation through `create`, audited as `method` with
  // `reason`; the status to show.
  template <typename Create>
  std::string Act(const v1::Job& job, const std::string& method, const std::string& key,
                  const std::string& reason, Create create);

  StorePtr store_;
  SchedulerApi* api_;
  const Clock* clock_;
  Options options_;
  int64_t last_pass_ms_ = 0;
  // By job: the key of the last action this engine took and its operation
  // ("" when refused), so that a pass does not ask again (a new leader asks
  // once more and gets the same operation back).
  struct Acted {
    std::string key;
    std::string operation_id;
  };
  std::map<std::string, Acted> acted_;
  // By job: what the advisor was last asked for a grow (the action's key,
  // the hosts and devices) and the status when it did not grow the job, so
  // that a pass asks it again only when one of those changes.
  std::map<std::string, std::pair<std::string, std::string>> declined_;
};

}  // namespace reshard::coordinator
