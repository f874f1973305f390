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

// The word for each store in messages: what the buffers of `key` are called.
const char* KindOf(const ShardStore&) { return "host"; }
const char* KindOf(const DeviceBufferStore&) { return "device"; }

// FailedPrecondition: `key` in `store` is not sealed (a host buffer is named
// without its kind).
absl::Status NotSealed(const ShardStore&, const RankBufferKey& key) {
  return absl::FailedPreconditionError(
      absl::StrCat(Describe(key), " is not sealed: only sealed buffers are staged"));
}
absl::Status NotSealed(const DeviceBufferStore&, const RankBufferKey& key) {
  return absl::FailedPreconditionError(
      absl::StrCat("device ", Describe(key), " is not sealed: only sealed buffers are staged"));
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

// The skeleton of StageToHost and StageToDevice: the sealed buffer `key` of
// `from` copied into `to` and sealed there with its checksums.
// create(src) makes the copy's buffer in `to`; copy(src, dst, item, offset,
// bytes) moves one chunk of an item into it.
template <typename From, typename To, typename Create, typename Copy>
auto Stage(From& from, To& to, const RankBufferKey& key, const Create& create, const Copy& copy)
    -> decltype(to.Get(key)) {
  auto got = from.Get(key);
  if (!got.ok()) {
    // Already in `to` only (e.g. a generation that never was on a device
    // here): that one, once sealed.
    auto there = to.Get(key);
    if (!there.ok()) {
      return absl::NotFoundError(
          absl::StrCat("no ", KindOf(from), " or ", KindOf(to), " ", Describe(key)));
    }
    if (!(*there)->sealed()) return NotSealed(to, key);
    return *there;
  }
  auto& src = **got;
  if (!src.sealed()) return NotSealed(from, key);
  const std::vector<uint64_t> sums = src.checksums();
  if (auto there = to.Get(key); there.ok()) {
    if (absl::Status s =
            CheckExisting(key, KindOf(to), (*there)->sealed(), (*there)->checksums(), sums);
        !s.ok()) {
      return s;
    }
    return *there;
  }
  auto made = create(src);
  if (!made.ok()) return made.status();
  auto& dst = *(*made)[0];
  absl::Status st = [&]() -> absl::Status {
    if (absl::Status s = ForEachChunk(
            src.items(),
            [&](int item, int64_t off, int64_t n) { return copy(src, dst, item, off, n); });
        !s.ok()) {
      return s;
    }
    // The copy's own checksums must be the original's: bytes that changed on
    // the way (or a host file changed under the copy) are DataLoss, and the
    // copy goes.
    absl::StatusOr<std::vector<uint64_t>> sealed = to.Seal(key, sums);
    return sealed.ok() ? absl::OkStatus() : sealed.status();
  }();
  if (!st.ok()) {
    to.Drop(key);
    return st;
  }
  return (*made)[0];
}

}  // namespace

absl::StatusOr<RankBufferPtr> StageToHost(DeviceBufferStore& devices, ShardStore& host,
                                          const RankBufferKey& key) {
  return Stage(
      devices, host, key,
      [&](const DeviceRankBuffer& src) { return host.CreateAll({key}, {ItemBytes(src.items())}); },
      [&](const DeviceRankBuffer&, RankBuffer& dst, int item, int64_t off, int64_t n) {
        return devices.ReadItem(key, item, off, dst.item_data(item) + off, n);
      });
}

absl::StatusOr<DeviceRankBufferPtr> StageToDevice(ShardStore& host, DeviceBufferStore& devices,
                                                  const RankBufferKey& key, int device) {
  return Stage(
      host, devices, key,
      [&](RankBuffer& src) -> absl::StatusOr<std::vector<DeviceRankBufferPtr>> {
        if (absl::Status s = src.CheckFile(); !s.ok()) return s;
        return devices.CreateAll({key}, {device}, {ItemBytes(src.items())});
      },
      [&](RankBuffer& src, const DeviceRankBuffer&, int item, int64_t off, int64_t n) {
        return devices.WriteItem(key, item, off, src.item_data(item) + off, n);
      });
}

}  // namespace reshard::agent
