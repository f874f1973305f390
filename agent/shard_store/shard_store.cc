#include "agent/shard_store/shard_store.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <csignal>
#include <cstring>
#include <limits>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <thread>
#include <tuple>
#include <utility>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "agent/shard_store/rank_buffer_file.h"
#include "agent/shard_store/regroup.h"
#include "agent/shard_store/seal.h"
#include "agent/shard_store/sidecar.h"
#include "agent/shard_store/spare_pool.h"
#include "common/log.h"

namespace reshard::agent {
namespace {

using store_internal::Accounting;
using store_internal::Allocate;
using store_internal::ChecksumItems;
using store_internal::CompareChecksums;
using store_internal::Describe;
using store_internal::ErrnoStatus;
using store_internal::FileId;
using store_internal::HumanBytes;
using store_internal::IdOf;
using store_internal::kSealedMode;
using store_internal::kSealingSuffix;
using store_internal::kUnsealedMode;
using store_internal::MapAndClose;
using store_internal::MappedRankBuffer;
using store_internal::Populate;
using store_internal::Regroup;
using store_internal::RemapReadOnly;
using store_internal::SealedAgain;
using store_internal::SealPublished;
using store_internal::ZeroOutsideItems;
using store_internal::ZeroPages;

constexpr char kMetaSuffix[] = ".meta";
// CreateAll makes files in parallel from this many bytes in all.
constexpr int64_t kParallelCreateBytes = int64_t{64} << 20;
// Smaller buffers are made fresh (cheap) and leave the spares to larger ones.
constexpr int64_t kMinSpareUse = int64_t{4} << 20;

// A job id becomes part of a file name.
absl::Status CheckName(const std::string& what, const std::string& name) {
  if (name.find('/') != std::string::npos || name.find('\0') != std::string::npos) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, " \"", name, "\" may not contain '/' or NUL"));
  }
  return absl::OkStatus();
}

struct KeyLess {
  bool operator()(const RankBufferKey& a, const RankBufferKey& b) const {
    return std::tie(a.job_id, a.generation, a.rank) < std::tie(b.job_id, b.generation, b.rank);
  }
};

class ShmShardStore final : public ShardStore {
 public:
  explicit ShmShardStore(Options options)
      : options_(std::move(options)), accounting_(std::make_shared<Accounting>()) {}
  ~ShmShardStore() override { pool_.reset(); }

  // Removes the spare files a previous agent left and starts the pool
  // (after Scan: the buffers found take their room first).
  void StartPool() {
    SparePool::Options o;
    o.shm_dir = options_.shm_dir;
    o.host_id = options_.host_id;
    o.target_bytes = options_.spare_bytes;
    o.room = [this] { return options_.memory_limit_bytes - accounting_->used.load(); };
    o.keep_dropped_s = options_.keep_dropped_s;
    o.host_memory = options_.host_memory;
    pool_ = std::make_unique<SparePool>(std::move(o));
  }

  // Maps this host's buffers found in shm_dir; malformed ones are logged and
  // left alone.
  absl::Status Scan() {
    DIR* dir = ::opendir(options_.shm_dir.c_str());
    if (dir == nullptr) return ErrnoStatus("cannot open shm_dir", options_.shm_dir, errno);
    const std::string prefix = absl::StrCat("reshard-", options_.host_id, "-");
    std::vector<std::string> metas;
    while (const dirent* e = ::readdir(dir)) {
      const std::string name = e->d_name;
      if (absl::StartsWith(name, prefix) && absl::EndsWith(name, kMetaSuffix)) {
        metas.push_back(name);
      } else if (absl::StartsWith(name, prefix) &&
                 (absl::EndsWith(name, kSealingSuffix) || absl::EndsWith(name, ".meta.tmp"))) {
        // A copy a dead Seal left, or a sidecar a dead agent was writing (one
        // agent per shm_dir, as for spare files).
        ::unlink((options_.shm_dir + "/" + name).c_str());
      }
    }
    ::closedir(dir);
    for (const std::string& meta : metas) {
      absl::Status s = Load(options_.shm_dir + "/" + meta);
      if (!s.ok()) {
        RESHARD_LOG(WARNING) << "shard store: skipping \"" << options_.shm_dir << "/" << meta
                             << "\": " << s;
      }
    }
    if (accounting_->used > options_.memory_limit_bytes) {
      RESHARD_LOG(WARNING) << "shard store: buffers found in \"" << options_.shm_dir << "\" use "
                           << accounting_->used.load() << " bytes, over the limit of "
                           << options_.memory_limit_bytes;
    }
    return absl::OkStatus();
  }

