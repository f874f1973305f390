#include "agent/shard_store/device_buffer.h"

#include <xxhash.h>

#include <algorithm>
#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "agent/shard_store/rank_buffer_file.h"
#include "agent/shard_store/seal.h"

namespace reshard::agent {

using store_internal::CompareChecksums;
using store_internal::Describe;
using store_internal::HumanBytes;

struct DeviceRankBuffer::Accounting {
  std::mutex mu;
  std::vector<int64_t> used;  // per device
};

namespace {

// A stream of `device` for one call, destroyed (after its work) on scope exit.
class ScopedStream {
 public:
  static absl::StatusOr<ScopedStream> Create(DeviceApi* api, int device) {
    absl::StatusOr<DeviceStream> s = api->CreateStream(device);
    if (!s.ok()) return s.status();
    return ScopedStream(api, *s);
  }
  ScopedStream(ScopedStream&& o) noexcept : api_(std::exchange(o.api_, nullptr)), s_(o.s_) {}
  ScopedStream& operator=(ScopedStream&&) = delete;
  ~ScopedStream() {
    if (api_ != nullptr) (void)api_->DestroyStream(s_);
  }
  DeviceStream get() const { return s_; }

 private:
  ScopedStream(DeviceApi* api, DeviceStream s) : api_(api), s_(s) {}
  DeviceApi* api_;
  DeviceStream s_;
};

}  // namespace

DeviceRankBuffer::DeviceRankBuffer(RankBufferKey key, int device, void* data, int64_t size,
                                   std::vector<ItemSlot> items, DeviceApi* api,
                                   std::shared_ptr<Accounting> accounting)
    : key_(std::move(key)),
      device_(device),
      data_(data),
      size_(size),
      items_(std::move(items)),
      api_(api),
      accounting_(std::move(accounting)) {}

DeviceRankBuffer::~DeviceRankBuffer() {
  (void)api_->Free(device_, data_);
  std::lock_guard<std::mutex> l(accounting_->mu);
  accounting_->used[device_] -= size_;
}

bool DeviceRankBuffer::sealed() const {
  std::lock_guard<std::mutex> l(accounting_->mu);
  return sealed_;
}

std::vector<uint64_t> DeviceRankBuffer::checksums() const {
  std::lock_guard<std::mutex> l(accounting_->mu);
  return checksums_;
}

DeviceBufferStore::DeviceBufferStore(DeviceApi* api, const Options& options,
                                     std::vector<int64_t> limits)
    : api_(api),
      options_(options),
      limits_(std::move(limits)),
      accounting_(std::make_shared<DeviceRankBuffer::Accounting>()),
      pinned_(std::make_unique<PinnedHostPool>(api, options.pinned_keep_bytes)) {
  accounting_->used.assign(limits_.size(), 0);
}

absl::StatusOr<std::unique_ptr<DeviceBufferStore>> DeviceBufferStore::Open(
    DeviceApi* api, const Options& options) {
  if (options.memory_limit_bytes_per_device < 0) {
    return absl::InvalidArgumentError(absl::StrCat("memory_limit_bytes_per_device ",
                                                   options.memory_limit_bytes_per_device,
                                                   " is negative"));
  }
  if (options.staging_bytes < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("staging_bytes ", options.staging_bytes, " is below 1"));
  }
  if (options.pinned_keep_bytes < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("pinned_keep_bytes ", options.pinned_keep_bytes, " is negative"));
  }
  std::vector<int64_t> limits;
  for (int d = 0; d < api->capabilities().device_count; ++d) {
    absl::StatusOr<DeviceMemoryInfo> info = api->MemoryInfo(d);
    if (!info.ok()) return info.status();
    limits.push_back(options.memory_limit_bytes_per_device > 0
                         ? options.memory_limit_bytes_per_device
                         : info->total_bytes);
  }
  return std::unique_ptr<DeviceBufferStore>(new DeviceBufferStore(api, options, std::move(limits)));
}

