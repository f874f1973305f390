#include "services/coordinator/logic/driver_hosts.h"

#include <algorithm>
#include <utility>
#include <vector>

namespace reshard::coordinator {

absl::Status DriverHosts::Refresh(int64_t now_ms, bool force) {
  if (!force && read_ && now_ms - read_at_ms_ < refresh_ms_) return absl::OkStatus();
  absl::StatusOr<std::map<std::string, v1::HostState>> states = store_->HostStates();
  if (!states.ok()) return states.status();
  states_ = *std::move(states);
  read_at_ms_ = now_ms;
  read_ = true;
  ++full_reads_;
  return absl::OkStatus();
}

absl::StatusOr<std::optional<v1::HostState>> DriverHosts::StateOf(const std::string& host_id) {
  auto it = states_.find(host_id);
  if (it != states_.end() && it->second == v1::HOST_STATE_ALIVE) return it->second;
  absl::StatusOr<std::vector<v1::Host>> read = store_->GetHosts({host_id});
  if (!read.ok()) return read.status();
  ++host_reads_;
  if (read->empty()) return std::nullopt;
  states_[host_id] = read->front().state();
  return read->front().state();
}

int64_t DriverHosts::alive() const {
  return std::count_if(states_.begin(), states_.end(),
                       [](const auto& h) { return h.second == v1::HOST_STATE_ALIVE; });
}

}  // namespace reshard::coordinator
