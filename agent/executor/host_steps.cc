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

namespace {

// The PTC, both layouts, and one plan item per PTC tensor and blob.
absl::Status CheckTaskShape(const v1::HostTask& task) {
  const v1::TransferPlan& plan = task.plan();
  // A host's task is its slice of the plan, written out: a plan whose
  // replicas repeat here would move replica 0's bytes only.
  if (plan.replicas().count() > 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("operation ", task.operation_id(), ": the task's plan repeats over ",
                     plan.replicas().count(),
                     " replicas (TransferPlan.replicas); a host's task must be written out"));
  }
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
  return absl::OkStatus();
}

// This host's part of a task as PrepareHostSteps sorts it out.
class HostPart {
 public:
  HostPart(ShardStore* store, const std::string& host_id, const v1::HostTask& task)
      : store_(store),
        host_id_(host_id),
        task_(task),
        plan_(task.plan()),
        old_slots_(planner::ExpandPlacement(plan_.source_layout().placement())),
        new_slots_(planner::ExpandPlacement(plan_.target_layout().placement())) {
    for (int r = 0; r < static_cast<int>(new_slots_.size()); ++r) {
      if (new_slots_[r].host() != host_id_) continue;
      out_.new_index[r] = out_.new_ranks.size();
      out_.new_ranks.push_back(r);
      out_.new_item_bytes.push_back(RankItemBytes(task_.ptc(), plan_.target_layout(), r));
    }
  }

  absl::StatusOr<HostSteps> Sort() {
    for (const v1::CopyStep& step : plan_.steps()) {
      if (absl::Status s = AddStep(step); !s.ok()) return s;
    }
    if (absl::Status s = AddZeroFills(); !s.ok()) return s;
    if (absl::Status s = OrderRemotes(); !s.ok()) return s;
    if (absl::Status s = FindSendPeers(); !s.ok()) return s;
    return std::move(out_);
  }

 private:
  const std::string* OldHost(int r) const {
    return r >= 0 && r < static_cast<int>(old_slots_.size()) ? &old_slots_[r].host() : nullptr;
  }
  const std::string* NewHost(int r) const {
    return r >= 0 && r < static_cast<int>(new_slots_.size()) ? &new_slots_[r].host() : nullptr;
  }