absl::StatusOr<std::vector<DeviceRankBufferPtr>> DeviceBufferStore::CreateAll(
    const std::vector<RankBufferKey>& keys, const std::vector<int>& devices,
    const std::vector<std::vector<int64_t>>& item_bytes) {
  if (devices.size() != keys.size() || item_bytes.size() != keys.size()) {
    return absl::InvalidArgumentError(absl::StrCat(keys.size(), " keys, ", devices.size(),
                                                   " devices and ", item_bytes.size(),
                                                   " item lists: one each per buffer"));
  }
  if (keys.empty()) return std::vector<DeviceRankBufferPtr>();
  std::vector<std::vector<ItemSlot>> slots(keys.size());
  std::vector<int64_t> sizes(keys.size());
  std::vector<int64_t> needed(limits_.size(), 0);
  for (size_t i = 0; i < keys.size(); ++i) {
    if (devices[i] < 0 || devices[i] >= static_cast<int>(limits_.size())) {
      return absl::InvalidArgumentError(absl::StrCat(Describe(keys[i]), ": device ", devices[i],
                                                     " out of range [0, ", limits_.size(), ")"));
    }
    slots[i] = LayoutItems(item_bytes[i], &sizes[i]);
    needed[devices[i]] += sizes[i];
  }
  {
    // Reserve the bytes first, so that concurrent CreateAll calls never
    // overshoot a limit; given back below on failure.
    std::lock_guard<std::mutex> l(accounting_->mu);
    for (const RankBufferKey& k : keys) {
      if (buffers_.count({k.job_id, k.generation, k.rank}) > 0) {
        return absl::AlreadyExistsError(absl::StrCat("device ", Describe(k), " exists"));
      }
    }
    for (size_t d = 0; d < limits_.size(); ++d) {
      const int64_t free_bytes = limits_[d] - accounting_->used[d];
      if (needed[d] > 0 && needed[d] > free_bytes) {
        return absl::ResourceExhaustedError(absl::StrCat(
            "device ", d, ": ", keys.size(), " buffer(s) of job \"", keys[0].job_id,
            "\" generation ", keys[0].generation, " need ", HumanBytes(needed[d]), " there, ",
            HumanBytes(std::max<int64_t>(free_bytes, 0)), " free of its ", HumanBytes(limits_[d]),
            " limit (", HumanBytes(accounting_->used[d]), " in use)"));
      }
    }
    for (size_t d = 0; d < limits_.size(); ++d) accounting_->used[d] += needed[d];
  }
  // From here each buffer made gives its bytes back when dropped; the rest
  // of the reservation is given back on failure.
  std::vector<DeviceRankBufferPtr> made;
  absl::Status failed;
  for (size_t i = 0; i < keys.size() && failed.ok(); ++i) {
    absl::StatusOr<void*> p = api_->Malloc(devices[i], static_cast<size_t>(sizes[i]));
    if (!p.ok()) {
      failed = p.status();
      break;
    }
    made.push_back(DeviceRankBufferPtr(new DeviceRankBuffer(
        keys[i], devices[i], *p, sizes[i], std::move(slots[i]), api_, accounting_)));
    absl::StatusOr<ScopedStream> s = ScopedStream::Create(api_, devices[i]);
    failed = s.ok() ? api_->MemsetAsync(*p, 0, sizes[i], s->get()) : s.status();
    if (failed.ok()) failed = api_->StreamSynchronize(s->get());
  }
  std::lock_guard<std::mutex> l(accounting_->mu);
  if (!failed.ok()) {
    for (size_t i = made.size(); i < keys.size(); ++i) accounting_->used[devices[i]] -= sizes[i];
    return failed;
  }
  for (const DeviceRankBufferPtr& b : made) {
    const RankBufferKey& k = b->key();
    if (!buffers_.emplace(KeyTuple{k.job_id, k.generation, k.rank}, b).second) {
      // A concurrent CreateAll of the same key won: undo ours.
      for (const DeviceRankBufferPtr& m : made) {
        if (m != b) buffers_.erase({m->key().job_id, m->key().generation, m->key().rank});
      }
      return absl::AlreadyExistsError(absl::StrCat("device ", Describe(k), " exists"));
    }
  }
  return made;
}

