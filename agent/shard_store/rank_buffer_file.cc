#include "agent/shard_store/rank_buffer_file.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "absl/strings/str_format.h"

namespace reshard::agent::store_internal {

absl::Status RemapReadOnly(uint8_t* data, int64_t size, const std::string& path, bool seal_mode) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return ErrnoStatus("cannot open", path, errno);
  absl::Status s;
  if (data != nullptr && ::mmap(data, static_cast<size_t>(size), PROT_READ, MAP_SHARED | MAP_FIXED,
                                fd, 0) == MAP_FAILED) {
    s = ErrnoStatus("cannot map read-only", path, errno);
  }
  if (s.ok() && seal_mode && ::fchmod(fd, kSealedMode) != 0) {
    s = ErrnoStatus("cannot make read-only", path, errno);
  }
  ::close(fd);
  return s;
}

absl::Status MappedRankBuffer::CheckGrowth(const struct stat& st) const {
  // A tmpfs with huge pages may allocate the last page whole: 2 MiB of slack
  // past the planned size is not growth.
  constexpr int64_t kAllocationSlack = int64_t{2} << 20;
  if (st.st_dev != file_.dev || st.st_ino != file_.ino) return absl::OkStatus();  // CheckStat's
  const int64_t allocated = static_cast<int64_t>(st.st_blocks) * 512;
  const int64_t allowed = (size_ + kAllocationSlack - 1) / kAllocationSlack * kAllocationSlack;
  if (st.st_size <= size_ && allocated <= allowed) return absl::OkStatus();
  const int64_t holds = std::max<int64_t>(st.st_size, allocated);
  return absl::FailedPreconditionError(absl::StrCat(
      Describe(key_), " holds ", holds, " bytes (", HumanBytes(holds), ": size ", st.st_size,
      ", allocated ", allocated, "), ", size_, " bytes (", HumanBytes(size_),
      ") planned: a worker may write its buffer but not grow it (ftruncate, fallocate or a "
      "write past its end); the buffer was dropped and its memory freed: publish the rank again"));
}

FileId IdOf(int fd) {
  struct stat st {};
  if (::fstat(fd, &st) != 0) return FileId{};
  return FileId{st.st_dev, st.st_ino};
}

absl::StatusOr<uint8_t*> MapAndClose(int fd, const std::string& path, int64_t size, bool writable) {
  uint8_t* data = nullptr;
  if (size > 0) {
    void* p = ::mmap(nullptr, static_cast<size_t>(size),
                     writable ? PROT_READ | PROT_WRITE : PROT_READ, MAP_SHARED, fd, 0);
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

void ZeroOutsideItems(uint8_t* data, const std::vector<ItemSlot>& slots, int64_t bytes) {
  int64_t at = 0;
  auto zero_to = [&](int64_t end) {
    end = std::min(end, bytes);
    if (end > at) std::memset(data + at, 0, static_cast<size_t>(end - at));
  };
  for (const ItemSlot& slot : slots) {
    zero_to(slot.offset);
    at = std::max(at, slot.offset + slot.bytes);
  }
  zero_to(bytes);
}

void ZeroPages(uint8_t* data, int64_t bytes) {
  if (bytes <= 0) return;
#ifdef MADV_POPULATE_WRITE
  (void)Populate(data, bytes, MADV_POPULATE_WRITE);  // else the writes fault them in
#endif
  std::memset(data, 0, static_cast<size_t>(bytes));
}

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
    if (err == EFAULT) {
      return absl::ResourceExhaustedError(
          "no space left on device: the file system of shm_dir has no free pages");
    }
    if (err == ENOMEM) return absl::ResourceExhaustedError(std::strerror(err));
    if (err == EINVAL) return absl::UnimplementedError("MADV_POPULATE_* not supported");
    return absl::InternalError(absl::StrCat("madvise(MADV_POPULATE_*): ", std::strerror(err)));
  }
}

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

}  // namespace reshard::agent::store_internal
