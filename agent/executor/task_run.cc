#include "agent/executor/task_run.h"

#include <algorithm>
#include <cstring>
#include <deque>
#include <set>
#include <thread>

#include "absl/strings/str_cat.h"
#include "agent/executor/item_accesses.h"
#include "agent/executor/peer_proof.h"
#include "agent/executor/transfer_tags.h"
#include "common/log.h"

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

// Runs fn(0) ... fn(n - 1) on up to `threads` threads (this one included),
// index i on thread i % threads.
void ParallelFor(size_t n, int threads, const std::function<void(size_t)>& fn) {
  const size_t t_count = std::max<size_t>(1, std::min<size_t>(n, std::max(1, threads)));
  std::vector<std::thread> helpers;
  for (size_t t = 1; t < t_count; ++t) {
    helpers.emplace_back([&, t] {
      for (size_t i = t; i < n; i += t_count) fn(i);
    });
  }
  for (size_t i = 0; i < n; i += t_count) fn(i);
  for (std::thread& t : helpers) t.join();
}

// Checksums item `item` of old rank `rank` and compares it with `sealed`,
// that rank's sealed checksums; DataLoss naming it when they differ.
absl::Status CheckSource(RankBuffer& b, const std::vector<uint64_t>& sealed, int rank, int item,
                         const v1::TransferPlan& plan, const v1::HostTask& task) {
  const ItemSlot& slot = b.items()[item];
  const uint64_t now = Checksum(b.data() + slot.offset, static_cast<size_t>(slot.bytes));
  if (item < static_cast<int>(sealed.size()) && now == sealed[item]) return absl::OkStatus();
  return absl::DataLossError(absl::StrCat(
      DescribeSource(task, rank), " item ", item, " (\"", plan.items(item).name(),
      "\") no longer matches its sealed checksum: ", absl::Hex(now, absl::kZeroPad16), ", sealed ",
      item < static_cast<int>(sealed.size())
          ? absl::StrCat(absl::Hex(sealed[item], absl::kZeroPad16))
          : std::string("none")));
}

// The new buffers of this host's new ranks, all or none. Executing a task
// is idempotent: buffers of an earlier attempt of this generation (an agent
// that died, or a task run again) are discarded first. Pages are reserved
// now (a full shm_dir fails here; those of spare files exist already) and
// mapped by a background thread while the first transfers run: fresh pages
// cost about as much as moving the bytes over loopback, so overlapping the
// two saves most of it.
absl::StatusOr<std::vector<RankBufferPtr>> CreateNewBuffers(ShardStore* store,
                                                            const std::vector<RankBufferKey>& keys,
                                                            const HostSteps& hs,
                                                            const v1::HostTask& task) {
  for (const RankBufferKey& k : keys) {
    if (store->Get(k).ok()) {
      RESHARD_LOG(INFO) << "operation " << task.operation_id() << " job " << task.job_id()
                        << ": discarding generation " << k.generation << " rank " << k.rank
                        << " left by an earlier attempt";
      store->Drop(k);
    }
  }
  return store->CreateAll(keys, hs.new_item_bytes, ShardStore::Backing::kReserved);
}

}  // namespace

TaskRun::TaskRun(Executor executor, const std::string& host_id, const v1::HostTask& task,
                 const std::function<void(int64_t done, int64_t total)>& progress,
                 const std::function<bool()>& cancelled,
                 const std::function<void(const std::string& what)>& waiting)
    : ex_(executor),
      host_id_(host_id),
      task_(task),
      progress_(progress),
      cancelled_(cancelled),
      waiting_(waiting) {}

TaskRun::~TaskRun() = default;

absl::StatusOr<std::vector<v1::ShardChecksum>> TaskRun::Run() {
  if (absl::Status s = SetUp(); !s.ok()) return s;
  if (absl::Status s = Prove(); !s.ok()) return s;
  if (absl::Status s = Move(); !s.ok()) return s;
  if (absl::Status s = Verify(); !s.ok()) return s;
  return Seal();
}