DeviceReservation::DeviceReservation(DeviceReservation&& o) noexcept
    : accounting_(std::move(o.accounting_)),
      device_(o.device_),
      bytes_(std::exchange(o.bytes_, 0)) {}

DeviceReservation& DeviceReservation::operator=(DeviceReservation&& o) noexcept {
  if (this != &o) {
    Release();
    accounting_ = std::move(o.accounting_);
    device_ = o.device_;
    bytes_ = std::exchange(o.bytes_, 0);
  }
  return *this;
}

DeviceReservation::~DeviceReservation() { Release(); }

void DeviceReservation::Release() {
  if (accounting_ != nullptr && bytes_ > 0) {
    std::lock_guard<std::mutex> l(accounting_->mu);
    accounting_->used[device_] -= bytes_;
  }
  bytes_ = 0;
  accounting_.reset();
}

absl::StatusOr<DeviceReservation> DeviceBufferStore::Reserve(int device, int64_t bytes,
                                                             const std::string& what) {
  if (device < 0 || device >= static_cast<int>(limits_.size()) || bytes < 0) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": ", bytes, " bytes on device ", device,
                                                   " (devices [0, ", limits_.size(), "))"));
  }
  std::lock_guard<std::mutex> l(accounting_->mu);
  const int64_t free_bytes = limits_[device] - accounting_->used[device];
  if (bytes > 0 && bytes > free_bytes) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "device ", device, ": ", what, " needs ", HumanBytes(bytes), " there, ",
        HumanBytes(std::max<int64_t>(free_bytes, 0)), " free of its ", HumanBytes(limits_[device]),
        " limit (", HumanBytes(accounting_->used[device]), " in use)"));
  }
  accounting_->used[device] += bytes;
  return DeviceReservation(accounting_, device, bytes);
}

absl::StatusOr<DeviceRankBufferPtr> DeviceBufferStore::Get(const RankBufferKey& key) const {
  std::lock_guard<std::mutex> l(accounting_->mu);
  auto it = buffers_.find({key.job_id, key.generation, key.rank});
  if (it == buffers_.end()) {
    return absl::NotFoundError(absl::StrCat("no device ", Describe(key)));
  }
  return it->second;
}

absl::StatusOr<DeviceRankBufferPtr> DeviceBufferStore::Locate(const RankBufferKey& key, int item,
                                                              int64_t offset, int64_t bytes) const {
  absl::StatusOr<DeviceRankBufferPtr> b = Get(key);
  if (!b.ok()) return b.status();
  if (item < 0 || item >= static_cast<int>((*b)->items().size())) {
    return absl::OutOfRangeError(absl::StrCat("device ", Describe(key), ": item ", item,
                                              " out of range [0, ", (*b)->items().size(), ")"));
  }
  const ItemSlot& slot = (*b)->items()[item];
  if (offset < 0 || bytes < 0 || offset + bytes > slot.bytes) {
    return absl::OutOfRangeError(absl::StrCat("device ", Describe(key), ": bytes [", offset, ", ",
                                              offset + bytes, ") of item ", item, " pass its ",
                                              slot.bytes, " bytes"));
  }
  return b;
}

