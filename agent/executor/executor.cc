#include "agent/executor/executor.h"

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <unordered_map>

#include "absl/strings/str_cat.h"
#include "agent/transfer/local_copy.h"
#include "common/log.h"
#include "planner/layout.h"
#include "planner/validate.h"

namespace reshard::agent {
namespace {

using Clock = std::chrono::steady_clock;
constexpr auto kProgressInterval = std::chrono::milliseconds(100);
// How long a failed task waits for the transport to give back the buffers of
// transfers it cancelled (they stay alive through shared pointers anyway).
constexpr auto kCancelGrace = std::chrono::seconds(10);

std::vector<int64_t> ToVector(const google::protobuf::RepeatedField<int64_t>& f) {
  return std::vector<int64_t>(f.begin(), f.end());
}

// InvalidArgument unless every element of the region lies in [0, elements).
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

// A cross-host transfer of one step.
struct Remote {
  const v1::CopyStep* step = nullptr;
  bool is_send = false;
  std::string peer;  // sends: the destinations' host
  int64_t bytes = 0;
};

// Completions reported by transport callbacks; shared with them so a late
// callback after Execute returned touches nothing freed.
struct Completions {
  std::mutex mu;
  std::condition_variable cv;
  std::deque<std::pair<size_t, absl::Status>> done;  // (remote index, status)
};

}  // namespace

uint32_t OperationTagKey(const std::string& operation_id) {
  uint32_t h = 2166136261u;
  for (unsigned char c : operation_id) {
    h ^= c;
    h *= 16777619u;
  }
  return h;
}

TaskExecutor::TaskExecutor(ShardStore* store, Transport* transport, Options options)
    : store_(store),
      transport_(transport),
      options_(options),
      copier_(std::make_unique<LocalCopier>(options.copy_threads)) {}

TaskExecutor::~TaskExecutor() = default;

absl::StatusOr<std::vector<v1::ShardChecksum>> TaskExecutor::Execute(
    const std::string& host_id, const v1::HostTask& task,
    const std::function<void(int64_t done, int64_t total)>& progress,
    const std::function<bool()>& cancelled) {
  const v1::TransferPlan& plan = task.plan();
  const std::string& job = task.job_id();
  // The task arrived over the network: check what the planner helpers assume.
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

  // 1. The new buffers of this host's new ranks, all or none.
  std::vector<RankBufferKey> new_keys;
  std::vector<std::vector<int64_t>> new_item_bytes;
  std::map<int, size_t> new_index;  // new rank -> position in new_keys
  for (int r = 0; r < static_cast<int>(new_slots.size()); ++r) {
    if (new_slots[r].host() != host_id) continue;
    new_index[r] = new_keys.size();
    new_keys.push_back(RankBufferKey{job, task.to_generation(), r});
    new_item_bytes.push_back(RankItemBytes(task.ptc(), plan.target_layout(), r));
  }
  if (cancelled && cancelled()) return absl::CancelledError("task cancelled before it started");
  absl::StatusOr<std::vector<RankBufferPtr>> created = store_->CreateAll(new_keys, new_item_bytes);
  if (!created.ok()) return created.status();
  std::vector<RankBufferPtr> new_bufs = std::move(*created);

  const uint32_t tag_key = OperationTagKey(task.operation_id());
  auto completions = std::make_shared<Completions>();
  std::vector<Remote> remotes;
  size_t issued = 0;       // remotes[0, issued) handed to the transport
  size_t outstanding = 0;  // issued and not yet completed

  auto fail = [&](absl::Status s) -> absl::Status {
    if (transport_ != nullptr && outstanding > 0) {
      transport_->CancelTag(tag_key);
      const auto deadline = Clock::now() + kCancelGrace;
      std::unique_lock<std::mutex> l(completions->mu);
      while (outstanding > 0) {
        if (completions->done.empty() &&
            completions->cv.wait_until(l, deadline) == std::cv_status::timeout) {
          break;
        }
        while (!completions->done.empty()) {
          completions->done.pop_front();
          --outstanding;
        }
      }
    }
    for (const auto& key : new_keys) store_->Drop(key);
    RESHARD_LOG(WARNING) << "operation " << task.operation_id() << " job " << job << " host "
                         << host_id << " failed: " << s;
    return s;
  };

  // Old buffers of this host's old ranks, fetched once each.
  std::unordered_map<int, RankBufferPtr> old_bufs;
  auto old_buffer = [&](int rank) -> absl::StatusOr<RankBuffer*> {
    auto it = old_bufs.find(rank);
    if (it != old_bufs.end()) return it->second.get();
    absl::StatusOr<RankBufferPtr> b = store_->Get({job, task.from_generation(), rank});
    if (!b.ok()) {
      if (absl::IsNotFound(b.status())) {
        return absl::NotFoundError(absl::StrCat("old shard of job \"", job, "\" generation ",
                                                task.from_generation(), " rank ", rank,
                                                " not found on host \"", host_id, "\""));
      }
      return b.status();
    }
    RankBuffer* raw = b->get();
    old_bufs.emplace(rank, std::move(*b));
    return raw;
  };
  auto element_bytes = [&](int item) { return plan.items(item).element_bytes(); };

  // Validates `step`'s source (when here) and destinations (when here).
  auto check_step = [&](const v1::CopyStep& step, bool src_here, bool dst_here) -> absl::Status {
    if (step.item() < 0 || step.item() >= plan.items_size() || step.dsts_size() == 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("step ", step.index(), ": item ", step.item(), " or destinations invalid"));
    }
    const int eb = element_bytes(step.item());
    if (eb <= 0)
      return absl::InvalidArgumentError(absl::StrCat("item ", step.item(), ": element_bytes ", eb));
    if (src_here) {
      absl::StatusOr<RankBuffer*> b = old_buffer(step.src_rank());
      if (!b.ok()) return b.status();
      absl::Status s = CheckRegion(step.src(), step, (*b)->items()[step.item()].bytes / eb,
                                   "source", step.src_rank());
      if (!s.ok()) return s;
    }
    if (dst_here) {
      for (const auto& d : step.dsts()) {
        auto it = new_index.find(d.rank());
        if (it == new_index.end()) {
          return absl::InvalidArgumentError(absl::StrCat("step ", step.index(),
                                                         ": destination rank ", d.rank(),
                                                         " is not on host \"", host_id, "\""));
        }
        absl::Status s =
            CheckRegion(d.region(), step, new_bufs[it->second]->items()[step.item()].bytes / eb,
                        "destination", d.rank());
        if (!s.ok()) return s;
      }
    }
    return absl::OkStatus();
  };
  auto dst_views = [&](const v1::CopyStep& step) {
    std::vector<MutableStridedView> v;
    for (const auto& d : step.dsts()) {
      RankBuffer* b = new_bufs[new_index[d.rank()]].get();
      v.push_back(MutableStridedView{b->item_data(step.item()), d.region().offset(),
                                     ToVector(d.region().strides())});
    }
    return v;
  };
  auto src_view = [&](const v1::CopyStep& step) {
    RankBuffer* b = old_bufs[step.src_rank()].get();
    return StridedView{b->item_data(step.item()), step.src().offset(),
                       ToVector(step.src().strides())};
  };

