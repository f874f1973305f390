// Whether a job's layout fits the memory of the cluster's hosts, checked
// before an operation or a job is created (nothing is allocated yet). The
// agents remain the final authority (they also count other jobs' buffers
// and per-item alignment); this refuses what can never fit. Thread-safe.
#pragma once

#include <memory>
#include <mutex>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "reshard/v1/ptc.pb.h"
#include "services/coordinator/store/host_store.h"

namespace reshard::coordinator {

/// CheckFits: ResourceExhausted when a registered host of `layout` would hold more shard
/// bytes of this job than its capacity (naming host, bytes needed, its
/// memory_limit_bytes and, when it has devices, what they hold), or when the
/// job's bytes over all its hosts exceed the sum of every registered host's
/// capacity (only when at least one is registered and every one reports a
/// limit). A host's capacity is its memory_limit_bytes plus the memory_bytes
/// of its devices other than "cpu": its agent holds a rank buffer in host
/// memory or in a device's (docs/agent.md, "GPU / memory kinds"); a device
/// of memory_bytes 0 holds none. Hosts not registered, or registered without
/// a limit (0), are not judged. `what` names the
/// layout in messages ("layout", "target"). `ptc` and `layout` must be valid.
///
/// The hosts' capacities are kept in memory and read again only when a host
/// registered since (HostStore::HostRegistrations moved, on this replica or
/// another): RegisterJob and every Resize judge the whole cluster with one
/// one-row query, not by reading every host. Thread-safe.
class HostCapacities {
 public:
  explicit HostCapacities(std::shared_ptr<HostStore> store) : store_(std::move(store)) {}

  [[nodiscard]] absl::Status CheckFits(const v1::Ptc& ptc, const v1::Layout& layout,
                                       absl::string_view what);

  /// How many times every host was read (for tests).
  int64_t loads() const;

 private:
  struct Snapshot;
  [[nodiscard]] absl::StatusOr<std::shared_ptr<const Snapshot>> Current();

  const std::shared_ptr<HostStore> store_;
  mutable std::mutex mu_;
  std::shared_ptr<const Snapshot> snapshot_;  // guarded by mu_
  int64_t loads_ = 0;                         // guarded by mu_
};

}  // namespace reshard::coordinator
