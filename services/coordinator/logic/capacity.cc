#include "services/coordinator/logic/capacity.h"

#include <cstdint>
#include <map>
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

absl::Status CheckFitsHosts(Store& store, const v1::Ptc& ptc, const v1::Layout& layout,
                            absl::string_view what) {
  absl::StatusOr<std::vector<planner::HostBytes>> needed = planner::BytesPerHost(ptc, layout);
  if (!needed.ok()) return needed.status();
  absl::StatusOr<std::vector<v1::Host>> hosts = store.ListHosts();
  if (!hosts.ok()) return hosts.status();

  std::map<std::string, HostCapacity> capacity;
  HostCapacity cluster;
  cluster.known = !hosts->empty();
  for (const v1::Host& h : *hosts) {
    const HostCapacity c = CapacityOf(h);
    capacity[h.host_id()] = c;
    cluster.known = cluster.known && c.known;
    cluster.host_bytes = SaturatingAdd(cluster.host_bytes, c.host_bytes);
    cluster.devices += c.devices;
    cluster.device_bytes = SaturatingAdd(cluster.device_bytes, c.device_bytes);
  }
  int64_t total = 0;
  for (const planner::HostBytes& hb : *needed) {
    if (__builtin_add_overflow(total, hb.bytes, &total)) {
      return absl::InvalidArgumentError(
          absl::StrCat(what, ": the job's bytes over its hosts overflow 64 bits"));
    }
    auto it = capacity.find(hb.host);
    if (it == capacity.end() || !it->second.known) continue;
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
                                                     " bytes over its hosts; the ", hosts->size(),
                                                     " registered hosts have ", in_all, " in all"));
  }
  return absl::OkStatus();
}

}  // namespace reshard::coordinator