absl::Status DeviceBufferStore::WriteItem(const RankBufferKey& key, int item, int64_t offset,
                                          const void* src, int64_t bytes) {
  absl::StatusOr<DeviceRankBufferPtr> b = Locate(key, item, offset, bytes);
  if (!b.ok()) return b.status();
  {
    std::lock_guard<std::mutex> l(accounting_->mu);
    if ((*b)->sealed_ || (*b)->sealing_) {
      return absl::FailedPreconditionError(absl::StrCat(
          "device ", Describe(key), (*b)->sealed_ ? " is sealed" : " is being sealed",
          ": its bytes are immutable"));
    }
    ++(*b)->writing_;  // Seal waits for no write
  }
  absl::Status st = [&] {
    absl::StatusOr<ScopedStream> s = ScopedStream::Create(api_, (*b)->device());
    if (!s.ok()) return s.status();
    uint8_t* dst = static_cast<uint8_t*>((*b)->data()) + (*b)->items()[item].offset + offset;
    if (absl::Status c = api_->MemcpyAsync(dst, src, static_cast<size_t>(bytes),
                                           CopyKind::kHostToDevice, s->get());
        !c.ok()) {
      return c;
    }
    return api_->StreamSynchronize(s->get());
  }();
  std::lock_guard<std::mutex> l(accounting_->mu);
  --(*b)->writing_;
  return st;
}

absl::Status DeviceBufferStore::ReadItem(const RankBufferKey& key, int item, int64_t offset,
                                         void* dst, int64_t bytes) const {
  absl::StatusOr<DeviceRankBufferPtr> b = Locate(key, item, offset, bytes);
  if (!b.ok()) return b.status();
  absl::StatusOr<ScopedStream> s = ScopedStream::Create(api_, (*b)->device());
  if (!s.ok()) return s.status();
  const uint8_t* src =
      static_cast<const uint8_t*>((*b)->data()) + (*b)->items()[item].offset + offset;
  if (absl::Status st = api_->MemcpyAsync(dst, src, static_cast<size_t>(bytes),
                                          CopyKind::kDeviceToHost, s->get());
      !st.ok()) {
    return st;
  }
  return api_->StreamSynchronize(s->get());
}

absl::StatusOr<std::vector<uint64_t>> DeviceBufferStore::ChecksumItems(
    const DeviceRankBuffer& b) const {
  // The chunks of every item, in order; two staging buffers so that the
  // next chunk copies while this one is hashed.
  struct Chunk {
    size_t item;
    int64_t offset;  // within the item
    int64_t bytes;
  };
  std::vector<Chunk> chunks;
  for (size_t i = 0; i < b.items().size(); ++i) {
    for (int64_t off = 0; off < b.items()[i].bytes; off += options_.staging_bytes) {
      chunks.push_back({i, off, std::min(options_.staging_bytes, b.items()[i].bytes - off)});
    }
  }
  std::vector<uint64_t> sums(b.items().size(), Checksum(nullptr, 0));
  if (chunks.empty()) return sums;
  const int64_t chunk_bytes = std::min<int64_t>(options_.staging_bytes, b.size());
  // Pinned once (the store's pool), not per seal.
  absl::StatusOr<PinnedHostPool::Lease> first = pinned_->Take(chunk_bytes);
  if (!first.ok()) return first.status();
  absl::StatusOr<PinnedHostPool::Lease> second = pinned_->Take(chunk_bytes);
  if (!second.ok()) return second.status();
  uint8_t* const staging[2] = {first->data(), second->data()};
  absl::StatusOr<ScopedStream> s = ScopedStream::Create(api_, b.device());
  if (!s.ok()) return s.status();
  auto enqueue = [&](size_t i) {
    const Chunk& ch = chunks[i];
    const uint8_t* src =
        static_cast<const uint8_t*>(b.data()) + b.items()[ch.item].offset + ch.offset;
    return api_->MemcpyAsync(staging[i % 2], src, static_cast<size_t>(ch.bytes),
                             CopyKind::kDeviceToHost, s->get());
  };
  std::unique_ptr<XXH3_state_t, XXH_errorcode (*)(XXH3_state_t*)> state(XXH3_createState(),
                                                                       &XXH3_freeState);
  if (absl::Status st = enqueue(0); !st.ok()) return st;
  for (size_t i = 0; i < chunks.size(); ++i) {
    if (absl::Status st = api_->StreamSynchronize(s->get()); !st.ok()) return st;
    if (i + 1 < chunks.size()) {
      if (absl::Status st = enqueue(i + 1); !st.ok()) return st;
    }
    const Chunk& ch = chunks[i];
    if (ch.offset == 0) XXH3_64bits_reset(state.get());
    XXH3_64bits_update(state.get(), staging[i % 2], static_cast<size_t>(ch.bytes));
    if (ch.offset + ch.bytes == b.items()[ch.item].bytes) {
      sums[ch.item] = XXH3_64bits_digest(state.get());
    }
  }
  return sums;
}

