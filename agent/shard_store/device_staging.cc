#include "agent/shard_store/device_staging.h"

#include <algorithm>
#include <functional>
#include <vector>

#include "absl/strings/str_cat.h"
#include "agent/shard_store/rank_buffer_file.h"

namespace reshard::agent {

using store_internal::Describe;

namespace {

// Bytes of one device API copy: an item moves in pieces of at most this.
constexpr int64_t kStagingChunkBytes = int64_t{64} << 20;

std::vector<int64_t> ItemBytes(const std::vector<ItemSlot>& items) {
  std::vector<int64_t> bytes;
  bytes.reserve(items.size());
  for (const ItemSlot& s : items) bytes.push_back(s.bytes);
  return bytes;
}

// copy(item, offset, bytes) for every chunk of every item, in order; the
// first error.
absl::Status ForEachChunk(const std::vector<ItemSlot>& items,
                          const std::function<absl::Status(int, int64_t, int64_t)>& copy) {
  for (size_t i = 0; i < items.size(); ++i) {
    for (int64_t off = 0; off < items[i].bytes; off += kStagingChunkBytes) {
      const int64_t n = std::min(kStagingChunkBytes, items[i].bytes - off);
      if (absl::Status s = copy(static_cast<int>(i), off, n); !s.ok()) return s;
    }
  }
  return absl::OkStatus();
}

// FailedPrecondition unless `existing` (the copy's store already holds
// `key`) is sealed with `sums`.
absl::Status CheckExisting(const RankBufferKey& key, const char* kind, bool sealed,
                           const std::vector<uint64_t>& existing,
                           const std::vector<uint64_t>& sums) {
  if (!sealed) {
    return absl::FailedPreconditionError(absl::StrCat(
        kind, " ", Describe(key), " exists unsealed: it cannot be staged over"));
  }
  if (existing != sums) {
    return absl::FailedPreconditionError(absl::StrCat(
        kind, " ", Describe(key), " exists sealed with other checksums than the one staged"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<RankBufferPtr> StageToHost(DeviceBufferStore& devices, ShardStore& host,
                                          const RankBufferKey& key) {
  absl::StatusOr<DeviceRankBufferPtr> d = devices.Get(key);
  if (!d.ok()) {
    // Already a host buffer only (e.g. a generation that never was on a
    // device here): that one, once sealed.
    absl::StatusOr<RankBufferPtr> h = host.Get(key);
    if (!h.ok()) return absl::NotFoundError(absl::StrCat("no device or host ", Describe(key)));
    if (!(*h)->sealed()) {
      return absl::FailedPreconditionError(
          absl::StrCat(Describe(key), " is not sealed: only sealed buffers are staged"));
    }
    return *h;
  }
  const DeviceRankBuffer& src = **d;
  if (!src.sealed()) {
    return absl::FailedPreconditionError(
        absl::StrCat("device ", Describe(key), " is not sealed: only sealed buffers are staged"));
  }
  const std::vector<uint64_t> sums = src.checksums();
  if (absl::StatusOr<RankBufferPtr> h = host.Get(key); h.ok()) {
    if (absl::Status s = CheckExisting(key, "host", (*h)->sealed(), (*h)->checksums(), sums);
        !s.ok()) {
      return s;
    }
    return *h;
  }
  absl::StatusOr<std::vector<RankBufferPtr>> made =
      host.CreateAll({key}, {ItemBytes(src.items())});
  if (!made.ok()) return made.status();
  RankBuffer& dst = *(*made)[0];
  absl::Status st = [&]() -> absl::Status {
    if (absl::Status s = ForEachChunk(src.items(),
                                      [&](int item, int64_t off, int64_t n) {
                                        return devices.ReadItem(key, item, off,
                                                                dst.item_data(item) + off, n);
                                      });
        !s.ok()) {
      return s;
    }
    absl::StatusOr<std::vector<uint64_t>> sealed = host.Seal(key, sums);
    return sealed.ok() ? absl::OkStatus() : sealed.status();
  }();
  if (!st.ok()) {
    host.Drop(key);
    return st;
  }
  return (*made)[0];
}

absl::StatusOr<DeviceRankBufferPtr> StageToDevice(ShardStore& host, DeviceBufferStore& devices,
                                                  const RankBufferKey& key, int device) {
  absl::StatusOr<RankBufferPtr> h = host.Get(key);
  if (!h.ok()) {
    absl::StatusOr<DeviceRankBufferPtr> d = devices.Get(key);
    if (!d.ok()) return absl::NotFoundError(absl::StrCat("no host or device ", Describe(key)));
    if (!(*d)->sealed()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "device ", Describe(key), " is not sealed: only sealed buffers are staged"));
    }
    return *d;
  }
  RankBuffer& src = **h;
  if (!src.sealed()) {
    return absl::FailedPreconditionError(
        absl::StrCat(Describe(key), " is not sealed: only sealed buffers are staged"));
  }
  const std::vector<uint64_t> sums = src.checksums();
  if (absl::StatusOr<DeviceRankBufferPtr> d = devices.Get(key); d.ok()) {
    if (absl::Status s = CheckExisting(key, "device", (*d)->sealed(), (*d)->checksums(), sums);
        !s.ok()) {
      return s;
    }
    return *d;
  }
  if (absl::Status s = src.CheckFile(); !s.ok()) return s;
  absl::StatusOr<std::vector<DeviceRankBufferPtr>> made =
      devices.CreateAll({key}, {device}, {ItemBytes(src.items())});
  if (!made.ok()) return made.status();
  absl::Status st = [&]() -> absl::Status {
    if (absl::Status s = ForEachChunk(src.items(),
                                      [&](int item, int64_t off, int64_t n) {
                                        return devices.WriteItem(key, item, off,
                                                                 src.item_data(item) + off, n);
                                      });
        !s.ok()) {
      return s;
    }
    // The device copy's own checksums must be the host buffer's: bytes that
    // changed on the way (or a host file changed under the copy) are
    // DataLoss, and the copy goes.
    absl::StatusOr<std::vector<uint64_t>> sealed = devices.Seal(key, sums);
    return sealed.ok() ? absl::OkStatus() : sealed.status();
  }();
  if (!st.ok()) {
    devices.Drop(key);
    return st;
  }
  return (*made)[0];
}

}  // namespace reshard::agent