  // The sealed old buffer of `rank` here, looked up once.
  absl::StatusOr<RankBuffer*> OldBuffer(int rank) {
    const std::string& job = task_.job_id();
    auto it = out_.old_bufs.find(rank);
    if (it != out_.old_bufs.end()) return it->second.get();
    absl::StatusOr<RankBufferPtr> b = store_->Get({job, task_.from_generation(), rank});
    if (!b.ok()) {
      if (absl::IsNotFound(b.status())) {
        return absl::NotFoundError(absl::StrCat("old shard of job \"", job, "\" generation ",
                                                task_.from_generation(), " rank ", rank,
                                                " not found on host \"", host_id_, "\""));
      }
      return b.status();
    }
    if (!(*b)->sealed()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "old shard of job \"", job, "\" generation ", task_.from_generation(), " rank ", rank,
          " on host \"", host_id_, "\" is not sealed (its worker never called SealShard)"));
    }
    // The file must still be the one sealed, at its size: reading a
    // truncated mapping would kill the agent.
    if (absl::Status s = (*b)->CheckFile(); !s.ok()) return s;
    RankBuffer* raw = b->get();
    out_.old_bufs.emplace(rank, std::move(*b));
    return raw;
  }

  // Validates `step`'s source (when here) and destinations (when here).
  absl::Status CheckStep(const v1::CopyStep& step, bool src_here, bool dst_here) {
    if (step.item() < 0 || step.item() >= plan_.items_size() || step.dsts_size() == 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("step ", step.index(), ": item ", step.item(), " or destinations invalid"));
    }
    const int eb = plan_.items(step.item()).element_bytes();
    if (eb <= 0)
      return absl::InvalidArgumentError(absl::StrCat("item ", step.item(), ": element_bytes ", eb));
    for (int64_t n : step.shape()) {
      if (n < 0) {
        return absl::InvalidArgumentError(
            absl::StrCat("step ", step.index(), ": negative extent ", n));
      }
    }
    if (src_here) {
      absl::StatusOr<RankBuffer*> b = OldBuffer(step.src_rank());
      if (!b.ok()) return b.status();
      absl::Status s = CheckRegion(step.src(), step, (*b)->items()[step.item()].bytes / eb,
                                   "source", step.src_rank());
      if (!s.ok()) return s;
    }
    if (dst_here) {
      for (const auto& d : step.dsts()) {
        auto it = out_.new_index.find(d.rank());
        if (it == out_.new_index.end()) {
          return absl::InvalidArgumentError(absl::StrCat("step ", step.index(),
                                                         ": destination rank ", d.rank(),
                                                         " is not on host \"", host_id_, "\""));
        }
        absl::Status s =
            CheckRegion(d.region(), step, out_.new_item_bytes[it->second][step.item()] / eb,
                        "destination", d.rank());
        if (!s.ok()) return s;
      }
    }
    return absl::OkStatus();
  }

  // `step`, checked, as a local or cross-host step of this host (or none).
  absl::Status AddStep(const v1::CopyStep& step) {
    const std::string* src_host = OldHost(step.src_rank());
    const std::string* dst_host = step.dsts_size() > 0 ? NewHost(step.dsts(0).rank()) : nullptr;
    if (src_host == nullptr || dst_host == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat("step ", step.index(), ": a rank outside the layouts"));
    }
    for (const auto& d : step.dsts()) {
      const std::string* h = NewHost(d.rank());
      if (h == nullptr || *h != *dst_host) {
        return absl::InvalidArgumentError(
            absl::StrCat("step ", step.index(), ": destinations on more than one host"));
      }
    }
    const bool src_here = *src_host == host_id_, dst_here = *dst_host == host_id_;
    if (!src_here && !dst_here) return absl::OkStatus();  // not this host's step
    if (absl::Status s = CheckStep(step, src_here, dst_here); !s.ok()) return s;
    if (dst_here) out_.total_bytes += step.bytes() * step.dsts_size();
    if (src_here && dst_here) {
      out_.locals.push_back(&step);
      return absl::OkStatus();
    }
    if (step.index() < 0 || step.index() >= kProofStepIndex) {
      return absl::InvalidArgumentError(
          absl::StrCat("operation ", task_.operation_id(), ": cross-host step index ", step.index(),
                       " does not fit a transfer tag (at most ", kProofStepIndex - 1, ")"));
    }
    out_.remotes.push_back(RemoteStep{&step, src_here, src_here ? *dst_host : *src_host});
    return absl::OkStatus();
  }

  absl::Status AddZeroFills() {
    for (const v1::ZeroFill& f : plan_.zero_fills()) {
      auto it = out_.new_index.find(f.rank());
      if (it == out_.new_index.end()) continue;
      if (f.item() < 0 || f.item() >= plan_.items_size()) {
        return absl::InvalidArgumentError(absl::StrCat("zero fill: item ", f.item(), " invalid"));
      }
      const int64_t eb = plan_.items(f.item()).element_bytes();
      const int64_t have = out_.new_item_bytes[it->second][f.item()];
      if (eb <= 0 || f.offset() < 0 || f.count() < 0 || (f.offset() + f.count()) * eb > have) {
        return absl::InvalidArgumentError(absl::StrCat("zero fill of rank ", f.rank(), " item ",
                                                       f.item(), " [", f.offset(), ", +", f.count(),
                                                       ") exceeds the ", have, "-byte item"));
      }
      out_.fills.push_back(&f);
      out_.total_bytes += f.count() * eb;
    }
    return absl::OkStatus();
  }

  // Both ends issue cross-host transfers in plan order, so the earliest
  // unfinished one is always posted on both sides: the byte window cannot
  // deadlock. Equal indices would give equal tags.
  absl::Status OrderRemotes() {
    std::sort(
        out_.remotes.begin(), out_.remotes.end(),
        [](const RemoteStep& a, const RemoteStep& b) { return a.step->index() < b.step->index(); });
    for (size_t i = 1; i < out_.remotes.size(); ++i) {
      if (out_.remotes[i].step->index() == out_.remotes[i - 1].step->index()) {
        return absl::InvalidArgumentError(absl::StrCat("operation ", task_.operation_id(),
                                                       ": two cross-host steps with index ",
                                                       out_.remotes[i].step->index()));
      }
    }
    return absl::OkStatus();
  }

  // The address of every host this one sends to, from the task's peers.
  absl::Status FindSendPeers() {
    for (const RemoteStep& r : out_.remotes) {
      if (!r.is_send || out_.send_peers.count(r.peer)) continue;
      const v1::PeerHost* peer = nullptr;
      for (const auto& p : task_.peers()) {
        if (p.host_id() == r.peer) peer = &p;
      }
      if (peer == nullptr) {
        return absl::InvalidArgumentError(absl::StrCat("operation ", task_.operation_id(),
                                                       ": peer host \"", r.peer,
                                                       "\" not in the task's peers"));
      }
      out_.send_peers[r.peer] = peer->ucx_address();
    }
    return absl::OkStatus();
  }

  ShardStore* store_;
  const std::string& host_id_;
  const v1::HostTask& task_;
  const v1::TransferPlan& plan_;
  const std::vector<v1::DeviceSlot> old_slots_;
  const std::vector<v1::DeviceSlot> new_slots_;
  HostSteps out_;
};

}  // namespace

absl::StatusOr<HostSteps> PrepareHostSteps(ShardStore* store, const std::string& host_id,
                                           const v1::HostTask& task) {
  if (absl::Status s = CheckTaskShape(task); !s.ok()) return s;
  return HostPart(store, host_id, task).Sort();
}

}  // namespace reshard::agent
