// TaskRun's Move phase (task_run.h): zero fills, then the cross-host chunks
// and the local steps concurrently, each item checked once its last access
// is over.
#include <algorithm>
#include <cstring>
#include <deque>

#include "absl/strings/str_cat.h"
#include "agent/executor/item_accesses.h"
#include "agent/executor/task_run.h"
#include "agent/executor/transfer_tags.h"
#include "common/log.h"

namespace reshard::agent {
namespace {

using Clock = std::chrono::steady_clock;
constexpr auto kProgressInterval = std::chrono::milliseconds(100);

// Compares `now`, the checksum of item `item` of old rank `rank` as it was
// read, with `sealed`, that rank's sealed checksums; DataLoss naming it when
// they differ.
absl::Status CheckSource(uint64_t now, const std::vector<uint64_t>& sealed, int rank, int item,
                         const v1::TransferPlan& plan, const v1::HostTask& task) {
  if (item < static_cast<int>(sealed.size()) && now == sealed[item]) return absl::OkStatus();
  return absl::DataLossError(absl::StrCat(
      DescribeSource(task, rank), " item ", item, " (\"", plan.items(item).name(),
      "\") no longer matches its sealed checksum: ", absl::Hex(now, absl::kZeroPad16), ", sealed ",
      item < static_cast<int>(sealed.size())
          ? absl::StrCat(absl::Hex(sealed[item], absl::kZeroPad16))
          : std::string("none")));
}

}  // namespace

absl::Status TaskRun::Move() {
  last_report_ = Clock::now();
  if (on_devices_) return MoveOnDevices();
  Report(true);
  PlanChunks();
  StartItemChecks();
  ApplyZeroFills();
  pool_.emplace(ex_.options->chunk_bytes);
  transfer_started_ = true;

  auto last_lease_check = Clock::now();
  while (LocalsLeft() || finished_ < lanes_->chunk_count()) {
    if (cancelled_ && cancelled_()) {
      return Fail(
          absl::CancelledError(absl::StrCat("operation ", task_.operation_id(), " cancelled")));
    }
    if (Clock::now() - last_lease_check >= kProgressInterval) {
      last_lease_check = Clock::now();
      if (absl::Status s = CheckLeases(leases_, task_); !s.ok()) return Fail(s);
    }
    while (std::optional<TransferLanes::Chunk> c = lanes_->Next()) Issue(*c);
    // Completions first: they free window space for more transfers.
    if (absl::Status s = HandleCompletions(); !s.ok()) return Fail(s);
    if (LocalsLeft()) CopyNextLocalPiece();
    Report(false);
  }
  Report(true);
  prefaulter_->Stop();
  return absl::OkStatus();
}

// A device route's Move: the local steps through the device API
// (CopyLocalsOnDevices), the zero fills counted (the new buffers were made
// zeroed), the host sources' leases checked; then the cross-host steps as the
// run's one transfer to the route's mover, polled to its completion and
// cancelled once cancelled() says so. No byte is read on the host.
absl::Status TaskRun::MoveOnDevices() {
  auto landed = [this](int64_t bytes) {
    done_ += bytes;
    Report(false);
  };
  if (absl::Status s = CopyLocalsOnDevices(ex_.devices->api(), task_, hs_, new_device_bufs_,
                                           std::max<int64_t>(ex_.options->local_chunk_bytes, 1),
                                           cancelled_, landed);
      !s.ok()) {
    return Fail(s);
  }
  for (const v1::ZeroFill* f : hs_.fills) done_ += f->count() * ElementBytes(f->item());
  Report(true);
  if (absl::Status s = CheckLeases(leases_, task_); !s.ok()) return Fail(s);
  if (hs_.remotes.empty()) return absl::OkStatus();
  MoverTransfer t;
  t.tag = tag_base_;
  t.steps = &hs_;
  t.made = &new_device_bufs_;
  t.landed = landed;
  mover_->Post(0, std::move(t));
  std::deque<MoverCompletion> done;
  bool cancel_sent = false;
  while (done.empty()) {
    if (!cancel_sent && cancelled_ && cancelled_()) {
      mover_->Cancel(tag_base_, kTagKeyMask);
      cancel_sent = true;
    }
    mover_->Poll(kProgressInterval, &done);
  }
  if (!done.front().second.ok()) return Fail(done.front().second);
  Report(true);
  return absl::OkStatus();
}

void TaskRun::PlanChunks() {
  std::vector<TransferLanes::Step> lane_steps;
  for (const RemoteStep& r : hs_.remotes) {
    remote_chunks_.emplace_back(ToVector(r.step->shape()), ElementBytes(r.step->item()),
                                ex_.options->chunk_bytes);
    TransferLanes::Step ls{r.peer, r.is_send, {}};
    for (int64_t c = 0; c < remote_chunks_.back().count(); ++c) {
      ls.chunk_bytes.push_back(remote_chunks_.back().Bytes(c));
    }
    lane_steps.push_back(std::move(ls));
  }
  lanes_.emplace(lane_steps, ex_.options->peer_window_bytes, ex_.options->max_inflight_bytes);
  if (task_.transfer_secret().empty() || hs_.remotes.empty()) return;
  // With a transfer secret: every cross-host step's bytes are sealed by its
  // sender and checked by its receiver (step_seal.h).
  std::vector<int64_t> chunk_counts;
  for (const StepChunks& c : remote_chunks_) chunk_counts.push_back(c.count());
  seals_ = PlanStepSeals(ex_.transport, task_, host_id_, hs_.remotes, chunk_counts);
}

// Each item is hashed as its bytes pass (a source's as they are read, a new
// item's as they land; item_hash.h) and checked as soon as its last access
// is over, while other transfers go on: a source item against its sealed
// checksum once every read of it finished (so the bytes read are the bytes
// sealed), a new item's checksum taken once every write to it landed
// (nothing writes it afterwards). The check hashes only what did not pass
// contiguously (staged chunks, strided copies), from the buffer.
void TaskRun::StartItemChecks() {
  new_sums_.resize(new_keys_.size());
  for (size_t k = 0; k < new_keys_.size(); ++k) {
    new_sums_[k].assign(new_bufs_[k]->items().size(), 0);
  }
  for (const auto& [rank, buf] : hs_.old_bufs) sealed_of_[rank] = buf->checksums();
  std::map<ItemChecks::Key, int64_t> accesses = CountItemAccesses(hs_, remote_chunks_);
  for (const auto& [key, n] : accesses) {
    const auto [kind, rank, item] = key;
    if (n == 0 || (kind == kNewItem && phase_ == TaskPhase::kPrepare)) continue;
    RankBuffer& b = kind == kNewItem ? *new_bufs_[hs_.new_index.at(rank)] : *hs_.old_bufs.at(rank);
    const ItemSlot& slot = b.items()[item];
    cursors_[key] =
        std::make_unique<ItemHashCursor>(b.data() + slot.offset, static_cast<size_t>(slot.bytes));
  }
  checks_.emplace(std::move(accesses), [this](const ItemChecks::Key& key) { CheckItem(key); });
}

ItemHashCursor* TaskRun::CursorOf(int kind, int rank, int item) {
  auto it = cursors_.find({kind, rank, item});
  return it == cursors_.end() ? nullptr : it->second.get();
}

void TaskRun::CheckItem(const ItemChecks::Key& key) {
  const auto [kind, rank, item] = key;
  // A prepare's new items are checksummed by the transfer phase.
  if (kind == kNewItem && phase_ == TaskPhase::kPrepare) return;
  RankBuffer& b = kind == kNewItem ? *new_bufs_[hs_.new_index.at(rank)] : *hs_.old_bufs.at(rank);
  const ItemSlot& slot = b.items()[item];
  auto it = cursors_.find(key);
  const uint64_t now = it != cursors_.end()
                           ? it->second->Finish()
                           : Checksum(b.data() + slot.offset, static_cast<size_t>(slot.bytes));
  if (kind == kNewItem) {
    new_sums_[hs_.new_index.at(rank)][item] = now;
    return;
  }
  absl::Status s = CheckSource(now, sealed_of_.at(rank), rank, item, task_.plan(), task_);
  if (s.ok()) return;
  std::lock_guard<std::mutex> l(source_mu_);
  source_errors_.emplace(std::make_pair(rank, item), std::move(s));
}

void TaskRun::ApplyZeroFills() {
  for (const v1::ZeroFill* f : hs_.fills) {
    const int64_t eb = ElementBytes(f->item());
    uint8_t* at = NewBuf(f->rank())->item_data(f->item()) + f->offset() * eb;
    ItemHashCursor* cursor = CursorOf(kNewItem, f->rank(), f->item());
    // Block by block, each hashed while it is in cache.
    ForEachBlock(at, static_cast<size_t>(f->count() * eb),
                 [&](size_t offset, const uint8_t* block, size_t n) {
                   std::memset(at + offset, 0, n);
                   if (cursor != nullptr) cursor->Landed(f->offset() * eb + offset, n, block);
                 });
    done_ += f->count() * eb;
    checks_->Done({kNewItem, f->rank(), f->item()});
  }
}

// Hands chunk `c` to the mover.
void TaskRun::Issue(const TransferLanes::Chunk& c) {
  const RemoteStep& r = hs_.remotes[c.step];
  const v1::CopyStep& step = *r.step;
  const StepChunks& chunks = remote_chunks_[c.step];
  const int eb = ElementBytes(step.item());
  InFlight f;
  f.lane_chunk = c;
  f.remote = c.step;
  f.bytes = c.bytes;
  chunks.Get(c.chunk, &f.start, &f.shape);
  // Checked in PrepareHostSteps (step index) and by StepChunks (chunk count).
  const uint64_t tag = TransferTag(tag_key_, step.index(), c.chunk).value();
  // The callback holds what the transfer touches, so a late callback is safe.
  std::vector<RankBufferPtr> keep;
  void* data = nullptr;
  if (r.is_send) {
    keep.push_back(hs_.old_bufs[step.src_rank()]);
    const StridedView src = SrcView(step, f.start);
    if (IsContiguous(f.shape, src.strides)) {
      data = const_cast<uint8_t*>(src.base) + src.offset * eb;
    } else {
      f.staging = pool_->Take(f.bytes);
      ex_.copier->Pack(src, f.shape, eb, f.staging->bytes.get());
    }
  } else {
    for (const auto& d : step.dsts()) keep.push_back(new_bufs_[hs_.new_index[d.rank()]]);
    const auto& d0 = step.dsts(0);
    std::vector<int64_t> strides = ToVector(d0.region().strides());
    if (step.dsts_size() == 1 && IsContiguous(f.shape, strides)) {
      data = NewBuf(d0.rank())->item_data(step.item()) +
             ChunkOffset(d0.region().offset(), strides, f.start) * eb;
    } else {
      f.staging = pool_->Take(f.bytes);
    }
  }
  if (f.staging) data = f.staging->bytes.get();
  const uint64_t seq = next_seq_++;
  MoverTransfer t;
  t.is_send = r.is_send;
  t.peer = r.peer;
  t.tag = tag;
  t.data = data;
  t.bytes = static_cast<size_t>(f.bytes);
  t.hold = std::make_shared<std::pair<std::vector<RankBufferPtr>, StagingPtr>>(std::move(keep),
                                                                               f.staging);
  const int64_t bytes = f.bytes;
  const bool staged = f.staging != nullptr;
  f.data = static_cast<const uint8_t*>(data);
  inflight_.emplace(seq, std::move(f));
  mover_->Post(seq, std::move(t));
  if (r.is_send) {
    // While the transport moves them: the bytes stay as they are until the
    // completion (a sealed source, or staging the callback holds). A
    // contiguous source chunk is hashed into its item's checksum in the same
    // pass as its tag: the source is checked as it is read (the lease keeps
    // writers out; with a secret, the receiver's tags cover what the
    // transport reads after this pass).
    const uint8_t* item_base = hs_.old_bufs[step.src_rank()]->item_data(step.item());
    const auto* bytes_at = static_cast<const uint8_t*>(data);
    std::vector<std::pair<ItemHashCursor*, size_t>> feeds;
    if (!staged) {
      feeds.emplace_back(CursorOf(kSourceItem, step.src_rank(), step.item()),
                         static_cast<size_t>(bytes_at - item_base));
    }
    FoldChunk(c.step, c.chunk, bytes_at, static_cast<size_t>(bytes), feeds);
  }
}

// Polls the mover, waiting up to kProgressInterval for completions when no
// local copy is left to do, then handles every one reported; the first failure names its step.
absl::Status TaskRun::HandleCompletions() {
  std::deque<MoverCompletion> batch;
  if (mover_ != nullptr) {
    mover_->Poll(LocalsLeft() ? Clock::duration::zero() : Clock::duration(kProgressInterval),
                 &batch);
  }
  absl::Status first_error;
  for (auto& [seq, status] : batch) {
    auto it = inflight_.find(seq);
    RESHARD_CHECK(it != inflight_.end());
    InFlight f = std::move(it->second);
    inflight_.erase(it);
    ++finished_;
    lanes_->Done(f.lane_chunk);
    const RemoteStep& r = hs_.remotes[f.remote];
    if (!status.ok() && first_error.ok()) {
      first_error = absl::Status(
          status.code(), absl::StrCat("step ", r.step->index(), " ",
                                      r.is_send ? "send to \"" + r.peer + "\"" : "receive", ": ",
                                      status.message()));
    }
    if (!first_error.ok()) continue;
    if (!r.is_send) {
      // The tag of the bytes exactly as they arrived (the unpack only reads
      // them), in one pass with the checksum of every destination that holds
      // them contiguously: the chunk's own place when received in place,
      // else each contiguous destination of the unpack (fan-out), once
      // written.
      std::vector<std::pair<ItemHashCursor*, size_t>> feeds;
      const int item = r.step->item();
      if (!f.staging) {
        const int dst_rank = r.step->dsts(0).rank();
        feeds.emplace_back(CursorOf(kNewItem, dst_rank, item),
                           static_cast<size_t>(f.data - NewBuf(dst_rank)->item_data(item)));
      } else {
        const std::vector<MutableStridedView> dsts = DstViews(*r.step, f.start);
        ex_.copier->Unpack(f.staging->bytes.get(), dsts, f.shape, ElementBytes(item));
        for (int i = 0; i < r.step->dsts_size(); ++i) {
          if (!IsContiguous(f.shape, dsts[i].strides)) continue;
          feeds.emplace_back(CursorOf(kNewItem, r.step->dsts(i).rank(), item),
                             static_cast<size_t>(dsts[i].offset * ElementBytes(item)));
        }
      }
      FoldChunk(f.remote, f.lane_chunk.chunk, f.data, static_cast<size_t>(f.bytes), feeds);
      done_ += f.bytes * r.step->dsts_size();
      for (const auto& d : r.step->dsts()) checks_->Done({kNewItem, d.rank(), r.step->item()});
    } else {
      checks_->Done({kSourceItem, r.step->src_rank(), r.step->item()});
    }
    pool_->Give(std::move(f.staging));
  }
  return first_error;
}

// One piece (about local_chunk_bytes) of the next local step, so that
// completions are handled between pieces.
void TaskRun::CopyNextLocalPiece() {
  const v1::CopyStep& step = *hs_.locals[next_local_];
  const int eb = ElementBytes(step.item());
  if (!local_chunks_) {
    local_chunks_ =
        std::make_unique<StepChunks>(ToVector(step.shape()), eb, ex_.options->local_chunk_bytes);
  }
  if (local_chunks_->count() > 0) {
    std::vector<int64_t> start, shape;
    local_chunks_->Get(next_local_chunk_, &start, &shape);
    CopyAndHash(step, SrcView(step, start), DstViews(step, start), shape);
    done_ += local_chunks_->Bytes(next_local_chunk_) * step.dsts_size();
  }
  if (++next_local_chunk_ >= local_chunks_->count()) {
    checks_->Done({kSourceItem, step.src_rank(), step.item()});
    for (const auto& d : step.dsts()) checks_->Done({kNewItem, d.rank(), step.item()});
    ++next_local_;
    next_local_chunk_ = 0;
    local_chunks_.reset();
  }
}

void TaskRun::FoldChunk(size_t remote, int64_t chunk, const uint8_t* data, size_t bytes,
                        const std::vector<std::pair<ItemHashCursor*, size_t>>& feeds) {
  const auto feed = [&](size_t offset, const uint8_t* block, size_t n) {
    for (const auto& [cursor, item_offset] : feeds) {
      if (cursor != nullptr) cursor->Landed(item_offset + offset, n, block);
    }
  };
  if (seals_) {
    seals_->AddChunk(remote, chunk, data, bytes,
                     feeds.empty() ? std::function<void(size_t, const uint8_t*, size_t)>() : feed);
  } else if (feeds.size() == 1) {
    feed(0, data, bytes);
  } else if (!feeds.empty()) {
    ForEachBlock(data, bytes, feed);  // each block hot for every destination
  }
}

// A piece small enough for the copier to write through the cache (one
// thread, ordinary stores) has its contiguous source and destinations fed to
// their checksums right after the copy, while they are in cache. A larger
// piece is copied by the copier's threads with streaming stores that bypass
// the cache: hashing it here would be a cold pass on this thread, which
// runs the transfers, so it is left to the background check (ItemChecks).
void TaskRun::CopyAndHash(const v1::CopyStep& step, const StridedView& src,
                          const std::vector<MutableStridedView>& dsts,
                          const std::vector<int64_t>& shape) {
  const int eb = ElementBytes(step.item());
  ex_.copier->Copy(src, dsts, shape, eb);
  int64_t elements = 1;
  for (int64_t n : shape) elements *= n;
  const size_t bytes = static_cast<size_t>(elements * eb);
  if (bytes == 0 || bytes >= static_cast<size_t>(LocalCopier::kNonTemporalThresholdBytes)) return;
  if (IsContiguous(shape, src.strides)) {
    if (ItemHashCursor* c = CursorOf(kSourceItem, step.src_rank(), step.item())) {
      c->Landed(static_cast<size_t>(src.offset * eb), bytes, src.base + src.offset * eb);
    }
  }
  for (int i = 0; i < step.dsts_size() && i < static_cast<int>(dsts.size()); ++i) {
    if (!IsContiguous(shape, dsts[i].strides)) continue;
    if (ItemHashCursor* c = CursorOf(kNewItem, step.dsts(i).rank(), step.item())) {
      c->Landed(static_cast<size_t>(dsts[i].offset * eb), bytes,
                dsts[i].base + dsts[i].offset * eb);
    }
  }
}

void TaskRun::Report(bool force) {
  const auto now = Clock::now();
  if (!force && now - last_report_ < kProgressInterval) return;
  last_report_ = now;
  if (progress_) progress_(done_, hs_.total_bytes);
  if (waiting_ && transfer_started_) {
    std::string what = DescribeWait(inflight_, hs_.remotes, LocalsLeft());
    if (what != waiting_on_) waiting_(waiting_on_ = std::move(what));
  }
}

std::vector<MutableStridedView> TaskRun::DstViews(const v1::CopyStep& step,
                                                  const std::vector<int64_t>& start) {
  std::vector<MutableStridedView> v;
  for (const auto& d : step.dsts()) {
    std::vector<int64_t> strides = ToVector(d.region().strides());
    const int64_t offset = ChunkOffset(d.region().offset(), strides, start);
    v.push_back(
        MutableStridedView{NewBuf(d.rank())->item_data(step.item()), offset, std::move(strides)});
  }
  return v;
}

StridedView TaskRun::SrcView(const v1::CopyStep& step, const std::vector<int64_t>& start) {
  std::vector<int64_t> strides = ToVector(step.src().strides());
  const int64_t offset = ChunkOffset(step.src().offset(), strides, start);
  return StridedView{hs_.old_bufs[step.src_rank()]->item_data(step.item()), offset,
                     std::move(strides)};
}

}  // namespace reshard::agent
