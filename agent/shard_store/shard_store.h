// The agent's shard store: rank buffers in shared memory that workers on the
// host map without a copy, with checksums and memory accounting. See
// docs/agent.md, "Shard store". Thread-safe.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "reshard/v1/plan.pb.h"
#include "reshard/v1/ptc.pb.h"

namespace reshard::agent {

/// XXH3-64 of `bytes` bytes at `data`.
uint64_t Checksum(const void* data, size_t bytes);

/// Bytes of each PTC item (tensors in order, then blobs) that `rank` holds
/// under `layout`: local_elements x element bytes (padding included), 0 for
/// tensors of other stages. `ptc` and `layout` must be valid.
std::vector<int64_t> RankItemBytes(const v1::Ptc& ptc, const v1::Layout& layout, int rank);

/// RankItemBytes for every rank of `layout`, indexed by rank (resolves the
/// layout once).
std::vector<std::vector<int64_t>> AllRankItemBytes(const v1::Ptc& ptc, const v1::Layout& layout);

struct RankBufferKey {
  std::string job_id;
  int64_t generation = 0;
  int32_t rank = 0;
  bool operator==(const RankBufferKey& o) const {
    return job_id == o.job_id && generation == o.generation && rank == o.rank;
  }
};

/// One item's place in a rank buffer (offsets aligned to 64 bytes).
struct ItemSlot {
  int64_t offset = 0;
  int64_t bytes = 0;
};

/// Byte alignment of every item's offset in a rank buffer.
inline constexpr int64_t kItemAlignment = 64;

/// The slots of items of `item_bytes` laid out in order at aligned offsets;
/// `total_bytes` (if not null) gets the buffer size (the end of the last
/// item, rounded up to kItemAlignment).
std::vector<ItemSlot> LayoutItems(const std::vector<int64_t>& item_bytes,
                                  int64_t* total_bytes = nullptr);

/// The file name (no directory) of a rank buffer:
/// "reshard-<host>-<job>-g<generation>-r<rank>".
std::string RankBufferFileName(const std::string& host_id, const RankBufferKey& key);

/// A read lease on a sealed rank buffer's file (fcntl F_SETLEASE F_RDLCK)
/// while it lives: a process that tries to truncate the file or open it for
/// writing waits (up to /proc/sys/fs/lease-break-time, default 45 s) until the
/// lease goes, and Broken() turns true at once, so that a reader stops and
/// fails instead of reading bytes that are about to change or vanish.
class ReadLease {
 public:
  virtual ~ReadLease() = default;
  /// Whether some process has asked to truncate or write the file since the
  /// lease was taken.
  virtual bool Broken() const = 0;
};

/// Everything one rank holds in one generation of one job: one shared-memory
/// file, mapped for the buffer's lifetime. Data access is not synchronised:
/// callers own disjoint regions.
///
/// Lifecycle (docs/agent.md, "Generation lifecycle"): a buffer is written
/// (by a worker after PublishShard, or by the executor), then sealed; from
/// then on it is immutable: the agent's own mapping is read-only, the file is
/// mode 0400, re-publishing is refused, and readers hold a ReadLease and
/// check the bytes against the sealed checksums. Every file is the agent's
/// alone (0600 until sealed, no group or other access): a worker reaches one
/// only through a descriptor the agent opened for it (OpenForWorker).
class RankBuffer {
 public:
  virtual ~RankBuffer() = default;
  virtual const RankBufferKey& key() const = 0;
  /// The file a worker maps.
  virtual const std::string& path() const = 0;
  virtual uint8_t* data() = 0;
  virtual int64_t size() const = 0;
  virtual const std::vector<ItemSlot>& items() const = 0;
  uint8_t* item_data(int item) { return data() + items()[item].offset; }
  /// Whether every item has been sealed, and the checksums once sealed.
  virtual bool sealed() const = 0;
  virtual std::vector<uint64_t> checksums() const = 0;
  /// Made for a worker to write (ShardStore::Writer::kWorker).
  virtual bool published() const = 0;
  /// Items (ascending) that hold zeros for their worker to regenerate
  /// (ShardStore::MarkRegenerated): no surviving rank held their value.
  virtual std::vector<int32_t> regenerated() const { return {}; }
  /// OK while the buffer's file is still the one the agent mapped, at its
  /// size; DataLoss naming the buffer when a process truncated, grew or
  /// replaced it (reading the mapping then could kill the agent with SIGBUS).
  [[nodiscard]] virtual absl::Status CheckFile() const = 0;
  /// A ReadLease on the file (after CheckFile). FailedPrecondition when a
  /// process has the file open for writing (or a writable mapping of it).
  [[nodiscard]] virtual absl::StatusOr<std::unique_ptr<ReadLease>> LeaseForReading() const = 0;
  /// A new descriptor (O_CLOEXEC; the caller closes it) of the buffer's file
  /// for a worker to map: read-write when `writable`, else read-only, and its
  /// size. The caller decides whether the worker may have it. DataLoss when
  /// the file is not the one the agent mapped, at its size (truncated,
  /// grown, replaced); FailedPrecondition when a writable open would wait
  /// for a read lease (the buffer is being sealed).
  struct WorkerFile {
    int fd = -1;
    int64_t size = 0;
  };
  [[nodiscard]] virtual absl::StatusOr<WorkerFile> OpenForWorker(bool writable) const {
    (void)writable;
    return absl::UnimplementedError("this rank buffer has no file for workers");
  }
};
using RankBufferPtr = std::shared_ptr<RankBuffer>;

/// Maps the pages of [data, data + bytes) of a rank buffer made with
/// Backing::kReserved now (allocating them if needed), so that later writes
/// take no page faults. Safe while other threads write the range. Fails
/// (harmlessly: the first write maps a page anyway) where the kernel lacks
/// MADV_POPULATE_READ (before 5.14).
absl::Status PrefaultPages(uint8_t* data, int64_t bytes);

class ShardStore {
 public:
  struct Options {
    std::string shm_dir = "/dev/shm";
    std::string host_id;  // part of every file name
    int64_t memory_limit_bytes = int64_t{64} << 30;
    /// Bytes of spare files `<shm_dir>/reshard-<host>-spare-<n>` kept with
    /// their pages allocated and zeroed, filled by a background thread at
    /// idle priority: CreateAll makes buffers from them first. They count
    /// against memory_limit_bytes and are removed first when a CreateAll
    /// needs the room. 0: no spare pool.
    int64_t spare_bytes = 0;
    /// How long the file of a dropped rank buffer is kept, pages and all,
    /// for a new buffer to take (its pages are not allocated again: a
    /// Backing::kOverwritten buffer clears only what lies outside its
    /// items, any other clears it whole); within memory_limit_bytes like a
    /// spare, freed first when a CreateAll needs the room. Only a file no
    /// process has open or mapped any more is kept. 0: freed at once.
    double keep_dropped_s = 0;
    /// Bytes of the host's memory spares may still take; below zero, spares
    /// are freed until it is not. Null: MemAvailable less a quarter of
    /// MemTotal (/proc/meminfo).
    std::function<int64_t()> host_memory;
  };
  // Rank buffer files have no configurable group or mode (docs/security.md,
  // "Workers"): 0600 until sealed, 0400 after, in the agent's own group, so
  // that no worker of any job can open one by path; Open gives the files an
  // earlier agent left those too (taking an old worker group's access away).

