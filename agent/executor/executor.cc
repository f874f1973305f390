#include "agent/executor/executor.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <thread>
#include <unordered_map>

#include "absl/strings/str_cat.h"
#include "agent/executor/host_steps.h"
#include "agent/executor/item_checks.h"
#include "agent/executor/peer_proof.h"
#include "agent/executor/precopy_check.h"
#include "agent/executor/step_seal.h"
#include "agent/executor/task_phase.h"
#include "agent/executor/transfer_lanes.h"
#include "agent/transfer/local_copy.h"
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

// Completions reported by transport callbacks; shared with them so a late
// callback after Execute returned touches nothing freed.
struct Completions {
  std::mutex mu;
  std::condition_variable cv;
  std::deque<std::pair<uint64_t, absl::Status>> done;  // (transfer sequence number, status)
};

// A staging buffer for a chunk that is not contiguous at one end. Left
// uninitialised: Pack or the receive overwrites every byte used.
struct Staging {
  explicit Staging(int64_t n) : bytes(new uint8_t[n]), capacity(n) {}
  std::unique_ptr<uint8_t[]> bytes;
  int64_t capacity;
};
using StagingPtr = std::shared_ptr<Staging>;

// Reused staging buffers: fresh memory costs a page fault per 4 KiB.
class StagingPool {
 public:
  explicit StagingPool(int64_t chunk_bytes) : chunk_bytes_(chunk_bytes) {}
  StagingPtr Take(int64_t bytes) {
    for (size_t i = 0; i < free_.size(); ++i) {
      if (free_[i]->capacity >= bytes) {
        StagingPtr s = std::move(free_[i]);
        free_.erase(free_.begin() + static_cast<std::ptrdiff_t>(i));
        return s;
      }
    }
    return std::make_shared<Staging>(std::max(bytes, chunk_bytes_));
  }
  void Give(StagingPtr s) {
    if (s) free_.push_back(std::move(s));
  }

 private:
  int64_t chunk_bytes_;
  std::vector<StagingPtr> free_;
};

// Maps the pages of new buffers in the background, in the order they are
// laid out (which is roughly the order receives and copies fill them), a
// slice at a time so that Stop() returns soon. Failures are ignored: the
// pages are reserved, and a write maps its page anyway.
class Prefaulter {
 public:
  explicit Prefaulter(const std::vector<RankBufferPtr>& buffers)
      : thread_([this, buffers] {
          constexpr int64_t kSlice = int64_t{16} << 20;
          for (const RankBufferPtr& b : buffers) {
            for (int64_t at = 0; at < b->size() && !stop_.load(); at += kSlice) {
              (void)PrefaultPages(b->data() + at, std::min(kSlice, b->size() - at));
            }
          }
        }) {}
  ~Prefaulter() { Stop(); }
  void Stop() {
    stop_ = true;
    if (thread_.joinable()) thread_.join();
  }

