#include "agent/executor/task_run.h"

#include <algorithm>
#include <set>
#include <thread>

#include "absl/strings/str_cat.h"
#include "agent/executor/transfer_tags.h"
#include "common/log.h"

namespace reshard::agent {
namespace {

using Clock = std::chrono::steady_clock;
// How long a failed task waits for the transport to give back the buffers of
// transfers it cancelled (they stay alive through shared pointers anyway).
constexpr auto kCancelGrace = std::chrono::seconds(10);

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

// The new buffers of this host's new ranks, all or none. Executing a task
// is idempotent: buffers of an earlier attempt of this generation (an agent
// that died, or a task run again) are discarded first. Pages are reserved
// now (a full shm_dir fails here; those of spare files, or of a buffer
// dropped a moment ago, exist already) and
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
  // Every item byte is written by the plan's steps (moves and zero fills),
  // so pages of a dropped buffer will do; items left for workers to
  // regenerate must read zero.
  const ShardStore::Backing backing = task.plan().regenerate_size() == 0
                                          ? ShardStore::Backing::kOverwritten
                                          : ShardStore::Backing::kReserved;
  return store->CreateAll(keys, hs.new_item_bytes, backing);
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
      waiting_(waiting),
      on_devices_(executor.devices != nullptr && executor.route != nullptr) {}

TaskRun::~TaskRun() = default;

absl::StatusOr<std::vector<v1::ShardChecksum>> TaskRun::Run() {
  // Each phase's seconds, for the coordinator's cost model (TaskTimings).
  v1::TaskTimings unused;
  v1::TaskTimings* t = ex_.timings != nullptr ? ex_.timings : &unused;
  auto mark = std::chrono::steady_clock::now();
  auto lap = [&mark] {
    const auto now = std::chrono::steady_clock::now();
    const double s = std::chrono::duration<double>(now - mark).count();
    mark = now;
    return s;
  };
  if (absl::Status s = SetUp(); !s.ok()) return s;
  t->set_setup_seconds(lap());
  if (absl::Status s = Prove(); !s.ok()) return s;
  t->set_prove_seconds(lap());
  if (absl::Status s = Move(); !s.ok()) return s;
  t->set_move_seconds(lap());
  if (absl::Status s = Verify(); !s.ok()) return s;
  t->set_verify_seconds(lap());
  absl::StatusOr<std::vector<v1::ShardChecksum>> sealed = Seal();
  t->set_seal_seconds(lap());
  return sealed;
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
  // A device route finds its sources in host or device memory.
  std::unique_ptr<ShardStore> both =
      on_devices_ ? SourcesOfBothKindsIn(*ex_.store, *ex_.devices) : nullptr;
  absl::StatusOr<HostSteps> prepared =
      PrepareHostSteps(both != nullptr ? both.get() : ex_.store, host_id_, task_);
  if (!prepared.ok()) {
    RESHARD_LOG(WARNING) << "operation " << task_.operation_id() << " job " << job << " host "
                         << host_id_ << " rejected: " << prepared.status();
    return prepared.status();
  }
  hs_ = *std::move(prepared);
  if (phase_ == TaskPhase::kPrepared) LeaveFillsToThePrepare(task_.plan(), &hs_);
  if (absl::Status s = PickMover(); !s.ok()) return s;

  // The sealed sources stay as sealed while the task reads them: a read lease
  // makes a truncate or an open for writing wait, and says so (Verify).
  // Device sources are sealed device buffers, which the device store never
  // writes again: only host sources are leased.
  HostSteps host_sources;
  if (on_devices_) {
    for (const auto& [rank, b] : hs_.old_bufs) {
      if (DeviceSourceOf(*b) == nullptr) host_sources.old_bufs.emplace(rank, b);
    }
  }
  absl::StatusOr<std::vector<SourceLease>> leases = LeaseSources(on_devices_ ? host_sources : hs_);
  if (!leases.ok()) return leases.status();
  leases_ = *std::move(leases);

  if (absl::Status s = MakeNewBuffers(); !s.ok()) return s;

  // Tags derive from the operation's transfer secret: outsiders cannot
  // guess them (docs/security.md, "Agent-to-agent transfers"). Tags, proofs
  // and seals of a prepare derive from a context of its own (transfer_tags.h).
  tag_key_ = TaskTagKey(task_);
  tag_base_ = TagBase(tag_key_);
  // Items zero-filled for their workers to regenerate: recorded with the
  // buffers (a device route has none here: RouteTask).
  if (on_devices_) return absl::OkStatus();
  if (absl::Status s = MarkRegenerated(*ex_.store, new_keys_, task_.plan().regenerate()); !s.ok()) {
    return Fail(s);
  }
  return absl::OkStatus();
}

// Cross-host steps move host memory at both ends over the transport, or, on
// a device route, device memory at both ends through the route's mover.
absl::Status TaskRun::PickMover() {
  if (ex_.transport != nullptr) ucx_mover_ = std::make_unique<UcxHostMover>(ex_.transport);
  std::vector<Mover*> movers = ex_.movers;
  if (ucx_mover_ != nullptr) movers.push_back(ucx_mover_.get());
  const MemoryKind kind = on_devices_ ? MemoryKind::kCuda : MemoryKind::kHost;
  mover_ = MoverFor(movers, kind, kind);
  if (hs_.remotes.empty() || mover_ != nullptr) return absl::OkStatus();
  if (on_devices_) {
    return absl::InternalError(
        absl::StrCat("operation ", task_.operation_id(), ": the device path got cross-host steps"));
  }
  return absl::FailedPreconditionError(
      absl::StrCat("operation ", task_.operation_id(), " has cross-host steps and no transport"));
}

// The new buffers of this host's new ranks, all or none: on a device route
// on their devices (the device store's ResourceExhausted when they do not
// fit), else in the host store.
absl::Status TaskRun::MakeNewBuffers() {
  const std::string& job = task_.job_id();
  if (on_devices_) {
    absl::StatusOr<std::vector<DeviceRankBufferPtr>> made = MakeNewDeviceBuffers(
        *ex_.store, *ex_.devices, task_, hs_, ex_.route->device_of, &new_keys_);
    if (!made.ok()) return made.status();
    new_device_bufs_ = *std::move(made);
    return absl::OkStatus();
  }
  // The spare pool refills only once the task is over: the refill would
  // take CPU from it.
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
  return absl::OkStatus();
}

// The run owns its connections (the session no longer connects the peers
// first): the mover reaches them, then the proofs go (mover.h).
absl::Status TaskRun::Prove() {
  // A device route's mover moves its cross-host steps only: without them
  // it has no peer to reach.
  if (on_devices_ && hs_.remotes.empty()) return absl::OkStatus();
  absl::Status s = PreparePeersAndProve(mover_, ex_.transport, *ex_.options, host_id_, task_,
                                        hs_.remotes, cancelled_, waiting_);
  if (!s.ok()) return Fail(s);
  return absl::OkStatus();
}

absl::Status TaskRun::Verify() {
  // The sources must still be what was sealed: a process that wrote them
  // (through a mapping opened before the seal, or as root) fails the task
  // rather than the job committing bytes that were never sealed.
  if (absl::Status s = CheckLeases(leases_, task_); !s.ok()) return Fail(s);
  // A device route reads no item on the host (the communicator's mover
  // finishes its own step seals), and is never a prepared phase.
  if (on_devices_) return absl::OkStatus();
  checks_->Finish();
  if (!source_errors_.empty()) return Fail(source_errors_.begin()->second);
  size_t hashed = 0, cold = 0;
  for (const auto& [key, cursor] : cursors_) {
    hashed += cursor->cursor();
    cold += cursor->cold_bytes();
  }
  RESHARD_LOG(INFO) << "operation " << task_.operation_id() << " host " << host_id_
                    << ": item checksums took " << (hashed - cold) << " bytes as they passed, "
                    << cold << " from the buffers";
  // Every source read is verified: seal what was sent, and check what was
  // received against its senders' seals before anything is reported DONE.
  if (seals_) {
    waiting_on_ = "step seals";
    if (absl::Status s = FinishStepSeals(*seals_, *ex_.options, cancelled_, waiting_); !s.ok()) {
      return Fail(s);
    }
  }
  // What the prepare wrote and the cut-over did not write again must read
  // back as the prepare wrote it (precopy_check.h).
  if (precopy_ != nullptr) {
    if (waiting_) waiting_(waiting_on_ = "pre-copy check");
    std::set<int64_t> rewritten;
    for (const v1::CopyStep& s : task_.plan().steps()) rewritten.insert(s.index());
    if (absl::Status s = VerifyPrecopy(
            precopy_->regions, rewritten, [this](int rank) { return NewBuf(rank); }, task_.plan(),
            task_.job_id(), task_.to_generation(), ex_.options->copy_threads);
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
  // The checksums of the bytes written, recorded durably; ranks in
  // parallel. A device route's by the device store, rank by rank.
  std::vector<absl::StatusOr<std::vector<uint64_t>>> sums(new_keys_.size(),
                                                          absl::UnknownError("not sealed"));
  if (on_devices_) {
    for (size_t k = 0; k < new_keys_.size(); ++k) {
      if (cancelled_ && cancelled_()) return Fail(absl::CancelledError("task cancelled"));
      sums[k] = ex_.devices->Seal(new_keys_[k], {});
      if (!sums[k].ok()) break;
    }
  } else {
    ParallelFor(new_keys_.size(), ex_.options->copy_threads,
                [&](size_t k) { sums[k] = ex_.store->SealWritten(new_keys_[k], new_sums_[k]); });
  }
  std::vector<v1::ShardChecksum> out;
  for (size_t k = 0; k < new_keys_.size(); ++k) {
    if (!sums[k].ok()) return Fail(sums[k].status());
    const auto& items = on_devices_ ? new_device_bufs_[k]->items() : new_bufs_[k]->items();
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
  if (!on_devices_) return out;
  if (!ex_.route->on_device) {
    // The placement keeps this host's new buffers in host memory.
    if (absl::Status s = StageNewBuffersToHost(*ex_.store, *ex_.devices, new_keys_); !s.ok()) {
      return Fail(s);
    }
  }
  RESHARD_LOG(INFO) << "operation " << task_.operation_id() << " job " << task_.job_id() << " host "
                    << host_id_ << ": wrote " << new_keys_.size()
                    << " device rank buffers of generation " << task_.to_generation() << " ("
                    << done_ << " bytes, " << RouteName(ex_.route->kind) << ")";
  return out;
}

int TaskRun::ElementBytes(int item) const { return task_.plan().items(item).element_bytes(); }

RankBuffer* TaskRun::NewBuf(int rank) { return new_bufs_[hs_.new_index[rank]].get(); }

absl::Status TaskRun::Fail(absl::Status s) {
  if (prefaulter_) prefaulter_->Stop();
  // Cancel once: in-flight chunks, and seal receives that may be pending
  // (their buffers are the seals' own).
  if (mover_ != nullptr && (seals_ != nullptr || !inflight_.empty())) {
    mover_->Cancel(tag_base_, kTagKeyMask);
  }
  if (mover_ != nullptr && !inflight_.empty()) {
    const auto deadline = Clock::now() + kCancelGrace;
    while (!inflight_.empty()) {
      std::deque<MoverCompletion> batch;
      mover_->Poll(deadline - Clock::now(), &batch);
      if (batch.empty() && Clock::now() >= deadline) break;
      for (const MoverCompletion& c : batch) inflight_.erase(c.first);
    }
  }
  // A device route's new buffers are device buffers (StageNewBuffersToHost
  // leaves no host copy behind when it fails).
  for (const auto& key : new_keys_) {
    if (on_devices_) {
      ex_.devices->Drop(key);
    } else {
      ex_.store->Drop(key);
    }
  }
  RESHARD_LOG(WARNING) << "operation " << task_.operation_id() << " job " << task_.job_id()
                       << " host " << host_id_ << " failed"
                       << (on_devices_ ? " on the device path" : "") << ": " << s;
  return s;
}

}  // namespace reshard::agent
