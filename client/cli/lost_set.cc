#include "client/cli/lost_set.h"

#include <algorithm>

#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "planner/layout.h"

namespace reshard::cli {
namespace {

// At most this many host names are quoted in an error message.
constexpr size_t kMaxHostsInMessage = 8;

std::string HostList(const std::vector<std::string>& hosts) {
  if (hosts.size() <= kMaxHostsInMessage) return absl::StrJoin(hosts, ", ");
  std::vector<std::string> head(hosts.begin(), hosts.begin() + kMaxHostsInMessage);
  return absl::StrCat(absl::StrJoin(head, ", "), ", ... (", hosts.size(), " hosts)");
}

}  // namespace

std::vector<std::string> PlacementHosts(const v1::Placement& placement) {
  std::vector<std::string> hosts;
  absl::flat_hash_set<std::string> seen;
  auto add = [&](const std::string& h) {
    if (seen.insert(h).second) hosts.push_back(h);
  };
  for (const v1::DeviceSlot& slot : placement.ranks()) add(slot.host());
  for (const std::string& h : placement.hosts()) add(h);
  return hosts;
}

absl::StatusOr<planner::LostSet> ParseLostSet(absl::string_view text, const v1::Layout& layout) {
  planner::LostSet lost;
  if (absl::StripAsciiWhitespace(text).empty()) return lost;
  const std::vector<std::string> hosts = PlacementHosts(layout.placement());
  const absl::flat_hash_set<std::string> host_set(hosts.begin(), hosts.end());
  const int64_t world = planner::WorldSize(layout.config());
  absl::flat_hash_set<std::string> seen_hosts;
  absl::flat_hash_set<int> seen_ranks;
  for (absl::string_view raw : absl::StrSplit(text, ',')) {
    const absl::string_view token = absl::StripAsciiWhitespace(raw);
    if (token.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("--lost: empty entry in \"", text, "\" (expected host,rank,...)"));
    }
    if (host_set.contains(token)) {
      if (seen_hosts.insert(std::string(token)).second) lost.hosts.emplace_back(token);
      continue;
    }
    absl::string_view number = token;
    const bool forced_rank = absl::ConsumePrefix(&number, "rank:");
    int rank = 0;
    if (!absl::SimpleAtoi(number, &rank)) {
      if (forced_rank) {
        return absl::InvalidArgumentError(
            absl::StrCat("--lost: \"", token, "\": \"", number, "\" is not a rank number"));
      }
      return absl::InvalidArgumentError(
          absl::StrCat("--lost: \"", token, "\" is neither a host of the job's placement (",
                       HostList(hosts), ") nor a rank number"));
    }
    if (rank < 0 || rank >= world) {
      return absl::InvalidArgumentError(absl::StrCat("--lost: rank ", rank, " (\"", token,
                                                     "\") is out of range: the job has ", world,
                                                     " ranks, 0..", world - 1));
    }
    if (seen_ranks.insert(rank).second) lost.ranks.push_back(rank);
  }
  std::sort(lost.ranks.begin(), lost.ranks.end());
  return lost;
}

}  // namespace reshard::cli