 private:
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

// One chunk handed to the transport.
struct InFlight {
  TransferLanes::Chunk lane_chunk;
  size_t remote = 0;
  int64_t bytes = 0;
  std::vector<int64_t> start, shape;  // the chunk within its step
  StagingPtr staging;                 // null when the transfer is in place
  const uint8_t* data = nullptr;      // the bytes sent or received
};

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

// A read lease on one sealed source buffer for the whole task.
struct SourceLease {
  int rank = 0;
  std::unique_ptr<ReadLease> lease;
};

std::string DescribeSource(const v1::HostTask& task, int rank) {
  return absl::StrCat("sealed source of job \"", task.job_id(), "\" generation ",
                      task.from_generation(), " rank ", rank);
}

absl::StatusOr<std::vector<SourceLease>> LeaseSources(const HostSteps& hs) {
  std::vector<SourceLease> out;
  for (const auto& [rank, buf] : hs.old_bufs) {
    absl::StatusOr<std::unique_ptr<ReadLease>> l = buf->LeaseForReading();
    if (!l.ok()) return l.status();
    out.push_back(SourceLease{rank, *std::move(l)});
  }
  return out;
}

absl::Status CheckLeases(const std::vector<SourceLease>& leases, const v1::HostTask& task) {
  for (const SourceLease& l : leases) {
    if (l.lease->Broken()) {
      return absl::DataLossError(absl::StrCat(
          DescribeSource(task, l.rank),
          ": another process tried to truncate it or open it for writing while the task read it"));
    }
  }
  return absl::OkStatus();
}

// What ItemChecks checks: an item of an old (source) rank buffer against its
// sealed checksum, or an item of a new rank buffer to checksum.
enum ItemKind : int { kSourceItem = 0, kNewItem = 1 };

// How many accesses each item has in `hs` (chunks of `remote_chunks`, one per
// local step and zero fill; every new item, accessed or not).
std::map<ItemChecks::Key, int64_t> CountAccesses(const HostSteps& hs,
                                                 const std::vector<StepChunks>& remote_chunks) {
  std::map<ItemChecks::Key, int64_t> n;
  for (size_t k = 0; k < hs.new_ranks.size(); ++k) {
    for (size_t item = 0; item < hs.new_item_bytes[k].size(); ++item) {
      n[{kNewItem, hs.new_ranks[k], static_cast<int>(item)}] += 0;
    }
  }
  for (const v1::ZeroFill* f : hs.fills) ++n[{kNewItem, f->rank(), f->item()}];
  for (const v1::CopyStep* step : hs.locals) {
    ++n[{kSourceItem, step->src_rank(), step->item()}];
    for (const auto& d : step->dsts()) ++n[{kNewItem, d.rank(), step->item()}];
  }
  for (size_t i = 0; i < hs.remotes.size(); ++i) {
    const v1::CopyStep& step = *hs.remotes[i].step;
    const int64_t chunks = remote_chunks[i].count();
    if (hs.remotes[i].is_send) {
      n[{kSourceItem, step.src_rank(), step.item()}] += chunks;
    } else {
      for (const auto& d : step.dsts()) n[{kNewItem, d.rank(), step.item()}] += chunks;
    }
  }
  return n;
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

TaskExecutor::TaskExecutor(ShardStore* store, Transport* transport, Options options)
    : store_(store),
      transport_(transport),
      options_(options),
      copier_(std::make_unique<LocalCopier>(options.copy_threads)),
      precopies_(std::make_unique<PrecopyRecords>()) {
  RESHARD_CHECK(options_.chunk_bytes > 0) << "chunk_bytes " << options_.chunk_bytes;
  RESHARD_CHECK(options_.local_chunk_bytes > 0)
      << "local_chunk_bytes " << options_.local_chunk_bytes;
  RESHARD_CHECK(options_.peer_window_bytes > 0)
      << "peer_window_bytes " << options_.peer_window_bytes;
  RESHARD_CHECK(options_.max_inflight_bytes > 0)
      << "max_inflight_bytes " << options_.max_inflight_bytes;
}

TaskExecutor::~TaskExecutor() = default;

absl::StatusOr<std::vector<v1::ShardChecksum>> TaskExecutor::Execute(
    const std::string& host_id, const v1::HostTask& task,
    const std::function<void(int64_t done, int64_t total)>& progress,
    const std::function<bool()>& cancelled,
    const std::function<void(const std::string& what)>& waiting) {
  const v1::TransferPlan& plan = task.plan();
  const std::string& job = task.job_id();
  if (cancelled && cancelled()) return absl::CancelledError("task cancelled before it started");
  // 1. Check the task and sort out this host's part before anything is made.
  absl::StatusOr<TaskPhase> phase_or = PhaseOf(task);
  if (!phase_or.ok()) return phase_or.status();
  const TaskPhase phase = *phase_or;
  // Records of prepares whose buffers are gone (aborted, deleted, sealed).
  precopies_->Prune(*store_);
  absl::StatusOr<HostSteps> prepared = PrepareHostSteps(store_, host_id, task);
  if (!prepared.ok()) {
    RESHARD_LOG(WARNING) << "operation " << task.operation_id() << " job " << job << " host "
                         << host_id << " rejected: " << prepared.status();
    return prepared.status();
  }
  HostSteps& hs = *prepared;
  if (phase == TaskPhase::kPrepared) LeaveFillsToThePrepare(plan, &hs);
  if (!hs.remotes.empty() && transport_ == nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat("operation ", task.operation_id(), " has cross-host steps and no transport"));
  }

  // The sealed sources stay as sealed while the task reads them: a read lease
  // makes a truncate or an open for writing wait, and says so (checked below).
  absl::StatusOr<std::vector<SourceLease>> leases = LeaseSources(hs);
  if (!leases.ok()) return leases.status();

  // 2. The new buffers of this host's new ranks, all or none. The spare pool
  // refills only once the task is over: the refill would take CPU from it.
  const std::shared_ptr<void> refill_pause = store_->PauseSpareRefill();
  std::vector<RankBufferKey> new_keys;
  for (int r : hs.new_ranks) new_keys.push_back(RankBufferKey{job, task.to_generation(), r});
  // The prepared phase writes into what its prepare left (task_phase.h).
  absl::StatusOr<std::vector<RankBufferPtr>> created =
      phase == TaskPhase::kPrepared ? OpenPreparedBuffers(store_, task, hs)
                                    : CreateNewBuffers(store_, new_keys, hs, task);
  if (!created.ok()) return created.status();
  std::vector<RankBufferPtr> new_bufs = std::move(*created);
  // The prepared phase commits what its prepare wrote for the steps it
  // skips: only as recorded then (checked below, precopy_check.h).
  PrecopyRecords::RecordPtr precopy;
  if (phase == TaskPhase::kPrepared && !new_keys.empty()) {
    precopy = precopies_->Find(host_id, task.operation_id());
    if (precopy == nullptr || precopy->job != job ||
        precopy->generation != task.to_generation() || precopy->ranks != hs.new_ranks) {
      return absl::FailedPreconditionError(absl::StrCat(
          "prepared buffers of job \"", job, "\" generation ", task.to_generation(),
          ": this agent holds no record of what the prepare of operation ", task.operation_id(),
          " wrote into them, so the pre-copy cannot be verified"));
    }
  }
  Prefaulter prefaulter(phase == TaskPhase::kPrepared ? std::vector<RankBufferPtr>() : new_bufs);

  // Tags derive from the operation's transfer secret: outsiders cannot
  // guess them (docs/security.md, "Agent-to-agent transfers"). Tags, proofs
  // and seals of a prepare derive from a context of its own (task_phase.h).
  const uint32_t tag_key = TaskTagKey(task);
  const std::string context = TransferContext(task);
  const uint64_t tag_base = TransferTag(tag_key, 0, 0).value();
  auto completions = std::make_shared<Completions>();
  std::unordered_map<uint64_t, InFlight> inflight;  // by sequence number
  // With a transfer secret: every cross-host step's bytes are sealed by its
  // sender and checked by its receiver (step_seal.h).
  std::unique_ptr<StepSeals> seals;
  auto fail = [&](absl::Status s) -> absl::Status {
    prefaulter.Stop();
    // Cancel once: in-flight chunks, and seal receives that may be pending
    // (their buffers are the seals' own).
    if (transport_ != nullptr && (seals != nullptr || !inflight.empty())) {
      transport_->CancelTags(tag_base, kTagKeyMask);
    }
    if (transport_ != nullptr && !inflight.empty()) {
      const auto deadline = Clock::now() + kCancelGrace;
      std::unique_lock<std::mutex> l(completions->mu);
      while (!inflight.empty()) {
        if (completions->done.empty() &&
            completions->cv.wait_until(l, deadline) == std::cv_status::timeout) {
          break;
        }
        while (!completions->done.empty()) {
          inflight.erase(completions->done.front().first);
          completions->done.pop_front();
        }
      }
    }
    for (const auto& key : new_keys) store_->Drop(key);
    RESHARD_LOG(WARNING) << "operation " << task.operation_id() << " job " << job << " host "
                         << host_id << " failed: " << s;
    return s;
  };
  // Items zero-filled for their workers to regenerate: recorded with the buffers.
  if (absl::Status s = MarkRegenerated(*store_, new_keys, plan.regenerate()); !s.ok()) {
    return fail(s);
  }
  for (const auto& [peer, address] : hs.send_peers) {
    if (absl::Status s = transport_->Connect(peer, address); !s.ok()) return fail(s);
  }
  // Every sender proves to every receiver that it belongs to the operation
  // before any receive of its data is posted.
  if (!task.transfer_secret().empty() && !hs.remotes.empty()) {
    std::set<std::string> send_to, receive_from;
    for (const RemoteStep& r : hs.remotes) (r.is_send ? send_to : receive_from).insert(r.peer);
    if (waiting) {
      waiting(absl::StrCat("transfer proofs (", receive_from.size(), " to receive, ",
                           send_to.size(), " to send)"));
    }
    absl::Status proven =
        ExchangePeerProofs(transport_, task.transfer_secret(), context, host_id,
                           TransferTag(tag_key, kProofStepIndex, 0).value(), send_to, receive_from,
                           cancelled, std::chrono::milliseconds(options_.proof_timeout_ms));
    if (!proven.ok()) return fail(proven);
  }

  auto element_bytes = [&](int item) { return plan.items(item).element_bytes(); };
  auto new_buf = [&](int rank) { return new_bufs[hs.new_index[rank]].get(); };
  // The destinations of `step` restricted to a chunk at `start`.
  auto dst_views = [&](const v1::CopyStep& step, const std::vector<int64_t>& start) {
    std::vector<MutableStridedView> v;
    for (const auto& d : step.dsts()) {
      std::vector<int64_t> strides = ToVector(d.region().strides());
      const int64_t offset = ChunkOffset(d.region().offset(), strides, start);
      v.push_back(MutableStridedView{new_buf(d.rank())->item_data(step.item()), offset,
                                     std::move(strides)});
    }
    return v;
  };
  auto src_view = [&](const v1::CopyStep& step, const std::vector<int64_t>& start) {
    std::vector<int64_t> strides = ToVector(step.src().strides());
    const int64_t offset = ChunkOffset(step.src().offset(), strides, start);
    return StridedView{hs.old_bufs[step.src_rank()]->item_data(step.item()), offset,
                       std::move(strides)};
  };

  // 3. Move bytes.
  int64_t done = 0;
  auto last_report = Clock::now();
  std::string waiting_on;
  std::function<std::string()> describe_wait;  // set once the transfer state exists
  auto report = [&](bool force) {
    const auto now = Clock::now();
    if (!force && now - last_report < kProgressInterval) return;
    last_report = now;
    if (progress) progress(done, hs.total_bytes);
    if (waiting && describe_wait) {
      std::string what = describe_wait();
      if (what != waiting_on) waiting(waiting_on = std::move(what));
    }
  };
  report(true);

  std::vector<StepChunks> remote_chunks;
  std::vector<TransferLanes::Step> lane_steps;
  for (const RemoteStep& r : hs.remotes) {
    remote_chunks.emplace_back(ToVector(r.step->shape()), element_bytes(r.step->item()),
                               options_.chunk_bytes);
    TransferLanes::Step ls{r.peer, r.is_send, {}};
    for (int64_t c = 0; c < remote_chunks.back().count(); ++c) {
      ls.chunk_bytes.push_back(remote_chunks.back().Bytes(c));
    }
    lane_steps.push_back(std::move(ls));
  }
  TransferLanes lanes(lane_steps, options_.peer_window_bytes, options_.max_inflight_bytes);
  const int64_t remote_chunk_total = lanes.chunk_count();
  if (!task.transfer_secret().empty() && !hs.remotes.empty()) {
    std::vector<StepSeals::Step> seal_steps;
    for (size_t i = 0; i < hs.remotes.size(); ++i) {
      const RemoteStep& r = hs.remotes[i];
      const int item = r.step->item();
      seal_steps.push_back(
          StepSeals::Step{r.step->index(), r.is_send, r.peer, remote_chunks[i].count(),
                          absl::StrCat("item ", item, " (\"", plan.items(item).name(), "\")")});
    }
    seals = std::make_unique<StepSeals>(transport_, task.transfer_secret(), context, job, host_id,
                                        tag_key, std::move(seal_steps));
    seals->PostReceives();
  }

  // Each item is checked as soon as its last access is over, while other
  // transfers go on: a source item against its sealed checksum once every
  // read of it finished (so the bytes read are the bytes sealed), a new item
  // checksummed once every write to it landed (nothing writes it afterwards).
  std::vector<std::vector<uint64_t>> new_sums(new_keys.size());
  for (size_t k = 0; k < new_keys.size(); ++k) new_sums[k].assign(new_bufs[k]->items().size(), 0);
  std::unordered_map<int, std::vector<uint64_t>> sealed_of;  // old rank -> sealed checksums
  for (const auto& [rank, buf] : hs.old_bufs) sealed_of[rank] = buf->checksums();
  std::mutex source_mu;
  std::map<std::pair<int, int>, absl::Status> source_errors;  // (old rank, item) -> DataLoss
  ItemChecks checks(CountAccesses(hs, remote_chunks), [&](const ItemChecks::Key& key) {
    const auto [kind, rank, item] = key;
    if (kind == kNewItem) {
      if (phase == TaskPhase::kPrepare) return;  // checksummed by the transfer phase
      const size_t k = hs.new_index.at(rank);
      const ItemSlot& slot = new_bufs[k]->items()[item];
      new_sums[k][item] =
          Checksum(new_bufs[k]->data() + slot.offset, static_cast<size_t>(slot.bytes));
      return;
    }
    absl::Status s = CheckSource(*hs.old_bufs.at(rank), sealed_of.at(rank), rank, item, plan, task);
    if (s.ok()) return;
    std::lock_guard<std::mutex> l(source_mu);
    source_errors.emplace(std::make_pair(rank, item), std::move(s));
  });
  for (const v1::ZeroFill* f : hs.fills) {
    const int64_t eb = element_bytes(f->item());
    std::memset(new_buf(f->rank())->item_data(f->item()) + f->offset() * eb, 0, f->count() * eb);
    done += f->count() * eb;
    checks.Done({kNewItem, f->rank(), f->item()});
  }
  StagingPool pool(options_.chunk_bytes);
  uint64_t next_seq = 0;
  int64_t finished = 0;   // remote chunks completed
  size_t next_local = 0;  // the next local piece: (next_local, next_local_chunk)
  int64_t next_local_chunk = 0;
  std::unique_ptr<StepChunks> local_chunks;

  // Hands chunk `c` to the transport.
  auto issue = [&](const TransferLanes::Chunk& c) {
    const RemoteStep& r = hs.remotes[c.step];
    const v1::CopyStep& step = *r.step;
    const StepChunks& chunks = remote_chunks[c.step];
    const int eb = element_bytes(step.item());
    InFlight f;
    f.lane_chunk = c;
    f.remote = c.step;
    f.bytes = c.bytes;
    chunks.Get(c.chunk, &f.start, &f.shape);
    // Checked in PrepareHostSteps (step index) and by StepChunks (chunk count).
    const uint64_t tag = TransferTag(tag_key, step.index(), c.chunk).value();
    // The callback holds what the transfer touches, so a late callback is safe.
    std::vector<RankBufferPtr> keep;
    void* data = nullptr;
    if (r.is_send) {
      keep.push_back(hs.old_bufs[step.src_rank()]);
      const StridedView src = src_view(step, f.start);
      if (IsContiguous(f.shape, src.strides)) {
        data = const_cast<uint8_t*>(src.base) + src.offset * eb;
      } else {
        f.staging = pool.Take(f.bytes);
        copier_->Pack(src, f.shape, eb, f.staging->bytes.get());
      }
    } else {
      for (const auto& d : step.dsts()) keep.push_back(new_bufs[hs.new_index[d.rank()]]);
      const auto& d0 = step.dsts(0);
      std::vector<int64_t> strides = ToVector(d0.region().strides());
      if (step.dsts_size() == 1 && IsContiguous(f.shape, strides)) {
        data = new_buf(d0.rank())->item_data(step.item()) +
               ChunkOffset(d0.region().offset(), strides, f.start) * eb;
      } else {
        f.staging = pool.Take(f.bytes);
      }
    }
    if (f.staging) data = f.staging->bytes.get();
    const uint64_t seq = next_seq++;
    TransferDone cb = [state = completions, seq, keep = std::move(keep),
                       buf = f.staging](absl::Status s) {
      std::lock_guard<std::mutex> l(state->mu);
      state->done.emplace_back(seq, std::move(s));
      state->cv.notify_one();
    };
    const int64_t bytes = f.bytes;
    f.data = static_cast<const uint8_t*>(data);
    inflight.emplace(seq, std::move(f));
    if (r.is_send) {
      transport_->Send(r.peer, tag, data, bytes, std::move(cb));
      // While the transport moves them: the bytes stay as they are until the
      // completion (a sealed source, or staging the callback holds).
      if (seals) seals->AddChunk(c.step, c.chunk, data, static_cast<size_t>(bytes));
    } else {
      transport_->Receive(tag, data, bytes, std::move(cb));
    }
  };
  auto locals_left = [&] { return next_local < hs.locals.size(); };
  describe_wait = [&]() -> std::string {
    const InFlight* first = nullptr;
    uint64_t first_seq = 0;
    for (const auto& [seq, f] : inflight) {
      if (first == nullptr || seq < first_seq) first = &f, first_seq = seq;
    }
    if (first == nullptr) return locals_left() ? "local copies" : "";
    const RemoteStep& r = hs.remotes[first->remote];
    return absl::StrCat("step ", r.step->index(), " (", r.is_send ? "send to" : "receive from",
                        " host \"", r.peer, "\")");
  };

  auto last_lease_check = Clock::now();
  while (locals_left() || finished < remote_chunk_total) {
    if (cancelled && cancelled()) {
      return fail(
          absl::CancelledError(absl::StrCat("operation ", task.operation_id(), " cancelled")));
    }
    if (Clock::now() - last_lease_check >= kProgressInterval) {
      last_lease_check = Clock::now();
      if (absl::Status s = CheckLeases(*leases, task); !s.ok()) return fail(s);
    }
    while (std::optional<TransferLanes::Chunk> c = lanes.Next()) issue(*c);
    // Completions first: they free window space for more transfers.
    std::deque<std::pair<uint64_t, absl::Status>> batch;
    {
      std::unique_lock<std::mutex> l(completions->mu);
      if (completions->done.empty() && !locals_left()) {
        completions->cv.wait_for(l, kProgressInterval);
      }
      batch.swap(completions->done);
    }
    absl::Status first_error;
    for (auto& [seq, status] : batch) {
      auto it = inflight.find(seq);
      RESHARD_CHECK(it != inflight.end());
      InFlight f = std::move(it->second);
      inflight.erase(it);
      ++finished;
      lanes.Done(f.lane_chunk);
      const RemoteStep& r = hs.remotes[f.remote];
      if (!status.ok() && first_error.ok()) {
        first_error = absl::Status(
            status.code(), absl::StrCat("step ", r.step->index(), " ",
                                        r.is_send ? "send to \"" + r.peer + "\"" : "receive", ": ",
                                        status.message()));
      }
      if (!first_error.ok()) continue;
      if (!r.is_send) {
        // The bytes exactly as they arrived, before they are unpacked.
        if (seals) seals->AddChunk(f.remote, f.lane_chunk.chunk, f.data, f.bytes);
        if (f.staging) {
          copier_->Unpack(f.staging->bytes.get(), dst_views(*r.step, f.start), f.shape,
                          element_bytes(r.step->item()));
        }
        done += f.bytes * r.step->dsts_size();
        for (const auto& d : r.step->dsts()) checks.Done({kNewItem, d.rank(), r.step->item()});
      } else {
        checks.Done({kSourceItem, r.step->src_rank(), r.step->item()});
      }
      pool.Give(std::move(f.staging));
    }
    if (!first_error.ok()) return fail(first_error);
    if (locals_left()) {
      const v1::CopyStep& step = *hs.locals[next_local];
      const int eb = element_bytes(step.item());
      if (!local_chunks) {
        local_chunks =
            std::make_unique<StepChunks>(ToVector(step.shape()), eb, options_.local_chunk_bytes);
      }
      if (local_chunks->count() > 0) {
        std::vector<int64_t> start, shape;
        local_chunks->Get(next_local_chunk, &start, &shape);
        copier_->Copy(src_view(step, start), dst_views(step, start), shape, eb);
        done += local_chunks->Bytes(next_local_chunk) * step.dsts_size();
      }
      if (++next_local_chunk >= local_chunks->count()) {
        checks.Done({kSourceItem, step.src_rank(), step.item()});
        for (const auto& d : step.dsts()) checks.Done({kNewItem, d.rank(), step.item()});
        ++next_local;
        next_local_chunk = 0;
        local_chunks.reset();
      }
    }
    report(false);
  }
  report(true);
  prefaulter.Stop();
  // The sources must still be what was sealed: a process that wrote them
  // (through a mapping opened before the seal, or as root) fails the task
  // rather than the job committing bytes that were never sealed.
  if (absl::Status s = CheckLeases(*leases, task); !s.ok()) return fail(s);
  checks.Finish();
  if (!source_errors.empty()) return fail(source_errors.begin()->second);
  // Every source read is verified: seal what was sent, and check what was
  // received against its senders' seals before anything is reported DONE.
  if (seals) {
    if (waiting) waiting(waiting_on = "step seals");
    seals->SendSeals();
    if (absl::Status s =
            seals->Finish(cancelled, std::chrono::milliseconds(options_.seal_timeout_ms));
        !s.ok()) {
      return fail(s);
    }
  }

  auto buffer_of = [&](int rank) { return new_buf(rank); };
  // What the prepare wrote and the cut-over did not write again must read
  // back as the prepare wrote it (precopy_check.h).
  if (precopy != nullptr) {
    if (waiting) waiting(waiting_on = "pre-copy check");
    std::set<int64_t> rewritten;
    for (const v1::CopyStep& s : plan.steps()) rewritten.insert(s.index());
    if (absl::Status s = VerifyPrecopy(precopy->regions, rewritten, buffer_of, plan, job,
                                       task.to_generation(), options_.copy_threads);
        !s.ok()) {
      return fail(s);
    }
  }
  // A prepare leaves its buffers unsealed for the transfer phase and reports
  // what it read instead, having recorded what it wrote.
  if (phase == TaskPhase::kPrepare) {
    if (!new_keys.empty()) {
      PrecopyRecords::Record record{job, task.to_generation(), hs.new_ranks,
                                    PrecopyRegions(plan, hs)};
      ChecksumRegions(buffer_of, options_.copy_threads, &record.regions);
      precopies_->Put(host_id, task.operation_id(), std::move(record));
    }
    RESHARD_LOG(INFO) << "operation " << task.operation_id() << " job " << job << " host "
                      << host_id << ": prepared " << new_keys.size()
                      << " rank buffers of generation " << task.to_generation() << " (" << done
                      << " bytes)";
    return SourceChecksums(hs);
  }
  // 4. The checksums of the bytes written, recorded durably; ranks in parallel.
  std::vector<absl::StatusOr<std::vector<uint64_t>>> sums(new_keys.size(),
                                                          absl::UnknownError("not sealed"));
  ParallelFor(new_keys.size(), options_.copy_threads,
              [&](size_t k) { sums[k] = store_->SealWritten(new_keys[k], new_sums[k]); });
  std::vector<v1::ShardChecksum> out;
  for (size_t k = 0; k < new_keys.size(); ++k) {
    if (!sums[k].ok()) return fail(sums[k].status());
    const auto& items = new_bufs[k]->items();
    for (size_t item = 0; item < items.size() && item < sums[k]->size(); ++item) {
      if (items[item].bytes == 0) continue;
      v1::ShardChecksum c;
      c.set_item(static_cast<int>(item));
      c.set_rank(new_keys[k].rank);
      c.set_checksum((*sums[k])[item]);
      c.set_bytes(items[item].bytes);
      out.push_back(std::move(c));
    }
  }
  if (precopy != nullptr) precopies_->Erase(host_id, task.operation_id());
  return out;
}

}  // namespace reshard::agent
