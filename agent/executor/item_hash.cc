#include "agent/executor/item_hash.h"

#include <xxhash.h>

#include <algorithm>
#include <iterator>

#include "agent/executor/xxh3_avx2.h"
#include "common/log.h"

namespace reshard::agent {

namespace xxh3_avx2 {

bool Available() {
#if defined(__x86_64__)
  static const bool avx2 = [] {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") != 0;
  }();
  return avx2;
#else
  return false;
#endif
}

}  // namespace xxh3_avx2

// libxxhash's XXH3, or the AVX2 build of it where the CPU has AVX2.
struct ItemHashCursor::State {
  State() {
    if (xxh3_avx2::Available()) {
      wide = xxh3_avx2::Create();
    } else {
      xxh = XXH3_createState();
      RESHARD_CHECK(xxh != nullptr && XXH3_64bits_reset(xxh) == XXH_OK);
    }
  }
  ~State() {
    if (wide != nullptr) xxh3_avx2::Free(wide);
    if (xxh != nullptr) XXH3_freeState(xxh);
  }
  void Update(const void* data, size_t bytes) {
    if (wide != nullptr) {
      xxh3_avx2::Update(wide, data, bytes);
    } else {
      RESHARD_CHECK(XXH3_64bits_update(xxh, data, bytes) == XXH_OK);
    }
  }
  uint64_t Digest() const {
    return wide != nullptr ? xxh3_avx2::Digest(wide) : XXH3_64bits_digest(xxh);
  }
  xxh3_avx2::State* wide = nullptr;
  XXH3_state_t* xxh = nullptr;
};

ItemHashCursor::ItemHashCursor(const uint8_t* base, size_t bytes)
    : base_(base), bytes_(bytes), state_(std::make_unique<State>()) {}

ItemHashCursor::~ItemHashCursor() = default;

void ItemHashCursor::Hash(const void* data, size_t bytes) {
  state_->Update(data, bytes);
  cursor_ += bytes;
}

void ItemHashCursor::Landed(size_t offset, size_t bytes, const void* data) {
  RESHARD_CHECK(!finished_);
  const size_t end = offset >= bytes_ ? bytes_ : offset + std::min(bytes, bytes_ - offset);
  if (offset >= end || end <= cursor_) return;
  if (offset > cursor_) {
    // Remembered: merged with every pending range it overlaps or touches.
    size_t start = offset, stop = end;
    auto it = pending_.upper_bound(start);
    if (it != pending_.begin()) {
      auto prev = std::prev(it);
      if (prev->second >= start) {
        start = prev->first;
        stop = std::max(stop, prev->second);
        pending_.erase(prev);
      }
    }
    while (it != pending_.end() && it->first <= stop) {
      stop = std::max(stop, it->second);
      it = pending_.erase(it);
    }
    pending_.emplace(start, stop);
    return;
  }
  // Hot: the caller's bytes from the cursor on.
  Hash(static_cast<const uint8_t*>(data) + (cursor_ - offset), end - cursor_);
  // Cold: what landed earlier and is now contiguous, from the buffer.
  while (!pending_.empty() && pending_.begin()->first <= cursor_) {
    const size_t stop = pending_.begin()->second;
    pending_.erase(pending_.begin());
    if (stop <= cursor_) continue;
    cold_ += stop - cursor_;
    Hash(base_ + cursor_, stop - cursor_);
  }
}

uint64_t ItemHashCursor::Finish() {
  RESHARD_CHECK(!finished_);
  finished_ = true;
  pending_.clear();
  if (cursor_ < bytes_) {
    cold_ += bytes_ - cursor_;
    Hash(base_ + cursor_, bytes_ - cursor_);
  }
  return state_->Digest();
}

void ForEachBlock(const void* data, size_t bytes,
                  const std::function<void(size_t offset, const uint8_t* block, size_t n)>& fn) {
  const auto* p = static_cast<const uint8_t*>(data);
  for (size_t at = 0; at < bytes; at += kFusedBlockBytes) {
    fn(at, p + at, std::min(kFusedBlockBytes, bytes - at));
  }
}

}  // namespace reshard::agent
