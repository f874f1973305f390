#include "services/coordinator/logic/spares.h"

#include <algorithm>
#include <set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "planner/layout.h"
#include "services/coordinator/logic/request_checks.h"

namespace reshard::coordinator {

absl::Status CheckSpareHosts(absl::string_view field,
                             const google::protobuf::RepeatedPtrField<std::string>& names,
                             const std::string& leaving) {
  std::set<std::string> seen;
  for (const std::string& h : names) {
    if (absl::Status s = RequireNonEmpty(absl::StrCat(field, "[]"), h); !s.ok()) return s;
    if (!leaving.empty() && h == leaving) {
      return absl::InvalidArgumentError(absl::StrCat(field, " names the leaving host \"", h, "\""));
    }
    if (!seen.insert(h).second) {
      return absl::InvalidArgumentError(absl::StrCat(field, " names \"", h, "\" twice"));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<Spare>> AliveSpares(
    HostStore& hosts, const google::protobuf::RepeatedPtrField<std::string>& names) {
  std::vector<Spare> spares;
  for (const std::string& name : names) {
    absl::StatusOr<v1::Host> host = hosts.GetHost(name);
    if (absl::IsNotFound(host.status())) continue;
    if (!host.ok()) return host.status();
    // A host with a notice is going: it takes no one's ranks.
    if (host->state() != v1::HOST_STATE_ALIVE || host->leaves_unix_ms() != 0) continue;
    Spare s{name, {}};
    for (const v1::Device& d : host->devices()) {
      if (d.kind() != "cpu") s.devices.push_back(d.index());
    }
    std::sort(s.devices.begin(), s.devices.end());
    spares.push_back(std::move(s));
  }
  return spares;
}

std::optional<v1::Layout> OntoSpare(const v1::Layout& layout, const std::string& leaving,
                                    const Spare& spare) {
  const std::vector<v1::DeviceSlot> slots = planner::ExpandPlacement(layout.placement());
  std::vector<int> on_leaving;  // device indexes there, in first-use order
  for (const v1::DeviceSlot& s : slots) {
    if (s.host() == spare.host) return std::nullopt;
    if (s.host() == leaving &&
        std::find(on_leaving.begin(), on_leaving.end(), s.device()) == on_leaving.end()) {
      on_leaving.push_back(s.device());
    }
  }
  const std::vector<int>& devices = spare.devices.empty() ? on_leaving : spare.devices;
  if (on_leaving.size() > devices.size()) return std::nullopt;
  v1::Layout target;
  *target.mutable_config() = layout.config();
  for (v1::DeviceSlot s : slots) {
    if (s.host() == leaving) {
      const size_t i =
          std::find(on_leaving.begin(), on_leaving.end(), s.device()) - on_leaving.begin();
      s.set_host(spare.host);
      s.set_device(devices[i]);
    }
    *target.mutable_placement()->add_ranks() = s;
  }
  return target;
}

}  // namespace reshard::coordinator