absl::Status TaskRun::SetUp() {
  const std::string& job = task_.job_id();
  if (cancelled_ && cancelled_()) return absl::CancelledError("task cancelled before it started");
  // Check the task and sort out this host's part before anything is made.
  absl::StatusOr<TaskPhase> phase = PhaseOf(task_);
  if (!phase.ok()) return phase.status();
  phase_ = *phase;
  // Records of prepares whose buffers are gone (aborted, deleted, sealed).
  ex_.precopies->Prune(*ex_.store);
  absl::StatusOr<HostSteps> prepared = PrepareHostSteps(ex_.store, host_id_, task_);
  if (!prepared.ok()) {
    RESHARD_LOG(WARNING) << "operation " << task_.operation_id() << " job " << job << " host "
                         << host_id_ << " rejected: " << prepared.status();
    return prepared.status();
  }
  hs_ = *std::move(prepared);
  if (phase_ == TaskPhase::kPrepared) LeaveFillsToThePrepare(task_.plan(), &hs_);
  if (!hs_.remotes.empty() && ex_.transport == nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat("operation ", task_.operation_id(), " has cross-host steps and no transport"));
  }

  // The sealed sources stay as sealed while the task reads them: a read lease
  // makes a truncate or an open for writing wait, and says so (Verify).
  absl::StatusOr<std::vector<SourceLease>> leases = LeaseSources(hs_);
  if (!leases.ok()) return leases.status();
  leases_ = *std::move(leases);

  // The new buffers of this host's new ranks, all or none. The spare pool
  // refills only once the task is over: the refill would take CPU from it.
  refill_pause_ = ex_.store->PauseSpareRefill();
  for (int r : hs_.new_ranks) new_keys_.push_back(RankBufferKey{job, task_.to_generation(), r});
  // The prepared phase writes into what its prepare left (task_phase.h).
  absl::StatusOr<std::vector<RankBufferPtr>> created =
      phase_ == TaskPhase::kPrepared ? OpenPreparedBuffers(ex_.store, task_, hs_)
                                     : CreateNewBuffers(ex_.store, new_keys_, hs_, task_);
  if (!created.ok()) return created.status();
  new_bufs_ = std::move(*created);
  // The prepared phase commits what its prepare wrote for the steps it
  // skips: only as recorded then (checked in Verify, precopy_check.h).
  if (phase_ == TaskPhase::kPrepared && !new_keys_.empty()) {
    precopy_ = ex_.precopies->Find(host_id_, task_.operation_id());
    if (precopy_ == nullptr || precopy_->job != job ||
        precopy_->generation != task_.to_generation() || precopy_->ranks != hs_.new_ranks) {
      return absl::FailedPreconditionError(absl::StrCat(
          "prepared buffers of job \"", job, "\" generation ", task_.to_generation(),
          ": this agent holds no record of what the prepare of operation ", task_.operation_id(),
          " wrote into them, so the pre-copy cannot be verified"));
    }
  }
  prefaulter_.emplace(phase_ == TaskPhase::kPrepared ? std::vector<RankBufferPtr>() : new_bufs_);

  // Tags derive from the operation's transfer secret: outsiders cannot
  // guess them (docs/security.md, "Agent-to-agent transfers"). Tags, proofs
  // and seals of a prepare derive from a context of its own (transfer_tags.h).
  tag_key_ = TaskTagKey(task_);
  context_ = TransferContext(task_);
  tag_base_ = TagBase(tag_key_);
  // Items zero-filled for their workers to regenerate: recorded with the buffers.
  if (absl::Status s = MarkRegenerated(*ex_.store, new_keys_, task_.plan().regenerate());
      !s.ok()) {
    return Fail(s);
  }
  return absl::OkStatus();
}

