// Pinned host memory (DeviceApi::MallocHost) registered with the device once
// and lent again and again: the staging a seal hashes device bytes through
// and the host copies of the device communicator's windows. Pinning costs
// more than the copy it speeds up (the driver walks and locks every page:
// several times the copy's time on 4 KiB pages), so a block taken once
// stays registered after its lease ends, and the next lease of a size it
// fits gets it back without a new registration. Blocks are sized in powers
// of two (at least kMinBlock) so that near sizes share them; idle blocks
// beyond `keep_bytes` are freed, the largest first. Thread-safe; the
// destructor frees every block (no lease may outlive the pool).
#pragma once

#include <cstdint>
#include <mutex>
#include <vector>

#include "absl/status/statusor.h"
#include "agent/device/device_api.h"

namespace reshard::agent {

class PinnedHostPool {
 public:
  /// The smallest block the pool registers.
  static constexpr int64_t kMinBlock = int64_t{1} << 20;

  /// A block lent for a while; it goes back to the pool when the lease goes.
  class Lease {
   public:
    Lease() = default;
    Lease(Lease&& o) noexcept;
    Lease& operator=(Lease&& o) noexcept;
    Lease(const Lease&) = delete;
    Lease& operator=(const Lease&) = delete;
    ~Lease();
    /// nullptr for an empty lease (0 bytes asked).
    uint8_t* data() const { return data_; }
    /// The block's size (at least what was asked).
    int64_t bytes() const { return bytes_; }

   private:
    friend class PinnedHostPool;
    Lease(PinnedHostPool* pool, uint8_t* data, int64_t bytes)
        : pool_(pool), data_(data), bytes_(bytes) {}
    void Return();
    PinnedHostPool* pool_ = nullptr;
    uint8_t* data_ = nullptr;
    int64_t bytes_ = 0;
  };

  /// `api` (not null) must outlive the pool. `keep_bytes`: idle blocks kept
  /// registered at most (0: none, every lease registers anew).
  PinnedHostPool(DeviceApi* api, int64_t keep_bytes);
  ~PinnedHostPool();
  PinnedHostPool(const PinnedHostPool&) = delete;
  PinnedHostPool& operator=(const PinnedHostPool&) = delete;

  /// A block of at least `bytes` (an empty lease for 0): the smallest idle
  /// one that fits, else a new registration. The device's error (naming
  /// cudaMallocHost and the bytes) when registering fails; InvalidArgument
  /// for negative bytes.
  [[nodiscard]] absl::StatusOr<Lease> Take(int64_t bytes);

  /// Registrations made so far (MallocHost calls that succeeded).
  int64_t registrations() const;
  /// Bytes registered now, lent and idle.
  int64_t registered_bytes() const;
  /// Bytes registered and idle.
  int64_t idle_bytes() const;

  /// The block size a lease of `bytes` gets: the next power of two, at
  /// least kMinBlock.
  static int64_t BlockSize(int64_t bytes);

 private:
  struct Block {
    uint8_t* data = nullptr;
    int64_t bytes = 0;
  };
  void Give(uint8_t* data, int64_t bytes);

  DeviceApi* const api_;
  const int64_t keep_bytes_;
  mutable std::mutex mu_;
  std::vector<Block> idle_;  // sorted by size, smallest first
  int64_t registrations_ = 0;
  int64_t registered_bytes_ = 0;
  int64_t idle_bytes_ = 0;
};

}  // namespace reshard::agent
