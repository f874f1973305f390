#include "agent/executor/host_steps.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "agent/executor/transfer_tags.h"
#include "planner/layout.h"
#include "planner/validate.h"

namespace reshard::agent {

absl::Status CheckRegion(const v1::StridedRegion& r, const v1::CopyStep& step, int64_t elements,
                         const char* what, int rank) {
  if (r.strides_size() != step.shape_size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("step ", step.index(), ": ", what, " of rank ", rank, " has ",
                     r.strides_size(), " strides for a rank-", step.shape_size(), " shape"));
  }
  int64_t lo = r.offset(), hi = r.offset();
  for (int k = 0; k < step.shape_size(); ++k) {
    if (step.shape(k) <= 0) return absl::OkStatus();  // nothing to copy
    const int64_t span = (step.shape(k) - 1) * r.strides(k);
    (span < 0 ? lo : hi) += span;
  }
  if (lo < 0 || hi >= elements) {
    return absl::InvalidArgumentError(
        absl::StrCat("step ", step.index(), ": ", what, " of rank ", rank, " reaches elements [",
                     lo, ", ", hi, "] of a ", elements, "-element item ", step.item()));
  }
  return absl::OkStatus();
}

absl::StatusOr<HostSteps> PrepareHostSteps(ShardStore* store, const std::string& host_id,
                                           const v1::HostTask& task) {
  const v1::TransferPlan& plan = task.plan();
  const std::string& job = task.job_id();
  if (absl::Status s = planner::ValidatePtc(task.ptc()); !s.ok()) return s;
  for (const v1::Layout* l : {&plan.source_layout(), &plan.target_layout()}) {
    if (absl::Status s = planner::ValidateLayout(task.ptc(), *l,
                                                 l == &plan.source_layout() ? "source" : "target");
        !s.ok())
      return s;
  }
  if (plan.items_size() != task.ptc().tensors_size() + task.ptc().blobs_size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("operation ", task.operation_id(), ": plan has ", plan.items_size(),
                     " items, the PTC ", task.ptc().tensors_size() + task.ptc().blobs_size()));
  }
  const std::vector<v1::DeviceSlot> old_slots =
      planner::ExpandPlacement(plan.source_layout().placement());
  const std::vector<v1::DeviceSlot> new_slots =
      planner::ExpandPlacement(plan.target_layout().placement());
  auto old_host = [&](int r) -> const std::string* {
    return r >= 0 && r < static_cast<int>(old_slots.size()) ? &old_slots[r].host() : nullptr;
  };
  auto new_host = [&](int r) -> const std::string* {
    return r >= 0 && r < static_cast<int>(new_slots.size()) ? &new_slots[r].host() : nullptr;
  };

  HostSteps out;
  for (int r = 0; r < static_cast<int>(new_slots.size()); ++r) {
    if (new_slots[r].host() != host_id) continue;
    out.new_index[r] = out.new_ranks.size();
    out.new_ranks.push_back(r);
    out.new_item_bytes.push_back(RankItemBytes(task.ptc(), plan.target_layout(), r));
  }

  auto old_buffer = [&](int rank) -> absl::StatusOr<RankBuffer*> {
    auto it = out.old_bufs.find(rank);
    if (it != out.old_bufs.end()) return it->second.get();
    absl::StatusOr<RankBufferPtr> b = store->Get({job, task.from_generation(), rank});
    if (!b.ok()) {
      if (absl::IsNotFound(b.status())) {
        return absl::NotFoundError(absl::StrCat("old shard of job \"", job, "\" generation ",
                                                task.from_generation(), " rank ", rank,
                                                " not found on host \"", host_id, "\""));
      }
      return b.status();
    }
    if (!(*b)->sealed()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "old shard of job \"", job, "\" generation ", task.from_generation(), " rank ", rank,
          " on host \"", host_id, "\" is not sealed (its worker never called SealShard)"));
    }
    // The file must still be the one sealed, at its size: reading a
    // truncated mapping would kill the agent.
    if (absl::Status s = (*b)->CheckFile(); !s.ok()) return s;
    RankBuffer* raw = b->get();
    out.old_bufs.emplace(rank, std::move(*b));
    return raw;
  };

  // Validates `step`'s source (when here) and destinations (when here).
  auto check_step = [&](const v1::CopyStep& step, bool src_here, bool dst_here) -> absl::Status {
    if (step.item() < 0 || step.item() >= plan.items_size() || step.dsts_size() == 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("step ", step.index(), ": item ", step.item(), " or destinations invalid"));
    }
    const int eb = plan.items(step.item()).element_bytes();
    if (eb <= 0)
      return absl::InvalidArgumentError(absl::StrCat("item ", step.item(), ": element_bytes ", eb));
    for (int64_t n : step.shape()) {
      if (n < 0) {
        return absl::InvalidArgumentError(
            absl::StrCat("step ", step.index(), ": negative extent ", n));
      }
    }
    if (src_here) {
      absl::StatusOr<RankBuffer*> b = old_buffer(step.src_rank());
      if (!b.ok()) return b.status();
      absl::Status s = CheckRegion(step.src(), step, (*b)->items()[step.item()].bytes / eb,
                                   "source", step.src_rank());
      if (!s.ok()) return s;
    }
    if (dst_here) {
      for (const auto& d : step.dsts()) {
        auto it = out.new_index.find(d.rank());
        if (it == out.new_index.end()) {
          return absl::InvalidArgumentError(absl::StrCat("step ", step.index(),
                                                         ": destination rank ", d.rank(),
                                                         " is not on host \"", host_id, "\""));
        }
        absl::Status s =
            CheckRegion(d.region(), step, out.new_item_bytes[it->second][step.item()] / eb,
                        "destination", d.rank());
        if (!s.ok()) return s;
      }
    }
    return absl::OkStatus();
  };

  for (const v1::CopyStep& step : plan.steps()) {
    const std::string* src_host = old_host(step.src_rank());
    const std::string* dst_host = step.dsts_size() > 0 ? new_host(step.dsts(0).rank()) : nullptr;
    if (src_host == nullptr || dst_host == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat("step ", step.index(), ": a rank outside the layouts"));
    }
    for (const auto& d : step.dsts()) {
      const std::string* h = new_host(d.rank());
      if (h == nullptr || *h != *dst_host) {
        return absl::InvalidArgumentError(
            absl::StrCat("step ", step.index(), ": destinations on more than one host"));
      }
    }
    const bool src_here = *src_host == host_id, dst_here = *dst_host == host_id;
    if (!src_here && !dst_here) continue;  // not this host's step
    if (absl::Status s = check_step(step, src_here, dst_here); !s.ok()) return s;
    if (dst_here) out.total_bytes += step.bytes() * step.dsts_size();
    if (src_here && dst_here) {
      out.locals.push_back(&step);
      continue;
    }
    if (step.index() < 0 || step.index() >= kProofStepIndex) {
      return absl::InvalidArgumentError(
          absl::StrCat("operation ", task.operation_id(), ": cross-host step index ", step.index(),
                       " does not fit a transfer tag (at most ", kProofStepIndex - 1, ")"));
    }
    out.remotes.push_back(RemoteStep{&step, src_here, src_here ? *dst_host : *src_host});
  }
  for (const v1::ZeroFill& f : plan.zero_fills()) {
    auto it = out.new_index.find(f.rank());
    if (it == out.new_index.end()) continue;
    if (f.item() < 0 || f.item() >= plan.items_size()) {
      return absl::InvalidArgumentError(absl::StrCat("zero fill: item ", f.item(), " invalid"));
    }
    const int64_t eb = plan.items(f.item()).element_bytes();
    const int64_t have = out.new_item_bytes[it->second][f.item()];
    if (eb <= 0 || f.offset() < 0 || f.count() < 0 || (f.offset() + f.count()) * eb > have) {
      return absl::InvalidArgumentError(absl::StrCat("zero fill of rank ", f.rank(), " item ",
                                                     f.item(), " [", f.offset(), ", +", f.count(),
                                                     ") exceeds the ", have, "-byte item"));
    }
    out.fills.push_back(&f);
    out.total_bytes += f.count() * eb;
  }
  // Both ends issue cross-host transfers in plan order, so the earliest
  // unfinished one is always posted on both sides: the byte window cannot
  // deadlock. Equal indices would give equal tags.
  std::sort(out.remotes.begin(), out.remotes.end(), [](const RemoteStep& a, const RemoteStep& b) {
    return a.step->index() < b.step->index();
  });
  for (size_t i = 1; i < out.remotes.size(); ++i) {
    if (out.remotes[i].step->index() == out.remotes[i - 1].step->index()) {
      return absl::InvalidArgumentError(absl::StrCat("operation ", task.operation_id(),
                                                     ": two cross-host steps with index ",
                                                     out.remotes[i].step->index()));
    }
  }
  for (const RemoteStep& r : out.remotes) {
    if (!r.is_send || out.send_peers.count(r.peer)) continue;
    const v1::PeerHost* peer = nullptr;
    for (const auto& p : task.peers()) {
      if (p.host_id() == r.peer) peer = &p;
    }
    if (peer == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat("operation ", task.operation_id(),
                                                     ": peer host \"", r.peer,
                                                     "\" not in the task's peers"));
    }
    out.send_peers[r.peer] = peer->ucx_address();
  }
  return out;
}

}  // namespace reshard::agent