absl::Status TaskRun::Prove() {
  for (const auto& [peer, address] : hs_.send_peers) {
    if (absl::Status s = ex_.transport->Connect(peer, address); !s.ok()) return Fail(s);
  }
  // Every sender proves to every receiver that it belongs to the operation
  // before any receive of its data is posted.
  if (task_.transfer_secret().empty() || hs_.remotes.empty()) return absl::OkStatus();
  std::set<std::string> send_to, receive_from;
  for (const RemoteStep& r : hs_.remotes) (r.is_send ? send_to : receive_from).insert(r.peer);
  if (waiting_) {
    waiting_(absl::StrCat("transfer proofs (", receive_from.size(), " to receive, ",
                          send_to.size(), " to send)"));
  }
  absl::Status proven =
      ExchangePeerProofs(ex_.transport, task_.transfer_secret(), context_, host_id_,
                         ProofTag(tag_key_), send_to, receive_from,
                         cancelled_, std::chrono::milliseconds(ex_.options->proof_timeout_ms));
  if (!proven.ok()) return Fail(proven);
  return absl::OkStatus();
}

absl::Status TaskRun::Move() {
  last_report_ = Clock::now();
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
  std::vector<StepSeals::Step> seal_steps;
  for (size_t i = 0; i < hs_.remotes.size(); ++i) {
    const RemoteStep& r = hs_.remotes[i];
    const int item = r.step->item();
    seal_steps.push_back(StepSeals::Step{
        r.step->index(), r.is_send, r.peer, remote_chunks_[i].count(),
        absl::StrCat("item ", item, " (\"", task_.plan().items(item).name(), "\")")});
  }
  seals_ = std::make_unique<StepSeals>(ex_.transport, task_.transfer_secret(), context_,
                                       task_.job_id(), host_id_, tag_key_, std::move(seal_steps));
  seals_->PostReceives();
}

// Each item is checked as soon as its last access is over, while other
// transfers go on: a source item against its sealed checksum once every
// read of it finished (so the bytes read are the bytes sealed), a new item
// checksummed once every write to it landed (nothing writes it afterwards).
void TaskRun::StartItemChecks() {
  new_sums_.resize(new_keys_.size());
  for (size_t k = 0; k < new_keys_.size(); ++k) {
    new_sums_[k].assign(new_bufs_[k]->items().size(), 0);
  }
  for (const auto& [rank, buf] : hs_.old_bufs) sealed_of_[rank] = buf->checksums();
  checks_.emplace(CountItemAccesses(hs_, remote_chunks_),
                  [this](const ItemChecks::Key& key) { CheckItem(key); });
}

void TaskRun::CheckItem(const ItemChecks::Key& key) {
  const auto [kind, rank, item] = key;
  if (kind == kNewItem) {
    if (phase_ == TaskPhase::kPrepare) return;  // checksummed by the transfer phase
    const size_t k = hs_.new_index.at(rank);
    const ItemSlot& slot = new_bufs_[k]->items()[item];
    new_sums_[k][item] =
        Checksum(new_bufs_[k]->data() + slot.offset, static_cast<size_t>(slot.bytes));
    return;
  }
  absl::Status s =
      CheckSource(*hs_.old_bufs.at(rank), sealed_of_.at(rank), rank, item, task_.plan(), task_);
  if (s.ok()) return;
  std::lock_guard<std::mutex> l(source_mu_);
  source_errors_.emplace(std::make_pair(rank, item), std::move(s));
}

void TaskRun::ApplyZeroFills() {
  for (const v1::ZeroFill* f : hs_.fills) {
    const int64_t eb = ElementBytes(f->item());
    std::memset(NewBuf(f->rank())->item_data(f->item()) + f->offset() * eb, 0, f->count() * eb);
    done_ += f->count() * eb;
    checks_->Done({kNewItem, f->rank(), f->item()});
  }
}

