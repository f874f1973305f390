// What a recovery keeps of the job (docs/coordinator.md, "Recovery keeps
// the job's redundancy"): a rank that crashed on a healthy host restarts in
// place, and a recovery that would give up the job's redundancy (its HSDP
// replicas, or surviving the loss of any one host) is named before it runs.
// Pure (the planner only); thread-safe.
#pragma once

#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "google/protobuf/repeated_ptr_field.h"
#include "planner/planner.h"
#include "reshard/v1/ptc.pb.h"

namespace reshard::coordinator {

/// HSDP replicas of `c`: dp / dp_shard (1 without dp_shard).
int ReplicasOf(const v1::ParallelConfig& c);

/// The ranks of `lost` that restart in place: a lost rank of `current` whose
/// (host, device) `target` places a rank on, on a host that `lost` does not
/// name. Its process crashed; its host's agent still holds its buffer of the
/// current generation, which stays a source.
std::vector<int> InPlaceRanks(const v1::Layout& current, const v1::Layout& target,
                              const planner::LostSet& lost);

/// The lost set an operation plans with: the `hosts` and `ranks` its
/// request named, and the job's hosts already known LOST (`job_lost_hosts`,
/// Job.lost_hosts: never sources, whatever the request said; planning from
/// them would only abort later).
planner::LostSet JobLostSet(const google::protobuf::RepeatedPtrField<std::string>& job_lost_hosts,
                            std::vector<std::string> hosts, std::vector<int> ranks);

/// `lost` as the planner takes it: without the ranks that restart in place.
planner::LostSet PlannerLostSet(const v1::Layout& current, const v1::Layout& target,
                                const planner::LostSet& lost);

/// The first host of `layout` whose loss alone loses state that no other
/// host holds (the planner's answer for that loss), or nullopt when the
/// layout survives the loss of any one host. Plans one recovery per host.
[[nodiscard]] absl::StatusOr<std::optional<std::string>> HostWhoseLossLosesState(
    const v1::Ptc& ptc, const v1::Layout& layout);

/// What `target` gives up of `current`'s redundancy, one phrase per loss
/// (empty: nothing): HSDP replicas going to none, or surviving the loss of
/// any one host.
[[nodiscard]] absl::StatusOr<std::vector<std::string>> RedundancyLost(const v1::Ptc& ptc,
                                                                      const v1::Layout& current,
                                                                      const v1::Layout& target);

/// A layout the recovery could take instead that keeps `current`'s
/// redundancy, or nullopt: `current` itself when only ranks on hosts in
/// `alive_hosts` are lost (in place), else the survivors with the current
/// number of HSDP replicas. Checked with RedundancyLost and the planner.
[[nodiscard]] std::optional<v1::Layout> KeepingLayout(const v1::Ptc& ptc, const v1::Layout& current,
                                                      const planner::LostSet& lost,
                                                      const std::set<std::string>& alive_hosts);

/// A layout in a line: "tp 2 pp 1 dp 4 dp_shard 2 on h0:0 h0:1 h1:0 ...".
std::string LayoutText(const v1::Layout& layout);

}  // namespace reshard::coordinator
