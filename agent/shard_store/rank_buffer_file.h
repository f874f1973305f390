// Internal to the shard store: one rank buffer's shared-memory file, the
// agent's mapping of it, and the file operations around it (allocation,
// read-only remapping, read leases). See docs/agent.md, "Shard store" and
// "Generation lifecycle". Not a public header of the component.
#pragma once

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <unistd.h>

#include <atomic>
#include <csignal>
#include <cstdint>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "agent/shard_store/shard_store.h"

namespace reshard::agent::store_internal {

// A published buffer's private copy while Seal makes it (see CopyForSeal).
inline constexpr char kSealingSuffix[] = ".sealing";

/// "rank buffer of job "J" generation G rank R", for messages.
std::string Describe(const RankBufferKey& k);

std::string HumanBytes(int64_t bytes);

absl::Status ErrnoStatus(const std::string& what, const std::string& path, int err);

// Bytes of mapped buffers; shared with the buffers so that one outliving the
// store still returns its bytes.
struct Accounting {
  std::atomic<int64_t> used{0};
};

// Mode of an unsealed buffer's file: the agent's alone (docs/security.md,
// "Workers"; a worker gets a descriptor, never the path).
inline constexpr mode_t kUnsealedMode = 0600;
// Mode of a sealed buffer's file: read-only, the agent's alone; nobody but
// root may write or truncate it.
inline constexpr mode_t kSealedMode = 0400;

// Sent instead of SIGIO (whose default action ends the process) when a
// process breaks one of our read leases; its default action is to ignore it.
inline constexpr int kLeaseBreakSignal = SIGURG;

class FileReadLease final : public ReadLease {
 public:
  explicit FileReadLease(int fd) : fd_(fd) {}
  ~FileReadLease() override {
    (void)::fcntl(fd_, F_SETLEASE, F_UNLCK);
    ::close(fd_);
  }
  // While a break is pending F_GETLEASE answers the type the lease is being
  // downgraded to (F_UNLCK for a read lease).
  bool Broken() const override { return ::fcntl(fd_, F_GETLEASE) != F_RDLCK; }

 private:
  const int fd_;
};

// Where a buffer's file is: the file must still be this one.
struct FileId {
  dev_t dev = 0;
  ino_t ino = 0;
};

// Replaces the mapping [data, data + size) of `path` with a read-only one at
// the same address (so that this process holds no writer of the file) and,
// when `seal_mode`, makes the file mode 0440.
absl::Status RemapReadOnly(uint8_t* data, int64_t size, const std::string& path, bool seal_mode);

class MappedRankBuffer final : public RankBuffer {
 public:
  MappedRankBuffer(RankBufferKey key, std::string path, uint8_t* data, int64_t size,
                   std::vector<ItemSlot> items, std::shared_ptr<Accounting> accounting,
                   bool published, FileId file)
      : key_(std::move(key)),
        path_(std::move(path)),
        data_(data),
        size_(size),
        items_(std::move(items)),
        accounting_(std::move(accounting)),
        published_(published),
        file_(file) {}
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
  bool published() const override { return published_; }
  std::vector<int32_t> regenerated() const override {
    std::lock_guard<std::mutex> lock(mu_);
    return regenerated_;
  }

  /// OK when `st` (a stat of the buffer's path) is the file the agent
  /// mapped, at its size; DataLoss naming the buffer otherwise.
  absl::Status CheckStat(const struct stat& st) const {
    if (st.st_dev != file_.dev || st.st_ino != file_.ino) {
      return absl::DataLossError(
          absl::StrCat(Describe(key_), ": file \"", path_, "\" was replaced by another file"));
    }
    if (st.st_size != size_) {
      return absl::DataLossError(absl::StrCat(Describe(key_), ": file \"", path_, "\" has ",
                                              st.st_size, " bytes, ", size_,
                                              " expected (truncated or grown by another process)"));
    }
    return absl::OkStatus();
  }

  /// FailedPrecondition naming the buffer and its planned and actual bytes
  /// when `st` (a stat of its file) holds more than the agent planned: a
  /// larger size, or more bytes allocated than the planned size takes
  /// (fallocate past the end). A worker's writable descriptor can do either
  /// (the kernel seals only memfds, not tmpfs files), and those bytes are
  /// outside the memory limit until the buffer goes. OK for another file
  /// (CheckStat says that).
  absl::Status CheckGrowth(const struct stat& st) const;

  absl::Status CheckFile() const override {
    struct stat st {};
    if (::stat(path_.c_str(), &st) != 0) {
      return absl::DataLossError(
          absl::StrCat(Describe(key_), ": file \"", path_, "\" is gone: ", std::strerror(errno)));
    }
    return CheckStat(st);
  }

