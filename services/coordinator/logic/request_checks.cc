#include "services/coordinator/logic/request_checks.h"

#include <algorithm>
#include <set>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/limits.h"
#include "planner/layout.h"
#include "planner/validate.h"

namespace reshard::coordinator {

absl::Status RequireNonEmpty(absl::string_view field, const std::string& value) {
  if (value.empty()) return absl::InvalidArgumentError(absl::StrCat(field, " is empty"));
  return CheckLength(field, value, kMaxIdBytes);
}

absl::Status CheckIdempotencyKey(const std::string& key) {
  return CheckLength("idempotency_key", key, kMaxIdBytes);
}

absl::Status CheckHostFields(const v1::Host& host) {
  if (absl::Status s = RequireNonEmpty("host.host_id", host.host_id()); !s.ok()) return s;
  if (absl::Status s = CheckLength("host.address", host.address(), kMaxAddressBytes); !s.ok()) {
    return s;
  }
  if (static_cast<int64_t>(host.ucx_address().size()) > kMaxUcxAddressBytes) {
    return absl::InvalidArgumentError(absl::StrCat("host.ucx_address is ",
                                                   host.ucx_address().size(),
                                                   " bytes; the limit is ", kMaxUcxAddressBytes));
  }
  if (host.devices_size() > kMaxDevicesPerHost) {
    return absl::InvalidArgumentError(absl::StrCat("host.devices has ", host.devices_size(),
                                                   " entries; the limit is ", kMaxDevicesPerHost));
  }
  if (host.transports_size() > kMaxTransports) {
    return absl::InvalidArgumentError(absl::StrCat("host.transports has ", host.transports_size(),
                                                   " entries; the limit is ", kMaxTransports));
  }
  for (int i = 0; i < host.transports_size(); ++i) {
    if (absl::Status s = CheckLength(absl::StrCat("host.transports[", i, "]"), host.transports(i),
                                     kMaxTransportNameBytes);
        !s.ok()) {
      return s;
    }
  }
  if (host.memory_limit_bytes() < 0) {
    return absl::InvalidArgumentError(absl::StrCat("host.memory_limit_bytes is ",
                                                   host.memory_limit_bytes(), "; it must be >= 0"));
  }
  return absl::OkStatus();
}

absl::Status CheckExpectedGeneration(int64_t expected_generation) {
  if (expected_generation >= 1) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      "expected_generation is ", expected_generation,
      "; pass the job's generation the request was computed from (GetJob), which is >= 1"));
}

absl::Status CheckMigrateWorld(const v1::ParallelConfig& config, const v1::Placement& placement) {
  const int64_t world = planner::WorldSize(config);
  const int64_t slots = placement.ranks_size() > 0
                            ? placement.ranks_size()
                            : int64_t{placement.hosts_size()} * placement.devices_per_host();
  if (slots == world) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat("placement has ", slots, " slots but the job's world size is ", world, " (tp ",
                   config.tp(), " x pp ", config.pp(), " x dp ", config.dp(),
                   "); Migrate keeps the parallel config, use Resize to change it"));
}

absl::Status CheckLostFields(const google::protobuf::RepeatedPtrField<std::string>& lost_hosts,
                             const google::protobuf::RepeatedField<int32_t>& lost_ranks) {
  if (lost_hosts.empty() && lost_ranks.empty()) {
    return absl::InvalidArgumentError(
        "lost_hosts and lost_ranks are both empty; name at least one lost host or rank");
  }
  if (lost_hosts.size() > kMaxLostEntries || lost_ranks.size() > kMaxLostEntries) {
    return absl::InvalidArgumentError(absl::StrCat("lost_hosts has ", lost_hosts.size(),
                                                   " and lost_ranks ", lost_ranks.size(),
                                                   " entries; the limit is ", kMaxLostEntries));
  }
  for (int i = 0; i < lost_hosts.size(); ++i) {
    if (absl::Status s = RequireNonEmpty(absl::StrCat("lost_hosts[", i, "]"), lost_hosts[i]);
        !s.ok()) {
      return s;
    }
  }
  for (int i = 0; i < lost_ranks.size(); ++i) {
    if (lost_ranks[i] < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("lost_ranks[", i, "] is ", lost_ranks[i], "; ranks are >= 0"));
    }
  }
  return absl::OkStatus();
}

absl::Status CheckLostAgainst(const v1::Layout& current, const v1::Layout& target,
                              const google::protobuf::RepeatedPtrField<std::string>& lost_hosts,
                              const google::protobuf::RepeatedField<int32_t>& lost_ranks,
                              const std::set<std::string>& in_place_hosts) {
  const std::vector<v1::DeviceSlot> old_slots = planner::ExpandPlacement(current.placement());
  const std::vector<v1::DeviceSlot> new_slots = planner::ExpandPlacement(target.placement());
  std::set<std::string> old_hosts;
  for (const v1::DeviceSlot& s : old_slots) old_hosts.insert(s.host());
  for (const std::string& host : lost_hosts) {
    if (old_hosts.count(host) == 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("lost_hosts: host \"", host, "\" holds no rank of the current layout"));
    }
  }
  std::set<std::pair<std::string, int>> lost_devices;
  for (int32_t rank : lost_ranks) {
    if (rank >= static_cast<int64_t>(old_slots.size())) {
      return absl::InvalidArgumentError(absl::StrCat("lost_ranks: rank ", rank,
                                                     " is out of range: the current layout has ",
                                                     old_slots.size(), " ranks"));
    }
    if (in_place_hosts.count(old_slots[rank].host()) > 0) continue;  // restarts in place
    lost_devices.emplace(old_slots[rank].host(), old_slots[rank].device());
  }
  const std::set<std::string> lost_host_set(lost_hosts.begin(), lost_hosts.end());
  for (size_t r = 0; r < new_slots.size(); ++r) {
    const v1::DeviceSlot& s = new_slots[r];
    if (lost_host_set.count(s.host()) > 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("target.placement: rank ", r, " is on lost host \"", s.host(), "\""));
    }
    if (lost_devices.count({s.host(), s.device()}) > 0) {
      return absl::InvalidArgumentError(absl::StrCat("target.placement: rank ", r, " is on host \"",
                                                     s.host(), "\" device ", s.device(),
                                                     ", the device of a lost rank (a rank restarts "
                                                     "in place only on an ALIVE host that no "
                                                     "lost_hosts name)"));
    }
  }
  return absl::OkStatus();
}

}  // namespace reshard::coordinator