  absl::StatusOr<std::vector<RankBufferPtr>> CreateAll(
      const std::vector<RankBufferKey>& keys, const std::vector<std::vector<int64_t>>& item_bytes,
      Backing backing, Writer writer) override {
    if (keys.size() != item_bytes.size()) {
      return absl::InvalidArgumentError(
          absl::StrCat(keys.size(), " keys but ", item_bytes.size(), " item size lists"));
    }
    std::vector<int64_t> sizes(keys.size());
    std::vector<std::vector<ItemSlot>> slots(keys.size());
    int64_t needed = 0;
    std::set<RankBufferKey, KeyLess> seen;
    for (size_t i = 0; i < keys.size(); ++i) {
      if (absl::Status s = CheckName("job id", keys[i].job_id); !s.ok()) return s;
      if (!seen.insert(keys[i]).second) {
        return absl::InvalidArgumentError(absl::StrCat(Describe(keys[i]), " listed twice"));
      }
      for (size_t j = 0; j < item_bytes[i].size(); ++j) {
        if (item_bytes[i][j] < 0) {
          return absl::InvalidArgumentError(
              absl::StrCat(Describe(keys[i]), ": item ", j, " has ", item_bytes[i][j], " bytes"));
        }
      }
      slots[i] = LayoutItems(item_bytes[i], &sizes[i]);
      needed += sizes[i];
    }
    const std::shared_ptr<void> pause = PauseSpareRefill();
    RefuseGrownWorkerBuffers();
    {
      std::lock_guard<std::mutex> lock(mu_);
      for (const RankBufferKey& k : keys) {
        if (buffers_.count(k) != 0 || creating_.count(k) != 0) {
          return absl::AlreadyExistsError(absl::StrCat(Describe(k), " already exists"));
        }
      }
      const int64_t used = accounting_->used;
      if (needed > options_.memory_limit_bytes - used) {
        std::string what = keys.empty() ? std::string("nothing")
                                        : absl::StrCat("job \"", keys[0].job_id, "\" generation ",
                                                       keys[0].generation);
        for (const RankBufferKey& k : keys) {
          if (k.job_id != keys[0].job_id || k.generation != keys[0].generation) {
            absl::StrAppend(&what, " and others");
            break;
          }
        }
        return absl::ResourceExhaustedError(absl::StrCat(
            "need ", HumanBytes(needed), " for ", keys.size(), " rank buffers of ", what, ", ",
            HumanBytes(used), " of ", HumanBytes(options_.memory_limit_bytes), " in use"));
      }
      accounting_->used += needed;  // reserved; each buffer returns its own share
      for (const RankBufferKey& k : keys) creating_.insert(k);
    }
    absl::Cleanup created_or_not = [&] {
      std::lock_guard<std::mutex> lock(mu_);
      for (const RankBufferKey& k : keys) creating_.erase(k);
    };
    if (absl::Status s = WriteUnsealedSidecars(keys, item_bytes, writer); !s.ok()) {
      accounting_->used -= needed;
      return s;
    }
    // Spares first, the largest buffers first; then the pool gives back
    // what the new buffers need of the limit.
    std::vector<absl::StatusOr<std::shared_ptr<MappedRankBuffer>>> results(
        keys.size(), absl::UnknownError("not created"));
    std::vector<int64_t> spare(keys.size(), 0);
    std::vector<char> used_spare(keys.size(), 0);  // pages holding a dropped buffer's bytes
    const bool overwritten = backing == Backing::kOverwritten && writer == Writer::kAgent;
    std::vector<size_t> order(keys.size());
    for (size_t i = 0; i < keys.size(); ++i) order[i] = i;
    std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return sizes[a] > sizes[b]; });
    for (size_t i : order) {
      if (sizes[i] < kMinSpareUse) break;
      absl::StatusOr<SparePool::Taken> taken =
          pool_->TakeInto(sizes[i], PathOf(keys[i]), overwritten);
      if (!taken.ok()) {
        results[i] = absl::AlreadyExistsError(
            absl::StrCat(Describe(keys[i]), ": file \"", PathOf(keys[i]), "\" already exists"));
      } else {
        spare[i] = taken->bytes;
        used_spare[i] = taken->used ? 1 : 0;
      }
    }
    pool_->ShrinkTo(options_.memory_limit_bytes - accounting_->used);
    // Several files at once when there is much to allocate: the kernel
    // allocates a file's pages under that file's lock, so files go in parallel.
    const size_t threads =
        needed < kParallelCreateBytes
            ? 1
            : std::min<size_t>(keys.size(), std::max(1u, std::thread::hardware_concurrency()));
    auto create = [&](size_t first) {
      for (size_t i = first; i < keys.size(); i += threads) {
        if (!results[i].ok() && absl::IsAlreadyExists(results[i].status())) continue;
        results[i] =
            CreateOne(keys[i], slots[i], sizes[i], backing, writer, spare[i], used_spare[i] != 0);
        if (absl::IsResourceExhausted(results[i].status()) && pool_->bytes() > 0) {
          // shm_dir full: the spares' pages go first.
          pool_->ShrinkTo(0);
          results[i] = CreateOne(keys[i], slots[i], sizes[i], backing, writer, 0, false);
        }
      }
    };
    std::vector<std::thread> helpers;
    for (size_t t = 1; t < threads; ++t) helpers.emplace_back(create, t);
    create(0);
    for (std::thread& t : helpers) t.join();
    std::vector<std::shared_ptr<MappedRankBuffer>> created;
    int64_t created_bytes = 0;
    absl::Status status;
    for (size_t i = 0; i < keys.size(); ++i) {
      if (!results[i].ok()) {
        if (status.ok()) status = results[i].status();
        continue;
      }
      created_bytes += sizes[i];
      created.push_back(*std::move(results[i]));
    }
    if (!status.ok()) {
      accounting_->used -= needed - created_bytes;
      // Every key's sidecar is ours (WriteUnsealedSidecars), and so is every
      // data file made: all go.
      for (const RankBufferKey& k : keys) Unlink(PathOf(k));
      return status;
    }
    pool_->NoteSizes(sizes);
    std::vector<RankBufferPtr> out;
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& b : created) {
      refused_.erase(b->key());  // published again
      buffers_[b->key()] = b;
      out.push_back(std::move(b));
    }
    return out;
  }

  absl::StatusOr<RankBufferPtr> Get(const RankBufferKey& key) override {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = buffers_.find(key);
    if (it == buffers_.end()) return absl::NotFoundError(absl::StrCat(Describe(key), " not found"));
    return RankBufferPtr(it->second);
  }

  absl::StatusOr<std::vector<uint64_t>> Seal(const RankBufferKey& key,
                                             const std::vector<uint64_t>& expected) override {
    return SealChecked(key, expected, /*for_worker=*/false);
  }

  absl::StatusOr<std::vector<uint64_t>> SealForWorker(
      const RankBufferKey& key, const std::vector<uint64_t>& expected) override {
    return SealChecked(key, expected, /*for_worker=*/true);
  }

  absl::StatusOr<std::vector<uint64_t>> SealChecked(const RankBufferKey& key,
                                                    const std::vector<uint64_t>& expected,
                                                    bool for_worker) {
    std::shared_ptr<MappedRankBuffer> b;
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = buffers_.find(key);
      if (it == buffers_.end()) return NotFoundLocked(key);
      b = it->second;
      if (for_worker && !b->published()) {
        return absl::FailedPreconditionError(absl::StrCat(
            Describe(key), " is written by an operation of the agent, not by workers: a worker ",
            "may seal only a buffer it published"));
      }
      if (!b->sealed() && !sealing_.insert(key).second) {
        return absl::FailedPreconditionError(
            absl::StrCat(Describe(key), " is being sealed by another call"));
      }
    }
    absl::Cleanup done = [&] {
      std::lock_guard<std::mutex> lock(mu_);
      sealing_.erase(key);
    };
    const std::vector<ItemSlot>& items = b->items();
    if (!expected.empty() && expected.size() != items.size()) {
      return absl::InvalidArgumentError(absl::StrCat(Describe(key), " has ", items.size(),
                                                     " items, got ", expected.size(),
                                                     " expected checksums"));
    }
    if (b->sealed()) return SealedAgain(*b, expected);
    std::vector<uint64_t> sums;
    std::shared_ptr<MappedRankBuffer> sealed = b;
    std::unique_ptr<ReadLease> lease;  // held until Record: see SealPublished
    if (b->published()) {
      // A file a worker grew is refused before and after it is read: after,
      // because its worker may grow it until the lease (or the copy) is
      // taken.
      if (absl::Status grown = RefuseIfGrown(b, /*sealer=*/true); !grown.ok()) return grown;
      absl::StatusOr<std::shared_ptr<MappedRankBuffer>> s = SealPublished(
          b, accounting_, [this](const RankBufferKey& k, int64_t n) { return ReserveCopy(k, n); },
          &sums, &lease);
      if (absl::Status grown = GrowthOf(*b); !grown.ok()) {
        lease.reset();  // or the truncation's open would break it and fail
        if (s.ok() && *s != b) ::unlink((b->path() + kSealingSuffix).c_str());
        return RefuseGrown(b, grown, /*sealer=*/true);
      }
      if (!s.ok()) return s.status();
      sealed = *std::move(s);
    } else {
      sums = ChecksumItems(*b);
    }
    std::string copy_path;  // the private copy's file until it replaces the buffer's
    if (sealed != b) copy_path = b->path() + kSealingSuffix;
    auto discard_copy = [&] {
      if (!copy_path.empty()) ::unlink(copy_path.c_str());
    };
    if (!expected.empty()) {
      if (absl::Status s = CompareChecksums(key, items, sums, expected); !s.ok()) {
        discard_copy();
        return s;
      }
    }
    return Record(key, b, sealed, copy_path, std::move(sums));
  }

  absl::StatusOr<std::vector<uint64_t>> SealWritten(const RankBufferKey& key,
                                                    std::vector<uint64_t> sums) override {
    std::shared_ptr<MappedRankBuffer> b;
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = buffers_.find(key);
      if (it == buffers_.end()) {
        return absl::NotFoundError(absl::StrCat(Describe(key), " not found"));
      }
      b = it->second;
      if (b->published() || b->sealed()) {
        return absl::FailedPreconditionError(absl::StrCat(
            Describe(key), b->sealed() ? " is sealed already" : " was written by a worker"));
      }
      if (!sealing_.insert(key).second) {
        return absl::FailedPreconditionError(
            absl::StrCat(Describe(key), " is being sealed by another call"));
      }
    }
    absl::Cleanup done = [&] {
      std::lock_guard<std::mutex> lock(mu_);
      sealing_.erase(key);
    };
    if (sums.size() != b->items().size()) {
      return absl::InvalidArgumentError(absl::StrCat(Describe(key), " has ", b->items().size(),
                                                     " items, got ", sums.size(), " checksums"));
    }
    return Record(key, b, b, "", std::move(sums));
  }

  absl::Status CheckWorkerBuffer(const RankBufferKey& key) override {
    std::shared_ptr<MappedRankBuffer> b;
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = buffers_.find(key);
      if (it == buffers_.end()) {
        auto r = refused_.find(key);
        return r == refused_.end() ? absl::OkStatus() : absl::FailedPreconditionError(r->second);
      }
      b = it->second;
    }
    return RefuseIfGrown(b, /*sealer=*/false);
  }

  std::string host_id() const override { return options_.host_id; }

  absl::Status MarkRegenerated(const RankBufferKey& key, std::vector<int32_t> items) override {
    if (items.empty()) return absl::OkStatus();
    std::lock_guard<std::mutex> lock(mu_);
    auto it = buffers_.find(key);
    if (it == buffers_.end()) return absl::NotFoundError(absl::StrCat(Describe(key), " not found"));
    const std::shared_ptr<MappedRankBuffer>& b = it->second;
    if (b->published()) {
      return absl::FailedPreconditionError(
          absl::StrCat(Describe(key), " was written by a worker: it has no items to regenerate"));
    }
    if (b->sealed() || sealing_.count(key) != 0) {
      return absl::FailedPreconditionError(absl::StrCat(Describe(key), " is sealed already"));
    }
    const int32_t count = static_cast<int32_t>(b->items().size());
    for (int32_t item : items) {
      if (item < 0 || item >= count) {
        return absl::InvalidArgumentError(absl::StrCat(
            Describe(key), " has ", count, " items: item ", item, " cannot be regenerated"));
      }
    }
    std::vector<int32_t> all = b->regenerated();
    all.insert(all.end(), items.begin(), items.end());
    std::sort(all.begin(), all.end());
    all.erase(std::unique(all.begin(), all.end()), all.end());
    Sidecar sidecar = MakeSidecar(key, b->item_bytes(), /*published=*/false);
    sidecar.regenerated = all;
    if (absl::Status s = WriteSidecar(b->path() + kMetaSuffix, sidecar); !s.ok()) return s;
    b->SetRegenerated(std::move(all));
    return absl::OkStatus();
  }

 private:
  // Seal's last part: `sealed` (`b`, or the private copy at `copy_path`)
  // becomes the buffer of `key`, read-only, with `sums` recorded.
  absl::StatusOr<std::vector<uint64_t>> Record(const RankBufferKey& key,
                                               const std::shared_ptr<MappedRankBuffer>& b,
                                               const std::shared_ptr<MappedRankBuffer>& sealed,
                                               const std::string& copy_path,
                                               std::vector<uint64_t> sums) {
    auto discard_copy = [&] {
      if (!copy_path.empty()) ::unlink(copy_path.c_str());
    };
    std::lock_guard<std::mutex> lock(mu_);
    auto it = buffers_.find(key);
    if (it == buffers_.end() || it->second != b) {
      discard_copy();
      return absl::NotFoundError(absl::StrCat(Describe(key), " was dropped while sealing"));
    }
    absl::Status s;
    if (sealed != b) {
      // The copy takes the buffer's name; the worker's mapping keeps the old
      // file, which nothing the agent serves reads any more.
      if (::rename(copy_path.c_str(), b->path().c_str()) != 0) {
        s = ErrnoStatus("cannot rename to", b->path(), errno);
        discard_copy();
        return s;
      }
      it->second = sealed;
    } else {
      s = b->MakeReadOnly(/*seal_mode=*/true);
    }
    Sidecar sidecar = MakeSidecar(key, b->item_bytes(), b->published());
    sidecar.sealed = true;
    sidecar.checksums = sums;
    sidecar.regenerated = b->regenerated();
    if (s.ok()) s = WriteSidecar(b->path() + kMetaSuffix, sidecar);
    if (!s.ok()) return s;
    if (sealed != b) sealed->SetRegenerated(sidecar.regenerated);
    sealed->SetSealed(sums);
    return sums;
  }

 public:
  void DropGeneration(const std::string& job_id, int64_t generation) override {
    DropListener listener;
    bool job_held = false;
    std::vector<Dropped> dropped;
    {
      std::lock_guard<std::mutex> lock(mu_);
      for (auto it = buffers_.begin(); it != buffers_.end();) {
        if (it->first.job_id == job_id && it->first.generation == generation) {
          dropped.push_back(Release(std::move(it->second)));
          it = buffers_.erase(it);
        } else {
          ++it;
        }
      }
      for (auto it = refused_.begin(); it != refused_.end();) {
        const bool of_it = it->first.job_id == job_id && it->first.generation == generation;
        it = of_it ? refused_.erase(it) : std::next(it);
      }
      job_held = HoldsJobLocked(job_id);
      listener = drop_listener_;
    }
    for (Dropped& d : dropped) KeepOrFree(std::move(d));
    pool_->Wake();  // once the buffers are gone: their room is free
    if (listener) listener(job_id, generation, job_held);
  }

  void Drop(const RankBufferKey& key) override {
    DropListener listener;
    bool job_held = false;
    std::optional<Dropped> dropped;
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = buffers_.find(key);
      if (it != buffers_.end()) {
        dropped = Release(std::move(it->second));
        buffers_.erase(it);
      }
      refused_.erase(key);
      job_held = HoldsJobLocked(key.job_id);
      listener = drop_listener_;
    }
    if (dropped) {
      KeepOrFree(*std::move(dropped));
      pool_->Wake();
    }
    if (listener) listener(key.job_id, key.generation, job_held);
  }

  void SetDropListener(DropListener listener) override {
    std::lock_guard<std::mutex> lock(mu_);
    drop_listener_ = std::move(listener);
  }

  std::vector<RankBufferKey> List() const override {
    std::lock_guard<std::mutex> lock(mu_);
    std::vector<RankBufferKey> out;
    for (const auto& [k, b] : buffers_) out.push_back(k);
    return out;
  }

  int64_t used_bytes() const override {
    std::vector<std::shared_ptr<MappedRankBuffer>> open;
    {
      std::lock_guard<std::mutex> lock(mu_);
      for (const auto& [k, b] : buffers_) {
        if (b->published() && !b->sealed()) open.push_back(b);
      }
    }
    // A grown file counts what it holds until the next check drops it.
    int64_t grown = 0;
    for (const auto& b : open) {
      struct stat st {};
      if (::stat(b->path().c_str(), &st) != 0 || b->CheckGrowth(st).ok()) continue;
      grown += std::max<int64_t>(st.st_size, static_cast<int64_t>(st.st_blocks) * 512) - b->size();
    }
    return accounting_->used + grown;
  }
  int64_t limit_bytes() const override { return options_.memory_limit_bytes; }
  int64_t spare_bytes() const override { return pool_->bytes(); }
  std::shared_ptr<void> PauseSpareRefill() override {
    pool_->Pause();
    SparePool* pool = pool_.get();
    return std::shared_ptr<void>(pool, [](SparePool* p) { p->Resume(); });
  }
  bool WaitForSpares(double timeout_s) override { return pool_->WaitFilled(timeout_s); }

 private:
  std::string PathOf(const RankBufferKey& key) const {
    return absl::StrCat(options_.shm_dir, "/", RankBufferFileName(options_.host_id, key));
  }

  bool HoldsJobLocked(const std::string& job_id) const {
    auto it = buffers_.lower_bound(RankBufferKey{job_id, std::numeric_limits<int64_t>::min(), 0});
    return it != buffers_.end() && it->first.job_id == job_id;
  }

  // NotFound for `key`, or the refusal of a worker's grown buffer under it
  // (see CheckWorkerBuffer).
  absl::Status NotFoundLocked(const RankBufferKey& key) const {
    auto r = refused_.find(key);
    if (r != refused_.end()) return absl::FailedPreconditionError(r->second);
    return absl::NotFoundError(absl::StrCat(Describe(key), " not found"));
  }

  // When the file of `b` (written by a worker, unsealed) holds more than
  // planned: drops `b`, unless another call is sealing it (that one checks
  // again: `sealer` is the sealing call itself), truncating its file to
  // nothing so that its memory returns at once, even while its worker keeps
  // the file open or mapped (its next touch of the mapping faults: it grew
  // the file behind the agent's back); returns the refusal. OK otherwise.
  absl::Status RefuseIfGrown(const std::shared_ptr<MappedRankBuffer>& b, bool sealer) {
    absl::Status grown = GrowthOf(*b);
    return grown.ok() ? grown : RefuseGrown(b, grown, sealer);
  }

  // CheckGrowth of `b`'s file, for a buffer a worker writes and nobody sealed.
  static absl::Status GrowthOf(const MappedRankBuffer& b) {
    if (!b.published() || b.sealed()) return absl::OkStatus();
    struct stat st {};
    if (::stat(b.path().c_str(), &st) != 0) return absl::OkStatus();  // CheckFile's case
    return b.CheckGrowth(st);
  }

  // RefuseIfGrown's drop, for `b` whose file grew (`grown`, returned).
  absl::Status RefuseGrown(const std::shared_ptr<MappedRankBuffer>& b, const absl::Status& grown,
                           bool sealer) {
    const RankBufferKey& key = b->key();
    DropListener listener;
    bool job_held = false;
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = buffers_.find(key);
      if (it == buffers_.end() || it->second != b) return grown;  // dropped meanwhile
      if (!sealer && sealing_.count(key) != 0) return grown;
      // Opened before the name goes; O_NONBLOCK: never wait for a lease.
      const int fd = ::open(b->path().c_str(), O_RDWR | O_NONBLOCK | O_CLOEXEC | O_NOFOLLOW);
      Unlink(b->path());
      buffers_.erase(it);
      if (refused_.size() >= kMaxRefusals) refused_.erase(refused_.begin());
      refused_[key] = std::string(grown.message());
      // Nothing reads the agent's mapping of an unsealed published buffer
      // but its seal, which is either this call or not running.
      if (fd >= 0) {
        if (::ftruncate(fd, 0) != 0) {
          RESHARD_LOG(WARNING) << "shard store: cannot truncate the grown " << Describe(key) << ": "
                               << std::strerror(errno);
        }
        ::close(fd);
      }
      job_held = HoldsJobLocked(key.job_id);
      listener = drop_listener_;
    }
    RESHARD_LOG(WARNING) << "shard store: refused: " << grown.message();
    pool_->Wake();
    if (listener) listener(key.job_id, key.generation, job_held);
    return grown;
  }

  // RefuseIfGrown for every buffer a worker writes that no call is sealing.
  void RefuseGrownWorkerBuffers() {
    std::vector<std::shared_ptr<MappedRankBuffer>> open;
    {
      std::lock_guard<std::mutex> lock(mu_);
      for (const auto& [k, b] : buffers_) {
        if (b->published() && !b->sealed() && sealing_.count(k) == 0) open.push_back(b);
      }
    }
    for (const auto& b : open) (void)RefuseIfGrown(b, /*sealer=*/false);
  }

  static void Unlink(const std::string& path) {
    ::unlink(path.c_str());
    ::unlink((path + kMetaSuffix).c_str());
  }

  // A dropped buffer whose file may become a used spare: renamed to `spare`
  // (empty: unlinked already).
  struct Dropped {
    std::shared_ptr<MappedRankBuffer> buffer;
    std::string spare;
  };

  // Takes `b` out of the store's names, under mu_: its sidecar goes, and its
  // file is unlinked or, when the pool keeps dropped buffers, renamed to a
  // name of the pool's (so that the buffer's name is free at once either
  // way). KeepOrFree, outside mu_, finishes.
  Dropped Release(std::shared_ptr<MappedRankBuffer> b) {
    Dropped d;
    const std::string& path = b->path();
    ::unlink((path + kMetaSuffix).c_str());
    if (pool_->keeps() && b->size() >= kMinSpareUse) {
      d.spare = pool_->NewName();
      if (::rename(path.c_str(), d.spare.c_str()) != 0) d.spare.clear();
    }
    if (d.spare.empty()) ::unlink(path.c_str());
    d.buffer = std::move(b);
    return d;
  }

  // Lets go of a Released buffer; its file becomes a used spare when nobody
  // else has it open or mapped (a write lease proves it: the kernel grants
  // one only to the file's sole holder, and no worker can open it by name),
  // else it is unlinked (its pages freed when the last holder lets go).
  void KeepOrFree(Dropped d) {
    if (d.spare.empty()) return;
    const int64_t size = d.buffer->size();
    d.buffer.reset();  // the last reference unmaps it
    bool kept = false;
    const int fd = ::open(d.spare.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC | O_NOFOLLOW);
    if (fd >= 0) {
      struct stat st {};
      if (::fcntl(fd, F_SETLEASE, F_WRLCK) == 0) {
        kept = ::fstat(fd, &st) == 0 && st.st_size == size &&
               ::fchmod(fd, kUnsealedMode) == 0;  // a sealed file's mode was read-only
        (void)::fcntl(fd, F_SETLEASE, F_UNLCK);
      }
      ::close(fd);
    }
    if (!kept || !pool_->Keep(d.spare, size)) ::unlink(d.spare.c_str());
  }

  // An unsealed sidecar of this host's buffer `key`.
  Sidecar MakeSidecar(const RankBufferKey& key, std::vector<int64_t> item_bytes,
                      bool published) const {
    Sidecar sidecar;
    sidecar.host_id = options_.host_id;
    sidecar.key = key;
    sidecar.item_bytes = std::move(item_bytes);
    sidecar.published = published;
    return sidecar;
  }

  // Writes the unsealed sidecar of every key before any data file exists, so
  // that an agent dying while it makes them leaves sidecars that name their
  // files (Open removes the unfinished ones), never a data file nobody knows
  // of. AlreadyExists, writing nothing, when a file of a key is there.
  absl::Status WriteUnsealedSidecars(const std::vector<RankBufferKey>& keys,
                                     const std::vector<std::vector<int64_t>>& item_bytes,
                                     Writer writer) {
    for (const RankBufferKey& k : keys) {
      const std::string path = PathOf(k);
      struct stat st {};
      if (::stat(path.c_str(), &st) == 0 || ::stat((path + kMetaSuffix).c_str(), &st) == 0) {
        return absl::AlreadyExistsError(
            absl::StrCat(Describe(k), ": file \"", path, "\" already exists"));
      }
    }
    for (size_t i = 0; i < keys.size(); ++i) {
      const Sidecar sidecar = MakeSidecar(keys[i], item_bytes[i], writer == Writer::kWorker);
      if (absl::Status s = WriteSidecar(PathOf(keys[i]) + kMetaSuffix, sidecar); !s.ok()) {
        for (size_t j = 0; j <= i; ++j) ::unlink((PathOf(keys[j]) + kMetaSuffix).c_str());
        return s;
      }
    }
    return absl::OkStatus();
  }

  // Makes a new buffer file the agent's alone (explicitly: a spare file
  // renamed to it may have had another mode).
  static absl::Status SetOwnership(int fd, const std::string& path) {
    if (::fchmod(fd, kUnsealedMode) != 0) {
      return ErrnoStatus(absl::StrFormat("cannot set mode %04o on", kUnsealedMode), path, errno);
    }
    return absl::OkStatus();
  }

  // Creates, sizes and maps one file (its unsealed sidecar is written
  // already: WriteUnsealedSidecars). The caller has reserved `size` bytes and, when `spare` > 0,
  // renamed a spare file of `spare` bytes (pages allocated, and zeroed unless `used`: a dropped
  // buffer's, for Backing::kOverwritten) to the buffer's path.
  absl::StatusOr<std::shared_ptr<MappedRankBuffer>> CreateOne(const RankBufferKey& key,
                                                              std::vector<ItemSlot> slots,
                                                              int64_t size, Backing backing,
                                                              Writer writer, int64_t spare,
                                                              bool used) {
    const std::string path = PathOf(key);
    const int fd = spare > 0
                       ? ::open(path.c_str(), O_RDWR | O_CLOEXEC)
                       : ::open(path.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, kUnsealedMode);
    if (fd < 0) {
      const int err = errno;
      if (err == EEXIST) {
        return absl::AlreadyExistsError(
            absl::StrCat(Describe(key), ": file \"", path, "\" already exists"));
      }
      if (spare > 0) ::unlink(path.c_str());
      return ErrnoStatus("cannot create", path, err);
    }
    if (absl::Status s = SetOwnership(fd, path); !s.ok()) {
      ::close(fd);
      ::unlink(path.c_str());
      return s;
    }
    if (size != spare && ::ftruncate(fd, size) != 0) {
      const int err = errno;
      ::close(fd);
      ::unlink(path.c_str());
      return ErrnoStatus(absl::StrCat("cannot size to ", size, " bytes"), path, err);
    }
    const FileId id = IdOf(fd);
    absl::StatusOr<uint8_t*> data = MapAndClose(fd, path, size);
    if (!data.ok()) {
      ::unlink(path.c_str());
      return data.status();
    }
    const int64_t kept = std::min(spare, size);  // allocated (and zeroed unless `used`) already
    if (used) {
      // Whatever the dropped buffer held: a buffer its writer overwrites
      // reads zero outside its items, any other one everywhere (clearing
      // existing pages costs a fraction of allocating them).
      if (backing == Backing::kOverwritten && writer == Writer::kAgent) {
        ZeroOutsideItems(*data, slots, kept);
      } else {
        ZeroPages(*data, kept);
      }
    }
    absl::Status s = Allocate(*data, kept, size, path, backing == Backing::kPrefaulted);
    if (s.ok() && kept > 0 && backing == Backing::kPrefaulted && writer == Writer::kAgent) {
      // Only page tables to fill; harmless if unsupported (writes map them).
      (void)PrefaultPages(*data, kept);
    }
    if (!s.ok()) {
      ::munmap(*data, static_cast<size_t>(size));
      ::unlink(path.c_str());
      return s;
    }
    const bool published = writer == Writer::kWorker;
    // A worker writes this one: the agent keeps no writable mapping, so that
    // Seal can tell (by a read lease) whether anyone still can write it.
    if (published) s = RemapReadOnly(*data, size, path, /*seal_mode=*/false);
    // Its page tables in one call (the pages exist): the seal's checksum and
    // the tasks that read it then take no fault per 4 KiB page.
    if (s.ok() && published && size > 0) (void)PrefaultPages(*data, size);
    if (!s.ok()) {
      if (*data != nullptr) ::munmap(*data, static_cast<size_t>(size));
      Unlink(path);
      return s;
    }
    auto b = std::make_shared<MappedRankBuffer>(key, path, *data, size, std::move(slots),
                                                accounting_, published, id);
    return b;
  }

  // Maps the buffer described by the sidecar at `meta_path`.
  absl::Status Load(const std::string& meta_path) {
    absl::StatusOr<Sidecar> sidecar = ReadSidecar(meta_path);
    if (!sidecar.ok()) return sidecar.status();
    if (sidecar->host_id != options_.host_id) {
      // Another host whose id starts with ours and a dash: not ours.
      RESHARD_LOG(DEBUG) << "shard store: \"" << meta_path << "\" belongs to host \""
                         << sidecar->host_id << "\"";
      return absl::OkStatus();
    }
    const std::string path = PathOf(sidecar->key);
    if (path + kMetaSuffix != meta_path) {
      return absl::InvalidArgumentError(absl::StrCat("describes \"", path, "\""));
    }
    if (!sidecar->sealed && !sidecar->published) {
      // A task's unfinished buffer (the agent died while executing it): the
      // task's attempt is over, and a new attempt makes its buffers afresh.
      RESHARD_LOG(INFO) << "shard store: removing the unfinished " << Describe(sidecar->key)
                        << " left by a task that did not end";
      Unlink(path);
      return absl::OkStatus();
    }
    int64_t size = 0;
    std::vector<ItemSlot> slots = LayoutItems(sidecar->item_bytes, &size);
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    const int open_errno = errno;
    struct stat st {};
    const bool whole = fd >= 0 && ::fstat(fd, &st) == 0 && st.st_size == size;
    if (!whole && fd >= 0) ::close(fd);
    if (!whole && !sidecar->sealed) {
      // A published buffer the agent died making (the sidecar is written
      // first): its worker publishes again.
      RESHARD_LOG(INFO) << "shard store: removing the half-made " << Describe(sidecar->key);
      Unlink(path);
      return absl::OkStatus();
    }
    if (fd < 0) return ErrnoStatus("cannot open", path, open_errno);
    if (!whole) {
      return absl::InvalidArgumentError(
          absl::StrCat("\"", path, "\" has ", st.st_size, " bytes, the sidecar says ", size));
    }
    // The agent's own group and mode, whatever an earlier agent gave the
    // file (a worker group's read and write access before issue 19): no
    // worker may open a shard file. A file that cannot be regrouped is kept
    // (its bytes may be the only copy) and said loudly.
    const mode_t mode = sidecar->sealed ? kSealedMode : kUnsealedMode;
    absl::StatusOr<bool> regrouped = Regroup(fd, path, st, /*gid=*/-1, mode);
    if (!regrouped.ok()) {
      RESHARD_LOG(WARNING) << "shard store: " << Describe(sidecar->key)
                           << " keeps its old group or mode: " << regrouped.status();
    } else if (*regrouped) {
      RESHARD_LOG(INFO) << "shard store: " << Describe(sidecar->key) << " regrouped: group "
                        << st.st_gid << " mode " << absl::StrFormat("%04o", st.st_mode & 07777)
                        << " -> group " << ::getegid() << " mode " << absl::StrFormat("%04o", mode);
    }
    const FileId id{st.st_dev, st.st_ino};
    // Sealed and published buffers alike: the agent never writes them.
    absl::StatusOr<uint8_t*> data = MapAndClose(fd, path, size, /*writable=*/false);
    if (!data.ok()) return data.status();
    accounting_->used += size;
    auto b = std::make_shared<MappedRankBuffer>(sidecar->key, path, *data, size, std::move(slots),
                                                accounting_, sidecar->published, id);
    if (sidecar->sealed) b->SetSealed(sidecar->checksums);
    if (absl::Status grown = b->CheckGrowth(st); !sidecar->sealed && !grown.ok()) {
      // Grown by its worker (fallocate past its end) before this agent
      // started: refused as RefuseIfGrown refuses it.
      RESHARD_LOG(WARNING) << "shard store: removing: " << grown.message();
      Unlink(path);
      return absl::OkStatus();
    }
    b->SetRegenerated(sidecar->regenerated);
    std::lock_guard<std::mutex> lock(mu_);
    buffers_[sidecar->key] = std::move(b);
    return absl::OkStatus();
  }

  // Reserves room for a sealing copy of `key`'s buffer (see SealPublished).
  absl::Status ReserveCopy(const RankBufferKey& key, int64_t size) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      const int64_t used = accounting_->used;
      if (size > options_.memory_limit_bytes - used) {
        return absl::ResourceExhaustedError(
            absl::StrCat(Describe(key),
                         " is still open for writing (or mapped writable) by a worker, so "
                         "sealing it needs a private copy of ",
                         HumanBytes(size), ", and ", HumanBytes(used), " of ",
                         HumanBytes(options_.memory_limit_bytes),
                         " are in use: unmap and close it before SealShard"));
      }
      accounting_->used += size;
    }
    pool_->ShrinkTo(options_.memory_limit_bytes - accounting_->used);
    return absl::OkStatus();
  }

  const Options options_;
  const std::shared_ptr<Accounting> accounting_;
  mutable std::mutex mu_;
  std::map<RankBufferKey, std::shared_ptr<MappedRankBuffer>, KeyLess> buffers_;
  std::set<RankBufferKey, KeyLess> sealing_;   // unsealed buffers a Seal call is working on
  std::set<RankBufferKey, KeyLess> creating_;  // keys a CreateAll call is making
  // Why a worker's buffer was dropped for growing (RefuseIfGrown), until its
  // rank is created again or its generation dropped; at most kMaxRefusals.
  static constexpr size_t kMaxRefusals = 1024;
  std::map<RankBufferKey, std::string, KeyLess> refused_;
  std::unique_ptr<SparePool> pool_;  // set by StartPool; never null after Open
  DropListener drop_listener_;       // SetDropListener's
};

}  // namespace

