#include "agent/executor/task_phase.h"

#include <set>
#include <utility>

#include "absl/strings/str_cat.h"

namespace reshard::agent {
namespace {

std::string DescribeNew(const v1::HostTask& task, int rank) {
  return absl::StrCat("prepared buffer of job \"", task.job_id(), "\" generation ",
                      task.to_generation(), " rank ", rank);
}

}  // namespace

absl::StatusOr<TaskPhase> PhaseOf(const v1::HostTask& task) {
  if (task.prepare() && task.prepared()) {
    return absl::InvalidArgumentError(
        absl::StrCat("operation ", task.operation_id(), ": a task sets both prepare and prepared"));
  }
  if (task.publish_by_workers() && (task.prepare() || task.prepared())) {
    return absl::InvalidArgumentError(absl::StrCat(
        "operation ", task.operation_id(), ": a checkpoint's task (publish_by_workers) ", "sets ",
        task.prepare() ? "prepare" : "prepared"));
  }
  if (task.prepare()) return TaskPhase::kPrepare;
  if (task.prepared()) return TaskPhase::kPrepared;
  return TaskPhase::kTransfer;
}

absl::StatusOr<std::vector<RankBufferPtr>> OpenPreparedBuffers(ShardStore* store,
                                                               const v1::HostTask& task,
                                                               const HostSteps& hs) {
  std::vector<RankBufferPtr> out;
  for (size_t k = 0; k < hs.new_ranks.size(); ++k) {
    const int rank = hs.new_ranks[k];
    absl::StatusOr<RankBufferPtr> b = store->Get({task.job_id(), task.to_generation(), rank});
    if (!b.ok()) {
      if (!absl::IsNotFound(b.status())) return b.status();
      return absl::FailedPreconditionError(
          absl::StrCat(DescribeNew(task, rank), " not found: this host did not prepare operation ",
                       task.operation_id(), " (or dropped its buffers since)"));
    }
    if ((*b)->sealed()) {
      return absl::FailedPreconditionError(
          absl::StrCat(DescribeNew(task, rank), " is sealed: the transfer of operation ",
                       task.operation_id(), " writes only unsealed buffers its prepare left"));
    }
    const std::vector<ItemSlot>& items = (*b)->items();
    const std::vector<int64_t>& want = hs.new_item_bytes[k];
    bool same = items.size() == want.size();
    for (size_t i = 0; same && i < items.size(); ++i) same = items[i].bytes == want[i];
    if (!same) {
      int64_t want_total = 0;
      (void)LayoutItems(want, &want_total);
      return absl::FailedPreconditionError(absl::StrCat(
          DescribeNew(task, rank), " has ", items.size(), " items in ", (*b)->size(),
          " bytes; the target layout gives ", want.size(), " items in ", want_total, " bytes"));
    }
    out.push_back(*std::move(b));
  }
  return out;
}

void LeaveFillsToThePrepare(const v1::TransferPlan& plan, HostSteps* hs) {
  for (const v1::ZeroFill* f : hs->fills) {
    hs->total_bytes -= f->count() * plan.items(f->item()).element_bytes();
  }
  hs->fills.clear();
}

std::vector<v1::ShardChecksum> SourceChecksums(const HostSteps& hs) {
  std::set<std::pair<int, int>> read;  // (old rank, item)
  for (const v1::CopyStep* step : hs.locals) read.insert({step->src_rank(), step->item()});
  for (const RemoteStep& r : hs.remotes) {
    if (r.is_send) read.insert({r.step->src_rank(), r.step->item()});
  }
  std::vector<v1::ShardChecksum> out;
  for (const auto& [rank, item] : read) {
    const RankBufferPtr& b = hs.old_bufs.at(rank);  // every step read it (PrepareHostSteps)
    const std::vector<uint64_t> sealed = b->checksums();
    v1::ShardChecksum c;
    c.set_rank(rank);
    c.set_item(item);
    c.set_checksum(item < static_cast<int>(sealed.size()) ? sealed[item] : 0);
    c.set_bytes(b->items()[item].bytes);
    out.push_back(std::move(c));
  }
  return out;
}

}  // namespace reshard::agent
