// Device memory as a memory kind of the shard store (MemoryKind::kCuda):
// rank buffers in a GPU's memory, agent-owned, allocated through a DeviceApi
// (agent/device/device_api.h: the CUDA runtime, or the fake device in CI).
// They have the host buffers' item layout (LayoutItems: 64-byte aligned
// items), their lifecycle (written, sealed, immutable) and their checksums:
// Seal copies each item through host staging memory in chunks and hashes it
// with XXH3-64, so a device buffer and a host buffer holding the same bytes
// seal to the same checksums. Bytes reach a device buffer only through the
// device API (WriteItem, or the executor's device path: docs/agent.md,
// "GPU / memory kinds"); its data() is a device pointer, never dereferenced.
// The memory limit counts device bytes per device. Thread-safe.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "agent/device/device_api.h"
#include "agent/device/memory_kind.h"
#include "agent/device/pinned_host_pool.h"
#include "agent/shard_store/shard_store.h"

namespace reshard::agent {

/// One rank's buffer of one generation in device memory; freed (and its
/// bytes returned to the limit) when the last user drops it.
class DeviceRankBuffer {
 public:
  ~DeviceRankBuffer();
  DeviceRankBuffer(const DeviceRankBuffer&) = delete;
  DeviceRankBuffer& operator=(const DeviceRankBuffer&) = delete;
  const RankBufferKey& key() const { return key_; }
  MemoryKind memory_kind() const { return MemoryKind::kCuda; }
  int device() const { return device_; }
  /// A device pointer: bytes move only through the DeviceApi.
  void* data() const { return data_; }
  int64_t size() const { return size_; }
  const std::vector<ItemSlot>& items() const { return items_; }
  bool sealed() const;
  std::vector<uint64_t> checksums() const;

 private:
  friend class DeviceBufferStore;
  friend class DeviceReservation;
  struct Accounting;
  DeviceRankBuffer(RankBufferKey key, int device, void* data, int64_t size,
                   std::vector<ItemSlot> items, DeviceApi* api,
                   std::shared_ptr<Accounting> accounting);

  const RankBufferKey key_;
  const int device_;
  void* const data_;
  const int64_t size_;
  const std::vector<ItemSlot> items_;
  DeviceApi* const api_;
  const std::shared_ptr<Accounting> accounting_;
  // Guarded by accounting_->mu.
  bool sealed_ = false;
  bool sealing_ = false;
  int writing_ = 0;  // WriteItem calls in flight
  std::vector<uint64_t> checksums_;
};
using DeviceRankBufferPtr = std::shared_ptr<DeviceRankBuffer>;

/// The device buffers of this agent, by (job, generation, rank).
/// Device bytes charged against a DeviceBufferStore's per-device limit
/// while it lives (memory its holder allocates itself: the device
/// communicator's staging); movable, given back on destruction.
class DeviceReservation {
 public:
  DeviceReservation() = default;
  DeviceReservation(DeviceReservation&& o) noexcept;
  DeviceReservation& operator=(DeviceReservation&& o) noexcept;
  DeviceReservation(const DeviceReservation&) = delete;
  ~DeviceReservation();
  int64_t bytes() const { return bytes_; }

 private:
  friend class DeviceBufferStore;
  DeviceReservation(std::shared_ptr<DeviceRankBuffer::Accounting> accounting, int device,
                    int64_t bytes)
      : accounting_(std::move(accounting)), device_(device), bytes_(bytes) {}
  void Release();
  std::shared_ptr<DeviceRankBuffer::Accounting> accounting_;
  int device_ = -1;
  int64_t bytes_ = 0;
};

class DeviceBufferStore {
 public:
  struct Options {
    /// Bytes of device buffers allowed on each device; 0: the device's
    /// total memory (DeviceApi::MemoryInfo).
    int64_t memory_limit_bytes_per_device = 0;
    /// Bytes of each of the two host staging chunks Seal hashes through.
    int64_t staging_bytes = int64_t{8} << 20;
    /// Pinned host memory kept registered between uses (pinned()); 0: every
    /// use registers its own.
    int64_t pinned_keep_bytes = int64_t{1} << 30;
  };

  /// `api` (not null) must outlive the store and every buffer it made.
  /// InvalidArgument for a negative limit or staging size below 1.
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<DeviceBufferStore>> Open(
      DeviceApi* api, const Options& options);