  // 2. Classify steps and check them before any byte moves.
  std::vector<const v1::CopyStep*> locals;
  int64_t total = 0;
  for (const v1::CopyStep& step : plan.steps()) {
    const std::string* src_host = old_host(step.src_rank());
    const std::string* dst_host = step.dsts_size() > 0 ? new_host(step.dsts(0).rank()) : nullptr;
    if (src_host == nullptr || dst_host == nullptr) {
      return fail(absl::InvalidArgumentError(
          absl::StrCat("step ", step.index(), ": a rank outside the layouts")));
    }
    for (const auto& d : step.dsts()) {
      const std::string* h = new_host(d.rank());
      if (h == nullptr || *h != *dst_host) {
        return fail(absl::InvalidArgumentError(
            absl::StrCat("step ", step.index(), ": destinations on more than one host")));
      }
    }
    const bool src_here = *src_host == host_id, dst_here = *dst_host == host_id;
    if (!src_here && !dst_here) continue;  // not this host's step
    if (absl::Status s = check_step(step, src_here, dst_here); !s.ok()) return fail(s);
    if (dst_here) total += step.bytes() * step.dsts_size();
    if (src_here && dst_here) {
      locals.push_back(&step);
    } else {
      remotes.push_back(
          Remote{&step, src_here, src_here ? *dst_host : std::string(), step.bytes()});
    }
  }
  for (const v1::ZeroFill& f : plan.zero_fills()) {
    auto it = new_index.find(f.rank());
    if (it == new_index.end()) continue;
    if (f.item() < 0 || f.item() >= plan.items_size()) {
      return fail(
          absl::InvalidArgumentError(absl::StrCat("zero fill: item ", f.item(), " invalid")));
    }
    const int64_t eb = element_bytes(f.item());
    const int64_t have = new_bufs[it->second]->items()[f.item()].bytes;
    if (f.offset() < 0 || f.count() < 0 || (f.offset() + f.count()) * eb > have) {
      return fail(absl::InvalidArgumentError(
          absl::StrCat("zero fill of rank ", f.rank(), " item ", f.item(), " [", f.offset(), ", +",
                       f.count(), ") exceeds the ", have, "-byte item")));
    }
    total += f.count() * eb;
  }
  if (!remotes.empty() && transport_ == nullptr) {
    return fail(absl::FailedPreconditionError(
        absl::StrCat("operation ", task.operation_id(), " has cross-host steps and no transport")));
  }
  // Both ends issue cross-host transfers in plan order, so the earliest
  // unfinished one is always posted on both sides: the byte window cannot deadlock.
  std::sort(remotes.begin(), remotes.end(),
            [](const Remote& a, const Remote& b) { return a.step->index() < b.step->index(); });
  std::map<std::string, bool> connected;
  for (const Remote& r : remotes) {
    if (!r.is_send || connected.count(r.peer)) continue;
    const v1::PeerHost* peer = nullptr;
    for (const auto& p : task.peers()) {
      if (p.host_id() == r.peer) peer = &p;
    }
    if (peer == nullptr) {
      return fail(absl::InvalidArgumentError(absl::StrCat("operation ", task.operation_id(),
                                                          ": peer host \"", r.peer,
                                                          "\" not in the task's peers")));
    }
    if (absl::Status s = transport_->Connect(r.peer, peer->ucx_address()); !s.ok()) return fail(s);
    connected[r.peer] = true;
  }