// Hands chunk `c` to the transport.
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
  TransferDone cb = [state = completions_, seq, keep = std::move(keep),
                     buf = f.staging](absl::Status s) {
    std::lock_guard<std::mutex> l(state->mu);
    state->done.emplace_back(seq, std::move(s));
    state->cv.notify_one();
  };
  const int64_t bytes = f.bytes;
  f.data = static_cast<const uint8_t*>(data);
  inflight_.emplace(seq, std::move(f));
  if (r.is_send) {
    ex_.transport->Send(r.peer, tag, data, bytes, std::move(cb));
    // While the transport moves them: the bytes stay as they are until the
    // completion (a sealed source, or staging the callback holds).
    if (seals_) seals_->AddChunk(c.step, c.chunk, data, static_cast<size_t>(bytes));
  } else {
    ex_.transport->Receive(tag, data, bytes, std::move(cb));
  }
}

// Waits up to kProgressInterval for completions when no local copy is left
// to do, then handles every one reported; the first failure names its step.
absl::Status TaskRun::HandleCompletions() {
  std::deque<std::pair<uint64_t, absl::Status>> batch;
  {
    std::unique_lock<std::mutex> l(completions_->mu);
    if (completions_->done.empty() && !LocalsLeft()) {
      completions_->cv.wait_for(l, kProgressInterval);
    }
    batch.swap(completions_->done);
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
      // The bytes exactly as they arrived, before they are unpacked.
      if (seals_) seals_->AddChunk(f.remote, f.lane_chunk.chunk, f.data, f.bytes);
      if (f.staging) {
        ex_.copier->Unpack(f.staging->bytes.get(), DstViews(*r.step, f.start), f.shape,
                           ElementBytes(r.step->item()));
      }
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
    ex_.copier->Copy(SrcView(step, start), DstViews(step, start), shape, eb);
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

void TaskRun::Report(bool force) {
  const auto now = Clock::now();
  if (!force && now - last_report_ < kProgressInterval) return;
  last_report_ = now;
  if (progress_) progress_(done_, hs_.total_bytes);
  if (waiting_ && transfer_started_) {
    std::string what = DescribeWait();
    if (what != waiting_on_) waiting_(waiting_on_ = std::move(what));
  }
}

std::string TaskRun::DescribeWait() const {
  const InFlight* first = nullptr;
  uint64_t first_seq = 0;
  for (const auto& [seq, f] : inflight_) {
    if (first == nullptr || seq < first_seq) first = &f, first_seq = seq;
  }
  if (first == nullptr) return LocalsLeft() ? "local copies" : "";
  const RemoteStep& r = hs_.remotes[first->remote];
  return absl::StrCat("step ", r.step->index(), " (", r.is_send ? "send to" : "receive from",
                      " host \"", r.peer, "\")");
}

absl::Status TaskRun::Verify() {
  // The sources must still be what was sealed: a process that wrote them
  // (through a mapping opened before the seal, or as root) fails the task
  // rather than the job committing bytes that were never sealed.
  if (absl::Status s = CheckLeases(leases_, task_); !s.ok()) return Fail(s);
  checks_->Finish();
  if (!source_errors_.empty()) return Fail(source_errors_.begin()->second);
  // Every source read is verified: seal what was sent, and check what was
  // received against its senders' seals before anything is reported DONE.
  if (seals_) {
    if (waiting_) waiting_(waiting_on_ = "step seals");
    seals_->SendSeals();
    if (absl::Status s =
            seals_->Finish(cancelled_, std::chrono::milliseconds(ex_.options->seal_timeout_ms));
        !s.ok()) {
      return Fail(s);
    }
  }
  // What the prepare wrote and the cut-over did not write again must read
  // back as the prepare wrote it (precopy_check.h).
  if (precopy_ != nullptr) {
    if (waiting_) waiting_(waiting_on_ = "pre-copy check");
    std::set<int64_t> rewritten;
    for (const v1::CopyStep& s : task_.plan().steps()) rewritten.insert(s.index());
    if (absl::Status s = VerifyPrecopy(precopy_->regions, rewritten,
                                       [this](int rank) { return NewBuf(rank); }, task_.plan(),
                                       task_.job_id(), task_.to_generation(),
                                       ex_.options->copy_threads);
        !s.ok()) {
      return Fail(s);
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<v1::ShardChecksum>> TaskRun::Seal() {
  // A prepare leaves its buffers unsealed for the transfer phase and reports
  // what it read instead, having recorded what it wrote.
  if (phase_ == TaskPhase::kPrepare) {
    if (!new_keys_.empty()) {
      PrecopyRecords::Record record{task_.job_id(), task_.to_generation(), hs_.new_ranks,
                                    PrecopyRegions(task_.plan(), hs_)};
      ChecksumRegions([this](int rank) { return NewBuf(rank); }, ex_.options->copy_threads,
                      &record.regions);
      ex_.precopies->Put(host_id_, task_.operation_id(), std::move(record));
    }
    RESHARD_LOG(INFO) << "operation " << task_.operation_id() << " job " << task_.job_id()
                      << " host " << host_id_ << ": prepared " << new_keys_.size()
                      << " rank buffers of generation " << task_.to_generation() << " (" << done_
                      << " bytes)";
    return SourceChecksums(hs_);
  }
  // The checksums of the bytes written, recorded durably; ranks in parallel.
  std::vector<absl::StatusOr<std::vector<uint64_t>>> sums(new_keys_.size(),
                                                          absl::UnknownError("not sealed"));
  ParallelFor(new_keys_.size(), ex_.options->copy_threads,
              [&](size_t k) { sums[k] = ex_.store->SealWritten(new_keys_[k], new_sums_[k]); });
  std::vector<v1::ShardChecksum> out;
  for (size_t k = 0; k < new_keys_.size(); ++k) {
    if (!sums[k].ok()) return Fail(sums[k].status());
    const auto& items = new_bufs_[k]->items();
    for (size_t item = 0; item < items.size() && item < sums[k]->size(); ++item) {
      if (items[item].bytes == 0) continue;
      v1::ShardChecksum c;
      c.set_item(static_cast<int>(item));
      c.set_rank(new_keys_[k].rank);
      c.set_checksum((*sums[k])[item]);
      c.set_bytes(items[item].bytes);
      out.push_back(std::move(c));
    }
  }
  if (precopy_ != nullptr) ex_.precopies->Erase(host_id_, task_.operation_id());
  return out;
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

int TaskRun::ElementBytes(int item) const { return task_.plan().items(item).element_bytes(); }

RankBuffer* TaskRun::NewBuf(int rank) { return new_bufs_[hs_.new_index[rank]].get(); }

absl::Status TaskRun::Fail(absl::Status s) {
  if (prefaulter_) prefaulter_->Stop();
  // Cancel once: in-flight chunks, and seal receives that may be pending
  // (their buffers are the seals' own).
  if (ex_.transport != nullptr && (seals_ != nullptr || !inflight_.empty())) {
    ex_.transport->CancelTags(tag_base_, kTagKeyMask);
  }
  if (ex_.transport != nullptr && !inflight_.empty()) {
    const auto deadline = Clock::now() + kCancelGrace;
    std::unique_lock<std::mutex> l(completions_->mu);
    while (!inflight_.empty()) {
      if (completions_->done.empty() &&
          completions_->cv.wait_until(l, deadline) == std::cv_status::timeout) {
        break;
      }
      while (!completions_->done.empty()) {
        inflight_.erase(completions_->done.front().first);
        completions_->done.pop_front();
      }
    }
  }
  for (const auto& key : new_keys_) ex_.store->Drop(key);
  RESHARD_LOG(WARNING) << "operation " << task_.operation_id() << " job " << task_.job_id()
                       << " host " << host_id_ << " failed: " << s;
  return s;
}

}  // namespace reshard::agent