  absl::StatusOr<std::unique_ptr<ReadLease>> LeaseForReading() const override {
    const int fd = ::open(path_.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
      return absl::DataLossError(
          absl::StrCat(Describe(key_), ": cannot open \"", path_, "\": ", std::strerror(errno)));
    }
    struct stat st {};
    absl::Status s = ::fstat(fd, &st) == 0 ? CheckStat(st) : absl::InternalError("fstat failed");
    if (s.ok() && ::fcntl(fd, F_SETSIG, kLeaseBreakSignal) != 0) {
      s = absl::InternalError(
          absl::StrCat("fcntl(F_SETSIG) on \"", path_, "\": ", std::strerror(errno)));
    }
    if (s.ok() && ::fcntl(fd, F_SETLEASE, F_RDLCK) != 0) {
      const int err = errno;
      s = err == EAGAIN ? absl::FailedPreconditionError(absl::StrCat(
                              Describe(key_), ": file \"", path_,
                              "\" is open for writing by another process (or mapped writable)"))
                        : absl::InternalError(absl::StrCat("fcntl(F_SETLEASE) on \"", path_,
                                                           "\": ", std::strerror(err)));
    }
    if (!s.ok()) {
      ::close(fd);
      return s;
    }
    return std::unique_ptr<ReadLease>(new FileReadLease(fd));
  }

  absl::StatusOr<WorkerFile> OpenForWorker(bool writable) const override {
    // O_NONBLOCK: a writable open that would break a read lease (a Seal in
    // progress) fails at once instead of waiting for the lease to go; the
    // break still tells the Seal to copy (SealPublished).
    const int fd =
        ::open(path_.c_str(), (writable ? O_RDWR | O_NONBLOCK : O_RDONLY) | O_CLOEXEC | O_NOFOLLOW);
    if (fd < 0) {
      const int err = errno;
      if (err == EWOULDBLOCK) {
        return absl::FailedPreconditionError(
            absl::StrCat(Describe(key_), " is being sealed: it cannot be written any more"));
      }
      if (err == ENOENT) {
        return absl::NotFoundError(absl::StrCat(Describe(key_), " was released"));
      }
      return absl::DataLossError(
          absl::StrCat(Describe(key_), ": cannot open \"", path_, "\": ", std::strerror(err)));
    }
    struct stat st {};
    absl::Status s =
        ::fstat(fd, &st) == 0 ? CheckStat(st) : ErrnoStatus("cannot stat", path_, errno);
    if (!s.ok()) {
      ::close(fd);
      return s;
    }
    return WorkerFile{fd, size_};
  }

  absl::Status MakeReadOnly(bool seal_mode) {
    // A published buffer is mapped read-only (from a read-only descriptor)
    // from the start: only the file's mode changes, and the page tables its
    // seal's checksum made stay for the tasks that read it.
    return RemapReadOnly(published_ ? nullptr : data_, size_, path_, seal_mode);
  }

  void SetSealed(std::vector<uint64_t> checksums) {
    std::lock_guard<std::mutex> lock(mu_);
    sealed_ = true;
    checksums_ = std::move(checksums);
  }
  void SetRegenerated(std::vector<int32_t> items) {
    std::lock_guard<std::mutex> lock(mu_);
    regenerated_ = std::move(items);
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
  const bool published_;
  const FileId file_;
  mutable std::mutex mu_;
  bool sealed_ = false;
  std::vector<uint64_t> checksums_;
  std::vector<int32_t> regenerated_;  // ascending item indices
};

// The identity of the open file `fd`.
FileId IdOf(int fd);

// Maps `size` bytes of the open file `fd` (closing it); read-only unless
// `writable`.
absl::StatusOr<uint8_t*> MapAndClose(int fd, const std::string& path, int64_t size,
                                     bool writable = true);

// Zeroes the bytes of [data, data + bytes) outside the items of `slots`
// (laid out in order: LayoutItems).
void ZeroOutsideItems(uint8_t* data, const std::vector<ItemSlot>& slots, int64_t bytes);

// Zeroes [data, data + bytes) of a writable mapping of existing pages,
// mapping them in one call first (no fault per page).
void ZeroPages(uint8_t* data, int64_t bytes);

// madvise(`advice`) over the pages of [data, data + bytes).
absl::Status Populate(uint8_t* data, int64_t bytes, int advice);

// Reserves the pages of a new buffer (`prefault`: and maps them) in one pass:
// a full shm_dir fails here (ResourceExhausted) and not with a SIGBUS on a
// later write. MADV_POPULATE_WRITE on a fresh tmpfs file allocates, zeroes
// and maps each page once; posix_fallocate only reserves them (zeroed on
// first touch), for Backing::kReserved and on kernels before 5.14.
// Only bytes [from, size) are new (`from` is a multiple of the page size).
absl::Status Allocate(uint8_t* data, int64_t from, int64_t size, const std::string& path,
                      bool prefault);

}  // namespace reshard::agent::store_internal
