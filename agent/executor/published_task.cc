#include "agent/executor/published_task.h"

#include <chrono>
#include <thread>

#include "absl/strings/str_cat.h"

namespace reshard::agent {
namespace {

constexpr auto kPoll = std::chrono::milliseconds(20);

absl::Status CheckSizes(const RankBuffer& buf, const std::vector<int64_t>& want, int rank,
                        const v1::HostTask& task) {
  const auto& items = buf.items();
  bool same = items.size() == want.size();
  for (size_t i = 0; same && i < items.size(); ++i) same = items[i].bytes == want[i];
  if (same) return absl::OkStatus();
  return absl::FailedPreconditionError(
      absl::StrCat("job \"", task.job_id(), "\" generation ", task.to_generation(), " rank ", rank,
                   ": the published buffer's items differ from the layout's (", items.size(),
                   " items, ", want.size(), " expected)"));
}

}  // namespace

absl::StatusOr<std::vector<v1::ShardChecksum>> AwaitPublished(
    ShardStore* store, const v1::HostTask& task, const HostSteps& hs,
    const std::function<void(int64_t done, int64_t total)>& progress,
    const std::function<bool()>& cancelled,
    const std::function<void(const std::string& what)>& waiting) {
  const std::vector<int>& ranks = hs.new_ranks;
  std::vector<int64_t> rank_bytes(ranks.size(), 0);
  int64_t total = 0;
  for (size_t k = 0; k < ranks.size(); ++k) {
    for (int64_t b : hs.new_item_bytes[k]) rank_bytes[k] += b;
    total += rank_bytes[k];
  }
  auto drop_all = [&] {
    for (int r : ranks) store->Drop(RankBufferKey{task.job_id(), task.to_generation(), r});
  };
  std::vector<RankBufferPtr> sealed(ranks.size());
  std::string last_waiting;
  for (;;) {
    int64_t done = 0;
    int open = -1;
    for (size_t k = 0; k < ranks.size(); ++k) {
      if (sealed[k] == nullptr) {
        absl::StatusOr<RankBufferPtr> b =
            store->Get(RankBufferKey{task.job_id(), task.to_generation(), ranks[k]});
        if (b.ok() && (*b)->sealed()) {
          if (absl::Status s = CheckSizes(**b, hs.new_item_bytes[k], ranks[k], task); !s.ok()) {
            drop_all();
            return s;
          }
          sealed[k] = *std::move(b);
        }
      }
      if (sealed[k] != nullptr) {
        done += rank_bytes[k];
      } else if (open < 0) {
        open = ranks[k];
      }
    }
    if (progress) progress(done, total);
    if (open < 0) break;
    if (cancelled && cancelled()) {
      drop_all();
      return absl::CancelledError(absl::StrCat("checkpoint of job \"", task.job_id(),
                                               "\" cancelled while waiting for rank ", open));
    }
    std::string what = absl::StrCat("workers to publish and seal rank ", open, " of generation ",
                                    task.to_generation());
    if (waiting && what != last_waiting) waiting(last_waiting = std::move(what));
    std::this_thread::sleep_for(kPoll);
  }
  std::vector<v1::ShardChecksum> out;
  for (size_t k = 0; k < ranks.size(); ++k) {
    const auto& items = sealed[k]->items();
    const std::vector<uint64_t> sums = sealed[k]->checksums();
    for (size_t item = 0; item < items.size() && item < sums.size(); ++item) {
      if (items[item].bytes == 0) continue;
      v1::ShardChecksum c;
      c.set_item(static_cast<int>(item));
      c.set_rank(ranks[k]);
      c.set_checksum(sums[item]);
      c.set_bytes(items[item].bytes);
      out.push_back(std::move(c));
    }
  }
  return out;
}

}  // namespace reshard::agent