  // 3. Move bytes.
  int64_t done = 0;
  auto last_report = Clock::now();
  auto report = [&](bool force) {
    if (!progress) return;
    const auto now = Clock::now();
    if (!force && now - last_report < kProgressInterval) return;
    last_report = now;
    progress(done, total);
  };
  report(true);
  for (const v1::ZeroFill& f : plan.zero_fills()) {
    auto it = new_index.find(f.rank());
    if (it == new_index.end()) continue;
    const int64_t eb = element_bytes(f.item());
    std::memset(new_bufs[it->second]->item_data(f.item()) + f.offset() * eb, 0, f.count() * eb);
    done += f.count() * eb;
  }

  // Per issued remote: its staging buffer (shared with the callback). Left
  // uninitialised: Pack or the receive overwrites every byte, and zeroing
  // hundreds of MiB per step would cost as much as the copy.
  struct Staging {
    explicit Staging(int64_t n) : bytes(new uint8_t[n]) {}
    uint8_t* data() { return bytes.get(); }
    std::unique_ptr<uint8_t[]> bytes;
  };
  std::vector<std::shared_ptr<Staging>> staging(remotes.size());
  int64_t inflight = 0;
  size_t next_local = 0;
  size_t finished = 0;
  auto issue = [&](size_t i) {
    Remote& r = remotes[i];
    const v1::CopyStep& step = *r.step;
    const int eb = element_bytes(step.item());
    const std::vector<int64_t> shape = ToVector(step.shape());
    const uint64_t tag =
        uint64_t{tag_key} << 32 | (static_cast<uint64_t>(step.index()) & 0xffffffffu);
    auto cb_state = completions;
    // The callback holds what the transfer touches, so a late callback is safe.
    std::vector<RankBufferPtr> keep;
    if (r.is_send) {
      keep.push_back(old_bufs[step.src_rank()]);
    } else {
      for (const auto& d : step.dsts()) keep.push_back(new_bufs[new_index[d.rank()]]);
    }
    void* data = nullptr;
    if (r.is_send) {
      const StridedView src = src_view(step);
      if (IsContiguous(shape, src.strides)) {
        data = const_cast<uint8_t*>(src.base) + src.offset * eb;
      } else {
        staging[i] = std::make_shared<Staging>(r.bytes);
        copier_->Pack(src, shape, eb, staging[i]->data());
      }
    } else {
      const auto& d0 = step.dsts(0);
      if (step.dsts_size() == 1 && IsContiguous(shape, ToVector(d0.region().strides()))) {
        data = new_bufs[new_index[d0.rank()]]->item_data(step.item()) + d0.region().offset() * eb;
      } else {
        staging[i] = std::make_shared<Staging>(r.bytes);
      }
    }
    if (staging[i]) data = staging[i]->data();
    TransferDone cb = [cb_state, i, keep, buf = staging[i]](absl::Status s) {
      std::lock_guard<std::mutex> l(cb_state->mu);
      cb_state->done.emplace_back(i, std::move(s));
      cb_state->cv.notify_one();
    };
    if (r.is_send) {
      transport_->Send(r.peer, tag, data, r.bytes, std::move(cb));
    } else {
      transport_->Receive(tag, data, r.bytes, std::move(cb));
    }
    inflight += r.bytes;
    ++outstanding;
  };