  /// Opens the store, finding the rank buffers (and their sealed checksums)
  /// this host left behind, e.g. before the agent restarted, and removing
  /// the spare files it left.
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<ShardStore>> Open(const Options& options);
  virtual ~ShardStore() = default;

  /// How CreateAll backs a new buffer with memory.
  enum class Backing {
    /// Every page allocated and mapped before CreateAll returns.
    kPrefaulted,
    /// Pages reserved (a full shm_dir fails CreateAll, never a later write)
    /// but mapped by the first write, or by PrefaultPages meanwhile.
    kReserved,
    /// As kReserved, for an agent-written buffer whose every item byte the
    /// caller writes before it is sealed: when its pages are those of a
    /// buffer dropped a moment ago (Options::keep_dropped_s), its items
    /// hold that buffer's bytes until overwritten (only the bytes between
    /// and after the items are zeroed), and such pages are its first pick.
    kOverwritten,
  };

  /// Who writes a new buffer's bytes before it is sealed.
  enum class Writer {
    /// The agent (the executor); the agent's mapping stays writable until
    /// Seal.
    kAgent,
    /// A worker, through the file (PublishShard). The agent maps it
    /// read-only from the start, and Seal makes sure no worker can change
    /// the sealed bytes (see Seal).
    kWorker,
  };

