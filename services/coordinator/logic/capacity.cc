#include "services/coordinator/logic/capacity.h"

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "planner/validate.h"

namespace reshard::coordinator {
namespace {

// Saturates rather than wraps (each part is at most 2^63 - 1).
int64_t SaturatingAdd(int64_t a, int64_t b) {
  int64_t sum = 0;
  return __builtin_add_overflow(a, b, &sum) ? INT64_MAX : sum;
}

// What a registered host can hold of a job's shards: host memory plus the
// memory of its devices other than "cpu" (the agent places a rank buffer in
// either). A device with memory_bytes 0 holds no rank buffer (an agent
// without a device API lists its CUDA devices so, for the advisor) and adds
// nothing. `known` is false when the host reports no limit.
struct HostCapacity {
  int64_t host_bytes = 0;
  int devices = 0;  // non-cpu
  int64_t device_bytes = 0;
  bool known = true;

  int64_t total() const { return SaturatingAdd(host_bytes, device_bytes); }
};

HostCapacity CapacityOf(const v1::Host& h) {
  HostCapacity c;
  c.host_bytes = h.memory_limit_bytes();
  c.known = h.memory_limit_bytes() > 0;
  for (const v1::Device& d : h.devices()) {
    if (d.kind() == "cpu" || d.memory_bytes() <= 0) continue;
    ++c.devices;
    c.device_bytes = SaturatingAdd(c.device_bytes, d.memory_bytes());
  }
  return c;
}

// "its memory_limit_bytes is X" and, with devices, " and its N devices hold Y".
std::string Describe(const HostCapacity& c) {
  std::string out = absl::StrCat("its memory_limit_bytes is ", c.host_bytes);
  if (c.devices > 0) {
    absl::StrAppend(&out, " and its ", c.devices,
                    c.devices == 1 ? " device holds " : " devices hold ", c.device_bytes);
  }
  return out;
}

}  // namespace

struct HostCapacities::Snapshot {
  HostStore::RegistrationsMark mark;
  std::map<std::string, HostCapacity> by_host;
  HostCapacity cluster;  // known: at least one host, and every one reports a limit
  size_t hosts = 0;
};

int64_t HostCapacities::loads() const {
  std::lock_guard<std::mutex> l(mu_);
  return loads_;
}

absl::StatusOr<std::shared_ptr<const HostCapacities::Snapshot>> HostCapacities::Current() {
  // The mark is read before the hosts: a registration between the two makes
  // the snapshot newer than its mark, and the next call reads again.
  absl::StatusOr<HostStore::RegistrationsMark> mark = store_->HostRegistrations();
  if (!mark.ok()) return mark.status();
  {
    std::lock_guard<std::mutex> l(mu_);
    if (snapshot_ != nullptr && snapshot_->mark == *mark) return snapshot_;
  }
  absl::StatusOr<std::vector<v1::Host>> hosts = store_->ListHosts();
  if (!hosts.ok()) return hosts.status();
  auto snapshot = std::make_shared<Snapshot>();
  snapshot->mark = *mark;
  snapshot->hosts = hosts->size();
  HostCapacity& cluster = snapshot->cluster;
  cluster.known = !hosts->empty();
  for (const v1::Host& h : *hosts) {
    const HostCapacity c = CapacityOf(h);
    snapshot->by_host[h.host_id()] = c;
    cluster.known = cluster.known && c.known;
    cluster.host_bytes = SaturatingAdd(cluster.host_bytes, c.host_bytes);
    cluster.devices += c.devices;
    cluster.device_bytes = SaturatingAdd(cluster.device_bytes, c.device_bytes);
  }
  std::lock_guard<std::mutex> l(mu_);
  ++loads_;
  snapshot_ = snapshot;
  return std::shared_ptr<const Snapshot>(std::move(snapshot));
}

absl::Status HostCapacities::CheckFits(const v1::Ptc& ptc, const v1::Layout& layout,
                                       absl::string_view what) {
  absl::StatusOr<std::vector<planner::HostBytes>> needed = planner::BytesPerHost(ptc, layout);
  if (!needed.ok()) return needed.status();
  absl::StatusOr<std::shared_ptr<const Snapshot>> current = Current();
  if (!current.ok()) return current.status();
  const Snapshot& snap = **current;
  const HostCapacity& cluster = snap.cluster;
  int64_t total = 0;
  for (const planner::HostBytes& hb : *needed) {
    if (__builtin_add_overflow(total, hb.bytes, &total)) {
      return absl::InvalidArgumentError(
          absl::StrCat(what, ": the job's bytes over its hosts overflow 64 bits"));
    }
    auto it = snap.by_host.find(hb.host);
    if (it == snap.by_host.end() || !it->second.known) continue;
    if (hb.bytes > it->second.total()) {
      return absl::ResourceExhaustedError(absl::StrCat(what, ": host \"", hb.host, "\" would hold ",
                                                       hb.bytes, " bytes of this job's shards; ",
                                                       Describe(it->second)));
    }
  }
  if (cluster.known && total > cluster.total()) {
    std::string in_all = absl::StrCat(cluster.host_bytes, " bytes of memory_limit_bytes");
    if (cluster.devices > 0) {
      absl::StrAppend(&in_all, " and ", cluster.device_bytes, " bytes on their ", cluster.devices,
                      cluster.devices == 1 ? " device" : " devices");
    }
    return absl::ResourceExhaustedError(absl::StrCat(what, ": the job needs ", total,
                                                     " bytes over its hosts; the ", snap.hosts,
                                                     " registered hosts have ", in_all, " in all"));
  }
  return absl::OkStatus();
}

}  // namespace reshard::coordinator