  while (next_local < locals.size() || finished < remotes.size()) {
    if (cancelled && cancelled()) {
      return fail(
          absl::CancelledError(absl::StrCat("operation ", task.operation_id(), " cancelled")));
    }
    while (issued < remotes.size() &&
           (outstanding == 0 || inflight + remotes[issued].bytes <= options_.max_inflight_bytes)) {
      issue(issued++);
    }
    // Completions first: they free window space for more transfers.
    std::deque<std::pair<size_t, absl::Status>> batch;
    {
      std::unique_lock<std::mutex> l(completions->mu);
      if (completions->done.empty() && next_local >= locals.size()) {
        completions->cv.wait_for(l, kProgressInterval);
      }
      batch.swap(completions->done);
    }
    absl::Status first_error;
    for (auto& [i, status] : batch) {
      --outstanding;
      ++finished;
      Remote& r = remotes[i];
      inflight -= r.bytes;
      if (!status.ok() && first_error.ok()) {
        first_error = absl::Status(
            status.code(), absl::StrCat("step ", r.step->index(), " ",
                                        r.is_send ? "send to \"" + r.peer + "\"" : "receive", ": ",
                                        status.message()));
      }
      if (!first_error.ok()) continue;
      if (!r.is_send) {
        if (staging[i]) {
          copier_->Unpack(staging[i]->data(), dst_views(*r.step), ToVector(r.step->shape()),
                          element_bytes(r.step->item()));
        }
        done += r.bytes * r.step->dsts_size();
      }
      staging[i].reset();
    }
    if (!first_error.ok()) return fail(first_error);
    if (next_local < locals.size()) {
      const v1::CopyStep& step = *locals[next_local++];
      copier_->Copy(src_view(step), dst_views(step), ToVector(step.shape()),
                    element_bytes(step.item()));
      done += step.bytes() * step.dsts_size();
    }
    report(false);
  }
  report(true);

  // 4. Checksums from the bytes written, recorded durably.
  std::vector<v1::ShardChecksum> out;
  for (size_t k = 0; k < new_keys.size(); ++k) {
    absl::StatusOr<std::vector<uint64_t>> sums = store_->Seal(new_keys[k], {});
    if (!sums.ok()) return fail(sums.status());
    const auto& items = new_bufs[k]->items();
    for (size_t item = 0; item < items.size() && item < sums->size(); ++item) {
      if (items[item].bytes == 0) continue;
      v1::ShardChecksum c;
      c.set_item(static_cast<int>(item));
      c.set_rank(new_keys[k].rank);
      c.set_checksum((*sums)[item]);
      c.set_bytes(items[item].bytes);
      out.push_back(std::move(c));
    }
  }
  return out;
}

}  // namespace reshard::agent