  /// Creates the buffers of `keys`, buffer i on device `devices[i]` with
  /// items of `item_bytes[i]` bytes, zeroed; all or none.
  /// ResourceExhausted naming the device, the bytes needed and those free of
  /// its limit when they do not fit (or the device's own error when its
  /// allocation fails); AlreadyExists when one exists; InvalidArgument for a
  /// device out of range or sizes that do not match.
  [[nodiscard]] absl::StatusOr<std::vector<DeviceRankBufferPtr>> CreateAll(
      const std::vector<RankBufferKey>& keys, const std::vector<int>& devices,
      const std::vector<std::vector<int64_t>>& item_bytes);
  /// Charges `bytes` on `device` against its limit until the reservation
  /// goes (used_bytes counts them). ResourceExhausted naming `what`, the
  /// device, the bytes and those free when they do not fit; InvalidArgument
  /// for a device out of range or negative bytes.
  [[nodiscard]] absl::StatusOr<DeviceReservation> Reserve(int device, int64_t bytes,
                                                          const std::string& what);
  /// NotFound when absent.
  [[nodiscard]] absl::StatusOr<DeviceRankBufferPtr> Get(const RankBufferKey& key) const;

  /// Copies `bytes` bytes from host memory `src` to item `item` of `key`'s
  /// buffer at `offset` within the item, and waits. FailedPrecondition naming
  /// the buffer once it is sealed (or being sealed); OutOfRange past the
  /// item's end.
  [[nodiscard]] absl::Status WriteItem(const RankBufferKey& key, int item, int64_t offset,
                                       const void* src, int64_t bytes);
  /// Copies item bytes to host memory `dst`, and waits.
  [[nodiscard]] absl::Status ReadItem(const RankBufferKey& key, int item, int64_t offset,
                                      void* dst, int64_t bytes) const;

  /// Checksums every item (XXH3-64, chunks copied to host staging memory)
  /// and records them; from then on the buffer is immutable. With `expected`
  /// (one per item, or empty) a mismatch is DataLoss naming the item, and
  /// the buffer stays unsealed. Sealing a sealed buffer returns its
  /// checksums (DataLoss when `expected` differs). FailedPrecondition while
  /// another call seals it or a WriteItem is in flight (the checksums would
  /// not cover its bytes).
  [[nodiscard]] absl::StatusOr<std::vector<uint64_t>> Seal(const RankBufferKey& key,
                                                           const std::vector<uint64_t>& expected);

  /// Removes every buffer of (job, generation); device memory is freed when
  /// the last user drops its DeviceRankBufferPtr. Idempotent.
  void DropGeneration(const std::string& job_id, int64_t generation);
  /// Removes one buffer. Idempotent.
  void Drop(const RankBufferKey& key);
  std::vector<RankBufferKey> List() const;
  /// Device bytes of live buffers on `device` (dropped ones still in use
  /// included).
  int64_t used_bytes(int device) const;
  int64_t limit_bytes(int device) const;
  int device_count() const { return static_cast<int>(limits_.size()); }
  /// The device API the buffers live in (the executor's device path copies
  /// between them through it).
  DeviceApi* api() const { return api_; }
  /// Pinned host memory registered once and lent again: the staging Seal
  /// hashes through, and that of the executor's device paths.
  PinnedHostPool& pinned() const { return *pinned_; }

 private:
  using KeyTuple = std::tuple<std::string, int64_t, int32_t>;
  DeviceBufferStore(DeviceApi* api, const Options& options, std::vector<int64_t> limits);
  // The buffer of `key` when [offset, offset + bytes) lies within `item`.
  absl::StatusOr<DeviceRankBufferPtr> Locate(const RankBufferKey& key, int item, int64_t offset,
                                             int64_t bytes) const;
  absl::StatusOr<std::vector<uint64_t>> ChecksumItems(const DeviceRankBuffer& b) const;

  DeviceApi* const api_;
  const Options options_;
  const std::vector<int64_t> limits_;  // per device
  const std::shared_ptr<DeviceRankBuffer::Accounting> accounting_;
  const std::unique_ptr<PinnedHostPool> pinned_;
  std::map<KeyTuple, DeviceRankBufferPtr> buffers_;  // guarded by accounting_->mu
};

}  // namespace reshard::agent
