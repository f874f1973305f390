#include "agent/executor/published_task.h"

#include <chrono>
#include <optional>
#include <thread>

#include "absl/strings/str_cat.h"

namespace reshard::agent {
namespace {

constexpr auto kPoll = std::chrono::milliseconds(20);

// What the checkpoint reports of a sealed rank, in host or device memory.
struct SealedRank {
  std::vector<ItemSlot> items;
  std::vector<uint64_t> checksums;
};

// The sealed buffer of `key` in either store, or nullopt while none is.
std::optional<SealedRank> FindSealed(ShardStore* store, DeviceBufferStore* devices,
                                     const RankBufferKey& key) {
  if (absl::StatusOr<RankBufferPtr> b = store->Get(key); b.ok() && (*b)->sealed()) {
    return SealedRank{(*b)->items(), (*b)->checksums()};
  }
  if (devices != nullptr) {
    if (absl::StatusOr<DeviceRankBufferPtr> d = devices->Get(key); d.ok() && (*d)->sealed()) {
      return SealedRank{(*d)->items(), (*d)->checksums()};
    }
  }
  return std::nullopt;
}

absl::Status CheckSizes(const SealedRank& buf, const std::vector<int64_t>& want, int rank,
                        const v1::HostTask& task) {
  const auto& items = buf.items;
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
    const std::function<void(const std::string& what)>& waiting, DeviceBufferStore* devices) {
  const std::vector<int>& ranks = hs.new_ranks;
  std::vector<int64_t> rank_bytes(ranks.size(), 0);
  int64_t total = 0;
  for (size_t k = 0; k < ranks.size(); ++k) {
    for (int64_t b : hs.new_item_bytes[k]) rank_bytes[k] += b;
    total += rank_bytes[k];
  }
  auto drop_all = [&] {
    for (int r : ranks) {
      const RankBufferKey key{task.job_id(), task.to_generation(), r};
      store->Drop(key);
      if (devices != nullptr) devices->Drop(key);
    }
  };
  std::vector<std::optional<SealedRank>> sealed(ranks.size());
  std::string last_waiting;
  for (;;) {
    int64_t done = 0;
    int open = -1;
    for (size_t k = 0; k < ranks.size(); ++k) {
      if (!sealed[k].has_value()) {
        const RankBufferKey key{task.job_id(), task.to_generation(), ranks[k]};
        sealed[k] = FindSealed(store, devices, key);
        if (sealed[k].has_value()) {
          if (absl::Status s = CheckSizes(*sealed[k], hs.new_item_bytes[k], ranks[k], task);
              !s.ok()) {
            drop_all();
            return s;
          }
        }
      }
      if (sealed[k].has_value()) {
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
    const std::vector<ItemSlot>& items = sealed[k]->items;
    const std::vector<uint64_t>& sums = sealed[k]->checksums;
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