absl::StatusOr<std::vector<uint64_t>> DeviceBufferStore::Seal(
    const RankBufferKey& key, const std::vector<uint64_t>& expected) {
  absl::StatusOr<DeviceRankBufferPtr> got = Get(key);
  if (!got.ok()) return got.status();
  DeviceRankBuffer& b = **got;
  if (!expected.empty() && expected.size() != b.items().size()) {
    return absl::InvalidArgumentError(absl::StrCat("device ", Describe(key), ": ", expected.size(),
                                                   " expected checksums for ", b.items().size(),
                                                   " items"));
  }
  {
    std::lock_guard<std::mutex> l(accounting_->mu);
    if (b.sealed_) {
      if (expected.empty()) return b.checksums_;
      absl::Status s = CompareChecksums(key, b.items(), b.checksums_, expected);
      if (!s.ok()) {
        return absl::DataLossError(absl::StrCat(s.message(), " (the buffer is sealed already)"));
      }
      return b.checksums_;
    }
    if (b.sealing_) {
      return absl::FailedPreconditionError(
          absl::StrCat("device ", Describe(key), " is being sealed by another call"));
    }
    if (b.writing_ > 0) {
      return absl::FailedPreconditionError(absl::StrCat(
          "device ", Describe(key), " is being written by ", b.writing_, " call(s)"));
    }
    b.sealing_ = true;
  }
  absl::StatusOr<std::vector<uint64_t>> sums = ChecksumItems(b);
  absl::Status s = sums.ok() ? absl::OkStatus() : sums.status();
  if (s.ok() && !expected.empty()) s = CompareChecksums(key, b.items(), *sums, expected);
  std::lock_guard<std::mutex> l(accounting_->mu);
  b.sealing_ = false;
  if (!s.ok()) return s;
  b.sealed_ = true;
  b.checksums_ = *sums;
  return sums;
}

void DeviceBufferStore::DropGeneration(const std::string& job_id, int64_t generation) {
  std::vector<DeviceRankBufferPtr> dropped;  // freed outside the lock
  std::lock_guard<std::mutex> l(accounting_->mu);
  auto it = buffers_.lower_bound({job_id, generation, std::numeric_limits<int32_t>::min()});
  while (it != buffers_.end() && std::get<0>(it->first) == job_id &&
         std::get<1>(it->first) == generation) {
    dropped.push_back(std::move(it->second));
    it = buffers_.erase(it);
  }
}

void DeviceBufferStore::Drop(const RankBufferKey& key) {
  DeviceRankBufferPtr dropped;
  std::lock_guard<std::mutex> l(accounting_->mu);
  auto it = buffers_.find({key.job_id, key.generation, key.rank});
  if (it == buffers_.end()) return;
  dropped = std::move(it->second);
  buffers_.erase(it);
}

std::vector<RankBufferKey> DeviceBufferStore::List() const {
  std::lock_guard<std::mutex> l(accounting_->mu);
  std::vector<RankBufferKey> keys;
  for (const auto& [k, b] : buffers_) keys.push_back(b->key());
  return keys;
}

int64_t DeviceBufferStore::used_bytes(int device) const {
  std::lock_guard<std::mutex> l(accounting_->mu);
  return device >= 0 && device < static_cast<int>(limits_.size()) ? accounting_->used[device] : 0;
}

int64_t DeviceBufferStore::limit_bytes(int device) const {
  return device >= 0 && device < static_cast<int>(limits_.size()) ? limits_[device] : 0;
}

}  // namespace reshard::agent
