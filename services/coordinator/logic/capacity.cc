#include "services/coordinator/logic/capacity.h"

#include <map>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "planner/validate.h"

namespace reshard::coordinator {

absl::Status CheckFitsHosts(Store& store, const v1::Ptc& ptc, const v1::Layout& layout,
                            absl::string_view what) {
  absl::StatusOr<std::vector<planner::HostBytes>> needed = planner::BytesPerHost(ptc, layout);
  if (!needed.ok()) return needed.status();
  absl::StatusOr<std::vector<v1::Host>> hosts = store.ListHosts();
  if (!hosts.ok()) return hosts.status();

  std::map<std::string, int64_t> limits;
  int64_t cluster = 0;
  bool cluster_known = !hosts->empty();
  for (const v1::Host& h : *hosts) {
    limits[h.host_id()] = h.memory_limit_bytes();
    if (h.memory_limit_bytes() <= 0) cluster_known = false;
    // Limits are at most 2^63 each; saturate rather than wrap.
    if (__builtin_add_overflow(cluster, h.memory_limit_bytes(), &cluster)) cluster = INT64_MAX;
  }
  int64_t total = 0;
  for (const planner::HostBytes& hb : *needed) {
    if (__builtin_add_overflow(total, hb.bytes, &total)) {
      return absl::InvalidArgumentError(
          absl::StrCat(what, ": the job's bytes over its hosts overflow 64 bits"));
    }
    auto it = limits.find(hb.host);
    if (it == limits.end() || it->second <= 0) continue;
    if (hb.bytes > it->second) {
      return absl::ResourceExhaustedError(
          absl::StrCat(what, ": host \"", hb.host, "\" would hold ", hb.bytes,
                       " bytes of this job's shards; its memory_limit_bytes is ", it->second));
    }
  }
  if (cluster_known && total > cluster) {
    return absl::ResourceExhaustedError(
        absl::StrCat(what, ": the job needs ", total, " bytes over its hosts; the ", hosts->size(),
                     " registered hosts have ", cluster, " bytes of memory_limit_bytes in all"));
  }
  return absl::OkStatus();
}

}  // namespace reshard::coordinator
