#include "agent/executor/item_hash.h"

#include <xxhash.h>

#include <algorithm>
#include <iterator>

#include "common/log.h"

namespace reshard::agent {

struct ItemHashCursor::State {
  State() : xxh(XXH3_createState()) {
    RESHARD_CHECK(xxh != nullptr && XXH3_64bits_reset(xxh) == XXH_OK);
  }
  ~State() { XXH3_freeState(xxh); }
  XXH3_state_t* xxh;
};

ItemHashCursor::ItemHashCursor(const uint8_t* base, size_t bytes)
    : base_(base), bytes_(bytes), state_(std::make_unique<State>()) {}

ItemHashCursor::~ItemHashCursor() = default;

void ItemHashCursor::Hash(const void* data, size_t bytes) {
  RESHARD_CHECK(XXH3_64bits_update(state_->xxh, data, bytes) == XXH_OK);
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
  return XXH3_64bits_digest(state_->xxh);
}

void ForEachBlock(const void* data, size_t bytes,
                  const std::function<void(size_t offset, const uint8_t* block, size_t n)>& fn) {
  const auto* p = static_cast<const uint8_t*>(data);
  for (size_t at = 0; at < bytes; at += kFusedBlockBytes) {
    fn(at, p + at, std::min(kFusedBlockBytes, bytes - at));
  }
}

}  // namespace reshard::agent
