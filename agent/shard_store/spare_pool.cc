#include "agent/shard_store/spare_pool.h"

#include <dirent.h>
#include <fcntl.h>
#include <linux/magic.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/statfs.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <limits>
#include <set>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/log.h"

namespace reshard::agent {
namespace {

// Spare sizes are multiples of this.
constexpr int64_t kGranule = int64_t{2} << 20;
// The smallest spare the pool makes before it knows the sizes wanted, and
// the smallest size it learns.
constexpr int64_t kMinSpare = int64_t{16} << 20;
constexpr int64_t kMinLearned = int64_t{4} << 20;
// A fill populates this much between looks at pauses and cancels.
constexpr int64_t kFillSlice = int64_t{16} << 20;
// How often an idle thread looks at the room again (buffers freed).
constexpr auto kRecheck = std::chrono::seconds(1);
// How long the thread waits after a failed fill (e.g. shm_dir full).
constexpr auto kFailedBackoff = std::chrono::seconds(5);

int64_t RoundUp(int64_t v) { return (v + kGranule - 1) / kGranule * kGranule; }

// The refill must not take CPU from transfers: SCHED_IDLE where allowed,
// otherwise the lowest nice value for this thread.
void LowerPriority() {
  sched_param p{};
  if (::pthread_setschedparam(::pthread_self(), SCHED_IDLE, &p) == 0) return;
  (void)::setpriority(PRIO_PROCESS, static_cast<id_t>(::syscall(SYS_gettid)), 19);
}

// Allocates and zeroes the pages of [data, data + bytes) of the file `fd`: a
// fresh tmpfs page is allocated and cleared on its first write fault
// (posix_fallocate would only reserve it, to be cleared on that fault).
bool PopulateWrite(int fd, uint8_t* data, int64_t at, int64_t bytes) {
#ifdef MADV_POPULATE_WRITE
  for (;;) {
    if (::madvise(data + at, static_cast<size_t>(bytes), MADV_POPULATE_WRITE) == 0) return true;
    if (errno == EINTR || errno == EAGAIN) continue;
    if (errno != EINVAL) return false;  // EFAULT: shm_dir full
    break;                              // kernel before 5.14: touch the pages
  }
#endif
  // Reserved first, so that a full shm_dir fails here and not with a SIGBUS.
  if (::posix_fallocate(fd, at, bytes) != 0) return false;
  const int64_t page = ::sysconf(_SC_PAGESIZE);
  for (int64_t i = 0; i < bytes; i += page) reinterpret_cast<volatile uint8_t*>(data + at)[i] = 0;
  return true;
}

// Bytes this host can give to used spares: MemAvailable (/proc/meminfo) less
// a quarter of MemTotal, left for the host's other work (data loaders,
// compilers); tmpfs pages are not "available", so every kept spare lowers it.
// Unknown (no /proc): no limit but the memory limit.
int64_t HostMemoryToSpare() {
  FILE* f = ::fopen("/proc/meminfo", "re");
  if (f == nullptr) return std::numeric_limits<int64_t>::max();
  int64_t total_kb = -1, available_kb = -1;
  char name[64];
  long long kb = 0;
  while (::fscanf(f, "%63s %lld kB\n", name, &kb) == 2) {
    if (std::strcmp(name, "MemTotal:") == 0) total_kb = kb;
    if (std::strcmp(name, "MemAvailable:") == 0) available_kb = kb;
  }
  ::fclose(f);
  if (total_kb < 0 || available_kb < 0) return std::numeric_limits<int64_t>::max();
  return (available_kb - total_kb / 4) * 1024;
}

}  // namespace

SparePool::SparePool(Options options) : options_(std::move(options)) {
  RemoveStale();
  if (options_.target_bytes <= 0 && options_.keep_dropped_s <= 0) return;
  // Elsewhere a spare's pages would be written back to a disk, not kept.
  struct statfs fs {};
  if (::statfs(options_.shm_dir.c_str(), &fs) != 0 || fs.f_type != TMPFS_MAGIC) {
    RESHARD_LOG(INFO) << "shard store: \"" << options_.shm_dir << "\" is not tmpfs; no spare pool";
    return;
  }
  keeping_ = options_.keep_dropped_s > 0;
  thread_ = std::thread([this] { Run(); });
}

SparePool::~SparePool() {
  {
    std::lock_guard<std::mutex> l(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
  for (const Spare& s : ready_) ::unlink(s.path.c_str());
}

void SparePool::RemoveStale() {
  DIR* dir = ::opendir(options_.shm_dir.c_str());
  if (dir == nullptr) return;
  const std::string prefix = absl::StrCat("reshard-", options_.host_id, "-spare-");
  std::vector<std::string> stale;
  while (const dirent* e = ::readdir(dir)) {
    const std::string name = e->d_name;
    if (!absl::StartsWith(name, prefix) || name.size() == prefix.size()) continue;
    const std::string n = name.substr(prefix.size());
    if (std::all_of(n.begin(), n.end(), [](char c) { return absl::ascii_isdigit(c); })) {
      stale.push_back(options_.shm_dir + "/" + name);
    }
  }
  ::closedir(dir);
  for (const std::string& path : stale) ::unlink(path.c_str());
  if (!stale.empty()) {
    RESHARD_LOG(INFO) << "shard store: removed " << stale.size() << " spare files left in \""
                      << options_.shm_dir << "\"";
  }
}

absl::StatusOr<SparePool::Taken> SparePool::TakeInto(int64_t bytes, const std::string& path,
                                                     bool prefer_used) {
  std::lock_guard<std::mutex> l(mu_);
  // Best: the smallest as large, else the largest; at equal size the kind
  // the caller prefers (a used spare given to a buffer that must read zero
  // costs a clearing pass; a clean one given to a buffer its writer
  // overwrites whole wastes the zeroing the pool did).
  size_t best = ready_.size();
  auto better = [&](size_t i, bool fits) {
    if (best == ready_.size()) return true;
    const Spare& a = ready_[i];
    const Spare& b = ready_[best];
    if (a.bytes != b.bytes) return fits ? a.bytes < b.bytes : a.bytes > b.bytes;
    return a.used != b.used && a.used == prefer_used;
  };
  for (int pass = 0; pass < 2 && best == ready_.size(); ++pass) {
    const bool fits = pass == 0;
    for (size_t i = 0; i < ready_.size(); ++i) {
      if (fits && ready_[i].bytes < bytes) continue;
      if (better(i, fits)) best = i;
    }
  }
  if (best == ready_.size()) return Taken{};
  const Spare s = ready_[best];
  // Never replaces `path`: a buffer of that name is someone else's.
  if (::renameat2(AT_FDCWD, s.path.c_str(), AT_FDCWD, path.c_str(), RENAME_NOREPLACE) != 0) {
    int err = errno;
    if (err == EINVAL && ::link(s.path.c_str(), path.c_str()) == 0) {
      ::unlink(s.path.c_str());
      err = 0;
    } else if (err == EINVAL) {
      err = errno;
    }
    if (err == EEXIST) return absl::AlreadyExistsError(absl::StrCat("\"", path, "\" exists"));
    if (err != 0) {
      RESHARD_LOG(WARNING) << "shard store: cannot rename spare \"" << s.path << "\" to \"" << path
                           << "\": " << std::strerror(err);
      return Taken{};
    }
  }
  ready_.erase(ready_.begin() + static_cast<std::ptrdiff_t>(best));
  bytes_ -= s.bytes;
  idle_ = false;
  cv_.notify_all();
  return Taken{s.bytes, s.used};
}

std::string SparePool::NewName() {
  std::lock_guard<std::mutex> l(mu_);
  return absl::StrCat(options_.shm_dir, "/reshard-", options_.host_id, "-spare-", next_id_++);
}

bool SparePool::Keep(const std::string& path, int64_t bytes) {
  if (!keeping_ || bytes <= 0) return false;
  // Within the memory limit, and only while the host has memory to spare:
  // a limit set above what the host really has must not make the kept
  // pages push out its other work.
  if (bytes > HostMemory()) return false;
  const int64_t room = options_.room ? options_.room() : 0;
  std::lock_guard<std::mutex> l(mu_);
  if (stop_ || bytes_ + bytes > room) return false;
  const auto keep = std::chrono::duration_cast<Clock::duration>(
      std::chrono::duration<double>(options_.keep_dropped_s));
  ready_.push_back(Spare{path, bytes, /*used=*/true, Clock::now() + keep});
  bytes_ += bytes;
  cv_.notify_all();  // the thread's next expiry may be this one's
  return true;
}

int64_t SparePool::HostMemory() const {
  return options_.host_memory ? options_.host_memory() : HostMemoryToSpare();
}

int64_t SparePool::FreeLocked(const std::function<bool(int64_t freed)>& more) {
  std::sort(ready_.begin(), ready_.end(), [](const Spare& a, const Spare& b) {
    return a.used != b.used ? b.used : a.bytes > b.bytes;
  });
  int64_t freed = 0;
  while (!ready_.empty() && more(freed)) {
    ::unlink(ready_.back().path.c_str());
    bytes_ -= ready_.back().bytes;
    freed += ready_.back().bytes;
    ready_.pop_back();
  }
  return freed;
}

SparePool::Clock::time_point SparePool::ExpireLocked(Clock::time_point now, int64_t host) {
  // The host needs memory back: spares go until it does not.
  if (!ready_.empty()) {
    const int64_t short_by = -host;
    if (short_by > 0) {
      const int64_t freed = FreeLocked([&](int64_t n) { return n < short_by; });
      RESHARD_LOG(INFO) << "shard store: the host is short of memory: freed " << freed
                        << " bytes of spares";
    }
  }
  Clock::time_point next = now + std::chrono::hours(1);
  for (auto it = ready_.begin(); it != ready_.end();) {
    if (it->used && it->expires <= now) {
      ::unlink(it->path.c_str());
      bytes_ -= it->bytes;
      it = ready_.erase(it);
      continue;
    }
    if (it->used) next = std::min(next, it->expires);
    ++it;
  }
  return next;
}

void SparePool::ShrinkTo(int64_t max_bytes) {
  std::unique_lock<std::mutex> l(mu_);
  if (bytes_ <= max_bytes) return;
  if (filling_bytes_ > 0) {
    cancel_fill_ = true;
    cv_.notify_all();
    cv_.wait(l, [&] { return filling_bytes_ == 0; });
  }
  FreeLocked([&](int64_t) { return bytes_ > max_bytes; });
  idle_ = false;
}

void SparePool::Pause() {
  std::lock_guard<std::mutex> l(mu_);
  ++pauses_;
}

void SparePool::Resume() {
  {
    std::lock_guard<std::mutex> l(mu_);
    --pauses_;
  }
  cv_.notify_all();
}

void SparePool::NoteSizes(std::vector<int64_t> sizes) {
  std::vector<int64_t> wanted;
  for (int64_t s : sizes) {
    if (s >= kMinLearned) wanted.push_back(RoundUp(s));
  }
  if (wanted.empty()) return;
  std::sort(wanted.rbegin(), wanted.rend());
  {
    std::lock_guard<std::mutex> l(mu_);
    wanted_ = std::move(wanted);
    idle_ = false;
  }
  cv_.notify_all();
}

void SparePool::Wake() {
  {
    std::lock_guard<std::mutex> l(mu_);
    failed_ = false;
    idle_ = false;
  }
  cv_.notify_all();
}

bool SparePool::WaitFilled(double timeout_s) {
  if (!thread_.joinable()) return true;
  std::unique_lock<std::mutex> l(mu_);
  cv_.notify_all();
  return cv_.wait_for(l, std::chrono::duration<double>(timeout_s), [&] {
    return (idle_ && filling_bytes_ == 0) || failed_;
  }) && !failed_;
}

int64_t SparePool::bytes() const {
  std::lock_guard<std::mutex> l(mu_);
  return bytes_;
}

int64_t SparePool::NextSize(int64_t cap) const {
  const int64_t target = options_.target_bytes / kGranule * kGranule;
  if (target <= 0) return 0;  // used spares only (Keep)
  // The spares wanted: the sizes of the last buffers made, repeated; before
  // any, a mix of sizes (a quarter of the target twice, an eighth twice, ...)
  // so that both one large buffer and several small ones find a spare.
  std::vector<int64_t> want;
  int64_t sum = 0;
  if (!wanted_.empty()) {
    for (size_t i = 0;; ++i) {
      const int64_t s = std::min(wanted_[i % wanted_.size()], target);
      if (sum + s > target) break;
      want.push_back(s);
      sum += s;
    }
  } else {
    for (int k = 0;; ++k) {
      const int64_t s = std::max(kMinSpare, RoundUp(target >> (2 + k / 2)));
      if (sum + s > target) break;
      want.push_back(s);
      sum += s;
    }
  }
  std::multiset<int64_t> have;
  for (const Spare& s : ready_) {
    if (!s.used) have.insert(s.bytes);  // a used spare serves fewer buffers
  }
  for (int64_t s : want) {
    auto it = have.find(s);
    if (it != have.end()) {
      have.erase(it);
    } else if (bytes_ + s <= cap) {
      return s;
    }
  }
  return 0;
}

void SparePool::Run() {
  LowerPriority();
  std::unique_lock<std::mutex> l(mu_);
  Clock::time_point retry_at;  // after a failed fill: when to try again
  while (!stop_) {
    // One reading of the host's memory per pass (it reads /proc/meminfo),
    // for the pressure release and for the fill's cap. The cap uses it as
    // read before the release: a pass that found the host short fills nothing.
    const int64_t host = HostMemory();
    const Clock::time_point expiry = ExpireLocked(Clock::now(), host);
    if (failed_) {
      if (retry_at == Clock::time_point()) retry_at = Clock::now() + kFailedBackoff;
      cv_.wait_until(l, std::min(expiry, retry_at), [&] { return stop_ || !failed_; });
      if (failed_ && Clock::now() >= retry_at) failed_ = false;
      if (!failed_) retry_at = Clock::time_point();
      continue;
    }
    if (pauses_ > 0) {
      cv_.wait_until(l, std::min(expiry, Clock::now() + kRecheck),
                     [&] { return stop_ || pauses_ == 0; });
      continue;
    }
    const int64_t cap =
        std::min({options_.target_bytes, options_.room ? options_.room() : 0,
                  host > std::numeric_limits<int64_t>::max() - bytes_ ? host : bytes_ + host});
    const int64_t size = NextSize(cap);
    if (size == 0) {
      idle_ = true;
      cv_.notify_all();
      cv_.wait_until(l, std::min(expiry, Clock::now() + kRecheck), [&] { return stop_ || !idle_; });
      continue;
    }
    idle_ = false;
    filling_bytes_ = size;
    bytes_ += size;
    cancel_fill_ = false;
    l.unlock();
    const bool ok = Fill(size);
    l.lock();
    if (!ok) {
      bytes_ -= size;
      if (!cancel_fill_) failed_ = true;
    }
    filling_bytes_ = 0;
    cancel_fill_ = false;
    cv_.notify_all();
  }
}

bool SparePool::Fill(int64_t bytes) {
  uint64_t id;
  {
    std::lock_guard<std::mutex> l(mu_);
    id = next_id_++;
  }
  const std::string path =
      absl::StrCat(options_.shm_dir, "/reshard-", options_.host_id, "-spare-", id);
  const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd < 0) {
    RESHARD_LOG(WARNING) << "shard store: cannot create spare \"" << path
                         << "\": " << std::strerror(errno);
    return false;
  }
  void* p = MAP_FAILED;
  if (::ftruncate(fd, bytes) == 0) {
    p = ::mmap(nullptr, static_cast<size_t>(bytes), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  }
  bool ok = p != MAP_FAILED;
  if (!ok) {
    RESHARD_LOG(WARNING) << "shard store: cannot make spare \"" << path << "\" of " << bytes
                         << " bytes: " << std::strerror(errno);
  }
  uint8_t* data = static_cast<uint8_t*>(p);
  for (int64_t at = 0; ok && at < bytes; at += kFillSlice) {
    {
      std::unique_lock<std::mutex> l(mu_);
      cv_.wait(l, [&] { return stop_ || cancel_fill_ || pauses_ == 0; });
      if (stop_ || cancel_fill_) {
        ok = false;
        break;
      }
    }
    ok = PopulateWrite(fd, data, at, std::min(kFillSlice, bytes - at));
  }
  if (p != MAP_FAILED) ::munmap(p, static_cast<size_t>(bytes));
  ::close(fd);
  if (!ok) {
    ::unlink(path.c_str());
    return false;
  }
  std::lock_guard<std::mutex> l(mu_);
  ready_.push_back(Spare{path, bytes, /*used=*/false, {}});
  return true;
}

}  // namespace reshard::agent
