#include "agent/shard_store/shard_store.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <map>
#include <mutex>
#include <set>
#include <thread>
#include <tuple>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "agent/shard_store/sidecar.h"
#include "agent/shard_store/spare_pool.h"
#include "common/log.h"

namespace reshard::agent {
namespace {

constexpr char kMetaSuffix[] = ".meta";
// CreateAll makes files in parallel from this many bytes in all.
constexpr int64_t kParallelCreateBytes = int64_t{64} << 20;
// Smaller buffers are made fresh (cheap) and leave the spares to larger ones.
constexpr int64_t kMinSpareUse = int64_t{4} << 20;

std::string Describe(const RankBufferKey& k) {
  return absl::StrCat("rank buffer of job \"", k.job_id, "\" generation ", k.generation, " rank ",
                      k.rank);
}

std::string HumanBytes(int64_t bytes) {
  static const char* const kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = static_cast<double>(bytes);
  int unit = 0;
  while (v >= 1024.0 && unit < 4) {
    v /= 1024.0;
    ++unit;
  }
  if (unit == 0) return absl::StrCat(bytes, " B");
  return absl::StrFormat("%.1f %s", v, kUnits[unit]);
}

absl::Status ErrnoStatus(const std::string& what, const std::string& path, int err) {
  const std::string msg = absl::StrCat(what, " \"", path, "\": ", std::strerror(err));
  if (err == ENOSPC || err == ENOMEM || err == EDQUOT) return absl::ResourceExhaustedError(msg);
  if (err == EEXIST) return absl::AlreadyExistsError(msg);
  return absl::InternalError(msg);
}

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

// Bytes of mapped buffers; shared with the buffers so that one outliving the
// store still returns its bytes.
struct Accounting {
  std::atomic<int64_t> used{0};
};

class MappedRankBuffer final : public RankBuffer {
 public:
  MappedRankBuffer(RankBufferKey key, std::string path, uint8_t* data, int64_t size,
                   std::vector<ItemSlot> items, std::shared_ptr<Accounting> accounting)
      : key_(std::move(key)),
        path_(std::move(path)),
        data_(data),
        size_(size),
        items_(std::move(items)),
        accounting_(std::move(accounting)) {}
  ~MappedRankBuffer() override {
    if (data_ != nullptr) ::munmap(data_, static_cast<size_t>(size_));
    accounting_->used -= size_;
  }

  const RankBufferKey& key() const override { return key_; }
  const std::string& path() const override { return path_; }
  uint8_t* data() override { return data_; }
  int64_t size() const override { return size_; }
  const std::vector<ItemSlot>& items() const override { return items_; }
  bool sealed() const override {
    std::lock_guard<std::mutex> lock(mu_);
    return sealed_;
  }
  std::vector<uint64_t> checksums() const override {
    std::lock_guard<std::mutex> lock(mu_);
    return checksums_;
  }
  void SetSealed(std::vector<uint64_t> checksums) {
    std::lock_guard<std::mutex> lock(mu_);
    sealed_ = true;
    checksums_ = std::move(checksums);
  }
  std::vector<int64_t> item_bytes() const {
    std::vector<int64_t> out;
    for (const ItemSlot& s : items_) out.push_back(s.bytes);
    return out;
  }

 private:
  const RankBufferKey key_;
  const std::string path_;
  uint8_t* const data_;  // null when size_ is 0
  const int64_t size_;
  const std::vector<ItemSlot> items_;
  const std::shared_ptr<Accounting> accounting_;
  mutable std::mutex mu_;
  bool sealed_ = false;
  std::vector<uint64_t> checksums_;
};

// Maps `size` bytes of the open file `fd` (closing it).
absl::StatusOr<uint8_t*> MapAndClose(int fd, const std::string& path, int64_t size) {
  uint8_t* data = nullptr;
  if (size > 0) {
    void* p = ::mmap(nullptr, static_cast<size_t>(size), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) {
      const int err = errno;
      ::close(fd);
      return ErrnoStatus("cannot map", path, err);
    }
    data = static_cast<uint8_t*>(p);
  }
  ::close(fd);
  return data;
}

// madvise(`advice`) over the pages of [data, data + bytes).
absl::Status Populate(uint8_t* data, int64_t bytes, int advice) {
  if (bytes <= 0) return absl::OkStatus();
  const uintptr_t page = static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE));
  const uintptr_t begin = reinterpret_cast<uintptr_t>(data) / page * page;
  const uintptr_t end = reinterpret_cast<uintptr_t>(data) + static_cast<uintptr_t>(bytes);
  for (;;) {
    if (::madvise(reinterpret_cast<void*>(begin), end - begin, advice) == 0) {
      return absl::OkStatus();
    }
    const int err = errno;
    if (err == EINTR || err == EAGAIN) continue;
    // EFAULT: a page could not be had (tmpfs full: a write would SIGBUS).
    if (err == EFAULT || err == ENOMEM) return absl::ResourceExhaustedError(std::strerror(err));
    if (err == EINVAL) return absl::UnimplementedError("MADV_POPULATE_* not supported");
    return absl::InternalError(absl::StrCat("madvise(MADV_POPULATE_*): ", std::strerror(err)));
  }
}

