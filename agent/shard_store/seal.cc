#include "agent/shard_store/seal.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/log.h"

namespace reshard::agent::store_internal {
namespace {

// Reads every item of `b` from its file (pread) into `dst` at the items'
// offsets; DataLoss when the file was replaced, truncated or grown.
absl::Status ReadFileInto(const MappedRankBuffer& b, uint8_t* dst) {
  const int fd = ::open(b.path().c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return ErrnoStatus("cannot open", b.path(), errno);
  struct stat st {};
  absl::Status s =
      ::fstat(fd, &st) == 0 ? b.CheckStat(st) : ErrnoStatus("cannot stat", b.path(), errno);
  for (const ItemSlot& it : b.items()) {
    for (int64_t at = 0; s.ok() && at < it.bytes;) {
      const ssize_t n =
          ::pread(fd, dst + it.offset + at, static_cast<size_t>(it.bytes - at), it.offset + at);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) s = ErrnoStatus("cannot read", b.path(), errno);
      if (n == 0) {
        s = absl::DataLossError(absl::StrCat(Describe(b.key()), ": file \"", b.path(),
                                             "\" was truncated to ", it.offset + at,
                                             " bytes by another process, ", b.size(), " expected"));
      }
      if (n > 0) at += n;
    }
  }
  if (s.ok()) {
    s = ::fstat(fd, &st) == 0 ? b.CheckStat(st) : ErrnoStatus("cannot stat", b.path(), errno);
  }
  ::close(fd);
  return s;
}

// A copy of published buffer `b` in a new file `<path>.sealing`, read with
// pread (a file truncated meanwhile gives a short read, never a SIGBUS),
// and its checksums. The copy counts against the memory limit.
absl::StatusOr<std::shared_ptr<MappedRankBuffer>> CopyForSeal(
    const std::shared_ptr<MappedRankBuffer>& b, const std::shared_ptr<Accounting>& accounting,
    const ReserveCopyFn& reserve, std::vector<uint64_t>* sums) {
  const int64_t size = b->size();
  const std::string& path = b->path();
  const std::string tmp = path + kSealingSuffix;
  if (absl::Status s = reserve(b->key(), size); !s.ok()) return s;
  ::unlink(tmp.c_str());  // a dead agent's leftover
  const int out = ::open(tmp.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, kSealedMode);
  if (out < 0) {
    accounting->used -= size;
    return ErrnoStatus("cannot create", tmp, errno);
  }
  uint8_t* dst = nullptr;
  const FileId id = IdOf(out);
  absl::Status s;
  if (::ftruncate(out, size) != 0) s = ErrnoStatus("cannot size", tmp, errno);
  if (s.ok()) {
    absl::StatusOr<uint8_t*> m = MapAndClose(out, tmp, size);
    if (m.ok()) dst = *m;
    s = m.status();
  } else {
    ::close(out);
  }
  if (s.ok()) s = Allocate(dst, 0, size, tmp, /*prefault=*/true);
  if (s.ok()) s = ReadFileInto(*b, dst);
  if (s.ok()) s = RemapReadOnly(dst, size, tmp, /*seal_mode=*/false);
  if (!s.ok()) {
    if (dst != nullptr) ::munmap(dst, static_cast<size_t>(size));
    ::unlink(tmp.c_str());
    accounting->used -= size;
    return s;
  }
  // The reservation above becomes the copy's own (its destructor returns it).
  auto copy = std::make_shared<MappedRankBuffer>(b->key(), path, dst, size, b->items(), accounting,
                                                 /*published=*/true, id);
  *sums = ChecksumItems(*copy);
  return copy;
}

}  // namespace

// Seal of a sealed buffer: its checksums, if `expected` agrees.
absl::StatusOr<std::vector<uint64_t>> SealedAgain(const MappedRankBuffer& b,
                                                  const std::vector<uint64_t>& expected) {
  std::vector<uint64_t> sums = b.checksums();
  if (!expected.empty()) {
    absl::Status s = CompareChecksums(b.key(), b.items(), sums, expected);
    if (!s.ok()) {
      return absl::DataLossError(absl::StrCat(s.message(), " (the buffer is sealed already)"));
    }
  }
  return sums;
}

absl::Status CompareChecksums(const RankBufferKey& key, const std::vector<ItemSlot>& items,
                              const std::vector<uint64_t>& sums,
                              const std::vector<uint64_t>& expected) {
  for (size_t i = 0; i < items.size(); ++i) {
    if (sums[i] != expected[i]) {
      return absl::DataLossError(absl::StrCat(Describe(key), ": item ", i, " (", items[i].bytes,
                                              " bytes) has checksum ",
                                              absl::Hex(sums[i], absl::kZeroPad16), ", expected ",
                                              absl::Hex(expected[i], absl::kZeroPad16)));
    }
  }
  return absl::OkStatus();
}

std::vector<uint64_t> ChecksumItems(RankBuffer& b) {
  std::vector<uint64_t> sums;
  sums.reserve(b.items().size());
  for (const ItemSlot& it : b.items()) {
    sums.push_back(Checksum(b.data() + it.offset, static_cast<size_t>(it.bytes)));
  }
  return sums;
}

// Checksums a published buffer (`*sums`) and returns what will be its
// sealed self: `b` when no process can write its file any more (a read
// lease was granted: nobody has it open for writing, and nobody can
// truncate it or open it for writing until the lease is gone), else a
// private copy (see CopyForSeal).
absl::StatusOr<std::shared_ptr<MappedRankBuffer>> SealPublished(
    const std::shared_ptr<MappedRankBuffer>& b, const std::shared_ptr<Accounting>& accounting,
    const ReserveCopyFn& reserve, std::vector<uint64_t>* sums,
    std::unique_ptr<ReadLease>* lease_out) {
  absl::StatusOr<std::unique_ptr<ReadLease>> lease = b->LeaseForReading();
  if (lease.ok()) {
    *sums = ChecksumItems(*b);
    if (!(*lease)->Broken()) {
      *lease_out = *std::move(lease);
      return b;
    }
  } else if (!absl::IsFailedPrecondition(lease.status())) {
    return lease.status();  // truncated or replaced: DataLoss
  }
  RESHARD_LOG(INFO) << "shard store: " << Describe(b->key())
                    << " is still writable by another process: sealing a private copy";
  return CopyForSeal(b, accounting, reserve, sums);
}

}  // namespace reshard::agent::store_internal
