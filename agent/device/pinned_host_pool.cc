#include "agent/device/pinned_host_pool.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"

namespace reshard::agent {

PinnedHostPool::Lease::Lease(Lease&& o) noexcept
    : pool_(std::exchange(o.pool_, nullptr)),
      data_(std::exchange(o.data_, nullptr)),
      bytes_(std::exchange(o.bytes_, 0)) {}

PinnedHostPool::Lease& PinnedHostPool::Lease::operator=(Lease&& o) noexcept {
  if (this != &o) {
    Return();
    pool_ = std::exchange(o.pool_, nullptr);
    data_ = std::exchange(o.data_, nullptr);
    bytes_ = std::exchange(o.bytes_, 0);
  }
  return *this;
}

PinnedHostPool::Lease::~Lease() { Return(); }

void PinnedHostPool::Lease::Return() {
  if (pool_ != nullptr && data_ != nullptr) pool_->Give(data_, bytes_);
  pool_ = nullptr;
  data_ = nullptr;
  bytes_ = 0;
}

PinnedHostPool::PinnedHostPool(DeviceApi* api, int64_t keep_bytes)
    : api_(api), keep_bytes_(std::max<int64_t>(0, keep_bytes)) {}

PinnedHostPool::~PinnedHostPool() {
  for (const Block& b : idle_) (void)api_->FreeHost(b.data);
}

int64_t PinnedHostPool::BlockSize(int64_t bytes) {
  int64_t size = kMinBlock;
  while (size < bytes) size <<= 1;
  return size;
}

absl::StatusOr<PinnedHostPool::Lease> PinnedHostPool::Take(int64_t bytes) {
  if (bytes < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("pinned host memory of ", bytes, " bytes asked"));
  }
  if (bytes == 0) return Lease();
  {
    std::lock_guard<std::mutex> l(mu_);
    auto it =
        std::find_if(idle_.begin(), idle_.end(), [&](const Block& b) { return b.bytes >= bytes; });
    if (it != idle_.end()) {
      const Block b = *it;
      idle_.erase(it);
      idle_bytes_ -= b.bytes;
      return Lease(this, b.data, b.bytes);
    }
  }
  // Registered outside the lock: it takes a while and others may reuse meanwhile.
  const int64_t size = BlockSize(bytes);
  absl::StatusOr<void*> p = api_->MallocHost(static_cast<size_t>(size));
  if (!p.ok()) return p.status();
  std::lock_guard<std::mutex> l(mu_);
  ++registrations_;
  registered_bytes_ += size;
  return Lease(this, static_cast<uint8_t*>(*p), size);
}

void PinnedHostPool::Give(uint8_t* data, int64_t bytes) {
  std::vector<Block> freed;  // freed outside the lock
  {
    std::lock_guard<std::mutex> l(mu_);
    const Block b{data, bytes};
    idle_.insert(std::upper_bound(idle_.begin(), idle_.end(), b,
                                  [](const Block& x, const Block& y) { return x.bytes < y.bytes; }),
                 b);
    idle_bytes_ += bytes;
    while (idle_bytes_ > keep_bytes_) {
      freed.push_back(idle_.back());
      idle_bytes_ -= idle_.back().bytes;
      registered_bytes_ -= idle_.back().bytes;
      idle_.pop_back();
    }
  }
  for (const Block& f : freed) (void)api_->FreeHost(f.data);
}

int64_t PinnedHostPool::registrations() const {
  std::lock_guard<std::mutex> l(mu_);
  return registrations_;
}

int64_t PinnedHostPool::registered_bytes() const {
  std::lock_guard<std::mutex> l(mu_);
  return registered_bytes_;
}

int64_t PinnedHostPool::idle_bytes() const {
  std::lock_guard<std::mutex> l(mu_);
  return idle_bytes_;
}

}  // namespace reshard::agent