  /// Creates all the buffers or none: ResourceExhausted naming the bytes
  /// needed, used and the limit (or the shm_dir) when they do not fit;
  /// AlreadyExists when one exists. New buffers are zeroed
  /// (Backing::kOverwritten: outside their items). Spare files are taken
  /// first (renamed to the buffer's name, resized); fresh files cover the
  /// rest.
  [[nodiscard]] virtual absl::StatusOr<std::vector<RankBufferPtr>> CreateAll(
      const std::vector<RankBufferKey>& keys, const std::vector<std::vector<int64_t>>& item_bytes,
      Backing backing = Backing::kPrefaulted, Writer writer = Writer::kAgent) = 0;
  /// NotFound when absent.
  [[nodiscard]] virtual absl::StatusOr<RankBufferPtr> Get(const RankBufferKey& key) = 0;
  /// Checksums every item from its bytes and records them (durably, in a
  /// sidecar file); from then on the buffer is immutable. With `expected`
  /// (one per item, or empty), a mismatch is DataLoss naming the item.
  /// Sealing a sealed buffer returns its checksums (DataLoss when `expected`
  /// differs from them). A published buffer whose file was truncated is
  /// DataLoss (the agent never reads past the file's end). A published
  /// buffer that some process still has open for writing (a worker that did
  /// not unmap) is sealed from a private copy read with pread: the copy
  /// replaces the file (rename), so that later writes through the old
  /// mapping reach nothing the agent serves. The copy needs the buffer's
  /// size again within the memory limit (ResourceExhausted otherwise). A
  /// published buffer whose file holds more than planned is refused and
  /// dropped (see CheckWorkerBuffer).
  [[nodiscard]] virtual absl::StatusOr<std::vector<uint64_t>> Seal(
      const RankBufferKey& key, const std::vector<uint64_t>& expected) = 0;
  /// Seal for a buffer the agent wrote (Writer::kAgent) with `sums`, one per
  /// item, that the writer computed from the bytes it wrote after its last
  /// write to each item, so that the buffer is not read again. Records them
  /// like Seal; from then on the buffer is immutable. FailedPrecondition for
  /// a sealed or worker-written buffer, InvalidArgument for a wrong count.
  [[nodiscard]] virtual absl::StatusOr<std::vector<uint64_t>> SealWritten(
      const RankBufferKey& key, std::vector<uint64_t> sums) = 0;
  /// Seal on a worker's behalf (SealShard): FailedPrecondition naming the
  /// buffer, checked under the store's lock, unless it was made for a worker
  /// to write (Writer::kWorker). A buffer the agent made belongs to an
  /// operation that writes it (a transfer, a prepare) or wrote it: sealing
  /// it would remap it read-only under the operation's writes.
  [[nodiscard]] virtual absl::StatusOr<std::vector<uint64_t>> SealForWorker(
      const RankBufferKey& key, const std::vector<uint64_t>& expected) = 0;
  /// Checks the file of buffer `key` when a worker writes it (Writer::kWorker,
  /// unsealed) before a worker gets a descriptor of it: FailedPrecondition
  /// naming job, generation, rank and the planned and actual bytes when the
  /// file holds more than planned (grown by ftruncate, fallocate or a write
  /// past its end). Such a buffer is dropped at once and its file truncated
  /// to nothing, so its memory returns even while the worker keeps it open;
  /// until the rank is created again (PublishShard) or its generation
  /// dropped, Seal and this answer the same refusal. OK for a buffer that
  /// is absent, sealed, agent-written or in bounds. Seal and CreateAll make
  /// the same check (CreateAll of every worker buffer not being sealed, so
  /// that one worker's growth never takes another's room).
  [[nodiscard]] virtual absl::Status CheckWorkerBuffer(const RankBufferKey& key) {
    (void)key;
    return absl::OkStatus();
  }
  /// The host whose buffers the store holds (Options::host_id); empty when
  /// the store does not know it.
  virtual std::string host_id() const { return {}; }
  /// Records that items `items` of the unsealed buffer `key`, made by the
  /// agent (Writer::kAgent), hold zeros their worker must regenerate
  /// (TransferPlan.regenerate: no surviving rank held the value), adding to
  /// those recorded before: durably (in its sidecar, so an agent restart
  /// keeps it), kept by SealWritten, reported by RankBuffer::regenerated().
  /// Nothing to do for no items. NotFound when absent, FailedPrecondition
  /// for a sealed (or sealing) or worker-written buffer, InvalidArgument for
  /// an item out of range.
  [[nodiscard]] virtual absl::Status MarkRegenerated(const RankBufferKey& key,
                                                     std::vector<int32_t> items) = 0;
  /// Removes every buffer of (job, generation); memory is returned when the
  /// last user drops its RankBufferPtr. Idempotent.
  virtual void DropGeneration(const std::string& job_id, int64_t generation) = 0;
  /// Removes one buffer. Idempotent.
  virtual void Drop(const RankBufferKey& key) = 0;
  /// Called after every DropGeneration and Drop, outside the store's lock,
  /// with the (job, generation) dropped and whether the store still holds a
  /// buffer of that job, so that what the worker service cached of them
  /// goes too (docs/agent.md, "Worker service memory"). One listener (null:
  /// none); it must not be destroyed while a drop may call it.
  using DropListener =
      std::function<void(const std::string& job_id, int64_t generation, bool job_held)>;
  virtual void SetDropListener(DropListener listener) = 0;
  virtual std::vector<RankBufferKey> List() const = 0;
  /// Bytes of rank buffers (spare files not included): what their files
  /// hold, a worker's buffer grown past its plan included until the store
  /// drops it (CheckWorkerBuffer).
  virtual int64_t used_bytes() const = 0;
  virtual int64_t limit_bytes() const = 0;
  /// Bytes of spare files (used_bytes() + spare_bytes() <= limit_bytes(),
  /// unless buffers found at Open exceed the limit).
  virtual int64_t spare_bytes() const = 0;
  /// The spare pool is not refilled while a returned pause lives (e.g. while
  /// a task moves bytes: refilling takes CPU and memory bandwidth). The store
  /// must outlive the pauses.
  [[nodiscard]] virtual std::shared_ptr<void> PauseSpareRefill() = 0;
  /// Waits up to `timeout_s` until the spare pool is as full as it wants to be
  /// and has room for; whether it got there. True without a pool.
  virtual bool WaitForSpares(double timeout_s) = 0;
};

/// ShardStore::MarkRegenerated for each buffer of `keys` (one job
/// generation's new ranks on this host) with the items `regenerate` (a
/// TransferPlan's) lists for its rank; entries of other ranks belong to other
/// hosts.
[[nodiscard]] absl::Status MarkRegenerated(
    ShardStore& store, const std::vector<RankBufferKey>& keys,
    const google::protobuf::RepeatedPtrField<v1::Regenerate>& regenerate);

}  // namespace reshard::agent