// Reserves the pages of a new buffer (`prefault`: and maps them) in one pass:
// a full shm_dir fails here (ResourceExhausted) and not with a SIGBUS on a
// later write. MADV_POPULATE_WRITE on a fresh tmpfs file allocates, zeroes
// and maps each page once; posix_fallocate only reserves them (zeroed on
// first touch), for Backing::kReserved and on kernels before 5.14.
// Only bytes [from, size) are new (`from` is a multiple of the page size).
absl::Status Allocate(uint8_t* data, int64_t from, int64_t size, const std::string& path,
                      bool prefault) {
  if (size <= from) return absl::OkStatus();
  if (prefault) {
#ifdef MADV_POPULATE_WRITE
    const absl::Status s = Populate(data + from, size - from, MADV_POPULATE_WRITE);
#else
    const absl::Status s = absl::UnimplementedError("no MADV_POPULATE_WRITE");
#endif
    if (s.ok() || !absl::IsUnimplemented(s)) {
      return s.ok() ? s
                    : absl::Status(s.code(), absl::StrCat("cannot allocate ", size, " bytes for \"",
                                                          path, "\": ", s.message()));
    }
  }
  const int fd = ::open(path.c_str(), O_RDWR | O_CLOEXEC);
  if (fd < 0) return ErrnoStatus("cannot open", path, errno);
  const int err = ::posix_fallocate(fd, from, size - from);
  ::close(fd);
  if (err != 0) return ErrnoStatus(absl::StrCat("cannot allocate ", size, " bytes for"), path, err);
  return absl::OkStatus();
}

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
      Backing backing) override {
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
    {
      std::lock_guard<std::mutex> lock(mu_);
      for (const RankBufferKey& k : keys) {
        if (buffers_.count(k) != 0) {
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
    }
    // Spares first, the largest buffers first; then the pool gives back
    // what the new buffers need of the limit.
    std::vector<absl::StatusOr<std::shared_ptr<MappedRankBuffer>>> results(
        keys.size(), absl::UnknownError("not created"));
    std::vector<int64_t> spare(keys.size(), 0);
    std::vector<size_t> order(keys.size());
    for (size_t i = 0; i < keys.size(); ++i) order[i] = i;
    std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return sizes[a] > sizes[b]; });
    for (size_t i : order) {
      if (sizes[i] < kMinSpareUse) break;
      absl::StatusOr<int64_t> taken = pool_->TakeInto(sizes[i], PathOf(keys[i]));
      if (!taken.ok()) {
        results[i] = absl::AlreadyExistsError(
            absl::StrCat(Describe(keys[i]), ": file \"", PathOf(keys[i]), "\" already exists"));
      } else {
        spare[i] = *taken;
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
        results[i] = CreateOne(keys[i], item_bytes[i], slots[i], sizes[i], backing, spare[i]);
        if (absl::IsResourceExhausted(results[i].status()) && pool_->bytes() > 0) {
          // shm_dir full: the spares' pages go first.
          pool_->ShrinkTo(0);
          results[i] = CreateOne(keys[i], item_bytes[i], slots[i], sizes[i], backing, 0);
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
      for (const auto& b : created) Unlink(b->path());
      return status;
    }
    pool_->NoteSizes(sizes);
    std::vector<RankBufferPtr> out;
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& b : created) {
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
    std::shared_ptr<MappedRankBuffer> b;
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = buffers_.find(key);
      if (it == buffers_.end()) {
        return absl::NotFoundError(absl::StrCat(Describe(key), " not found"));
      }
      b = it->second;
    }
    const std::vector<ItemSlot>& items = b->items();
    if (!expected.empty() && expected.size() != items.size()) {
      return absl::InvalidArgumentError(absl::StrCat(Describe(key), " has ", items.size(),
                                                     " items, got ", expected.size(),
                                                     " expected checksums"));
    }
    std::vector<uint64_t> sums;
    sums.reserve(items.size());
    for (size_t i = 0; i < items.size(); ++i) {
      sums.push_back(Checksum(b->data() + items[i].offset, static_cast<size_t>(items[i].bytes)));
      if (!expected.empty() && sums[i] != expected[i]) {
        return absl::DataLossError(absl::StrCat(Describe(key), ": item ", i, " (", items[i].bytes,
                                                " bytes) has checksum ",
                                                absl::Hex(sums[i], absl::kZeroPad16), ", expected ",
                                                absl::Hex(expected[i], absl::kZeroPad16)));
      }
    }
    std::lock_guard<std::mutex> lock(mu_);
    auto it = buffers_.find(key);
    if (it == buffers_.end() || it->second != b) {
      return absl::NotFoundError(absl::StrCat(Describe(key), " was dropped while sealing"));
    }
    Sidecar sidecar;
    sidecar.host_id = options_.host_id;
    sidecar.key = key;
    sidecar.item_bytes = b->item_bytes();
    sidecar.sealed = true;
    sidecar.checksums = sums;
    if (absl::Status s = WriteSidecar(b->path() + kMetaSuffix, sidecar); !s.ok()) return s;
    b->SetSealed(sums);
    return sums;
  }

  void DropGeneration(const std::string& job_id, int64_t generation) override {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto it = buffers_.begin(); it != buffers_.end();) {
      if (it->first.job_id == job_id && it->first.generation == generation) {
        Unlink(it->second->path());
        it = buffers_.erase(it);
      } else {
        ++it;
      }
    }
    pool_->Wake();
  }

  void Drop(const RankBufferKey& key) override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = buffers_.find(key);
      if (it == buffers_.end()) return;
      Unlink(it->second->path());
      buffers_.erase(it);
    }
    pool_->Wake();
  }

  std::vector<RankBufferKey> List() const override {
    std::lock_guard<std::mutex> lock(mu_);
    std::vector<RankBufferKey> out;
    for (const auto& [k, b] : buffers_) out.push_back(k);
    return out;
  }

  int64_t used_bytes() const override { return accounting_->used; }
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

  static void Unlink(const std::string& path) {
    ::unlink(path.c_str());
    ::unlink((path + kMetaSuffix).c_str());
  }

  // Creates, sizes and maps one file and writes its unsealed sidecar. The
  // caller has reserved `size` bytes and, when `spare` > 0, renamed a spare
  // file of `spare` bytes (pages allocated and zeroed) to the buffer's path.
  absl::StatusOr<std::shared_ptr<MappedRankBuffer>> CreateOne(
      const RankBufferKey& key, const std::vector<int64_t>& item_bytes, std::vector<ItemSlot> slots,
      int64_t size, Backing backing, int64_t spare) {
    const std::string path = PathOf(key);
    const int fd = spare > 0 ? ::open(path.c_str(), O_RDWR | O_CLOEXEC)
                             : ::open(path.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0660);
    if (fd < 0) {
      const int err = errno;
      if (err == EEXIST) {
        return absl::AlreadyExistsError(
            absl::StrCat(Describe(key), ": file \"", path, "\" already exists"));
      }
      if (spare > 0) ::unlink(path.c_str());
      return ErrnoStatus("cannot create", path, err);
    }
    if (size != spare && ::ftruncate(fd, size) != 0) {
      const int err = errno;
      ::close(fd);
      ::unlink(path.c_str());
      return ErrnoStatus(absl::StrCat("cannot size to ", size, " bytes"), path, err);
    }
    absl::StatusOr<uint8_t*> data = MapAndClose(fd, path, size);
    if (!data.ok()) {
      ::unlink(path.c_str());
      return data.status();
    }
    const int64_t kept = std::min(spare, size);  // allocated and zeroed already
    absl::Status s = Allocate(*data, kept, size, path, backing == Backing::kPrefaulted);
    if (s.ok() && kept > 0 && backing == Backing::kPrefaulted) {
      // Only page tables to fill; harmless if unsupported (writes map them).
      (void)PrefaultPages(*data, kept);
    }
    if (!s.ok()) {
      ::munmap(*data, static_cast<size_t>(size));
      ::unlink(path.c_str());
      return s;
    }
    auto b =
        std::make_shared<MappedRankBuffer>(key, path, *data, size, std::move(slots), accounting_);
    Sidecar sidecar;
    sidecar.host_id = options_.host_id;
    sidecar.key = key;
    sidecar.item_bytes = item_bytes;
    if (absl::Status s = WriteSidecar(path + kMetaSuffix, sidecar); !s.ok()) {
      Unlink(path);
      return s;
    }
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
    int64_t size = 0;
    std::vector<ItemSlot> slots = LayoutItems(sidecar->item_bytes, &size);
    const int fd = ::open(path.c_str(), O_RDWR | O_CLOEXEC);
    if (fd < 0) return ErrnoStatus("cannot open", path, errno);
    struct stat st {};
    if (::fstat(fd, &st) != 0 || st.st_size != size) {
      ::close(fd);
      return absl::InvalidArgumentError(
          absl::StrCat("\"", path, "\" has ", st.st_size, " bytes, the sidecar says ", size));
    }
    absl::StatusOr<uint8_t*> data = MapAndClose(fd, path, size);
    if (!data.ok()) return data.status();
    accounting_->used += size;
    auto b = std::make_shared<MappedRankBuffer>(sidecar->key, path, *data, size, std::move(slots),
                                                accounting_);
    if (sidecar->sealed) b->SetSealed(sidecar->checksums);
    std::lock_guard<std::mutex> lock(mu_);
    buffers_[sidecar->key] = std::move(b);
    return absl::OkStatus();
  }

  const Options options_;
  const std::shared_ptr<Accounting> accounting_;
  mutable std::mutex mu_;
  std::map<RankBufferKey, std::shared_ptr<MappedRankBuffer>, KeyLess> buffers_;
  std::unique_ptr<SparePool> pool_;  // set by StartPool; never null after Open
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