absl::Status PrefaultPages(uint8_t* data, int64_t bytes) {
#ifdef MADV_POPULATE_READ
  // A read fault maps a shared tmpfs page writable, allocating it if needed;
  // on pages that exist already (a spare's) it costs a third of a write fault.
  return Populate(data, bytes, MADV_POPULATE_READ);
#else
  (void)data;
  (void)bytes;
  return absl::UnimplementedError("MADV_POPULATE_READ not supported");
#endif
}

absl::Status MarkRegenerated(ShardStore& store, const std::vector<RankBufferKey>& keys,
                             const google::protobuf::RepeatedPtrField<v1::Regenerate>& regenerate) {
  for (const RankBufferKey& key : keys) {
    std::vector<int32_t> items;
    for (const v1::Regenerate& g : regenerate) {
      if (g.rank() == key.rank) items.push_back(g.item());
    }
    if (absl::Status s = store.MarkRegenerated(key, std::move(items)); !s.ok()) return s;
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<ShardStore>> ShardStore::Open(const Options& options) {
  if (absl::Status s = CheckName("host id", options.host_id); !s.ok()) return s;
  if (options.memory_limit_bytes < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("memory_limit_bytes ", options.memory_limit_bytes, " is negative"));
  }
  if (options.spare_bytes < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("spare_bytes ", options.spare_bytes, " is negative"));
  }
  auto store = std::make_unique<ShmShardStore>(options);
  if (absl::Status s = store->Scan(); !s.ok()) return s;
  store->StartPool();
  return std::unique_ptr<ShardStore>(std::move(store));
}

}  // namespace reshard::agent
