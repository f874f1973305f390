// The XXH3-64 of one item, taken while its bytes pass anyway (issue 22, item
// 3): a receiver's new item as its chunks land, a sender's source item as its
// chunks are read for the transport, both ends of a local copy, a zero fill.
// A range is fed once its bytes are final (a new item's: written, never
// written again, plan rule 1 of docs/partitioning.md; a source's: read under its lease).
// The streaming state can only take bytes in order, so the cursor hashes a
// range that starts at it at once (hot: the caller just touched those bytes),
// then every range remembered earlier that is now contiguous with it (from
// the item's buffer, cold); ranges beyond the cursor are remembered. Finish
// hashes what is left from the item's buffer. Whatever the order, overlaps
// or gaps of the ranges fed, Finish() == Checksum(base, bytes) of the bytes
// as they are then (ranges fed must hold what the buffer holds).
// Not thread-safe: one thread feeds it, then one (possibly another, after a
// synchronising hand-off) calls Finish.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>

namespace reshard::agent {

class ItemHashCursor {
 public:
  /// The item's `bytes` bytes at `base`.
  ItemHashCursor(const uint8_t* base, size_t bytes);
  ~ItemHashCursor();
  ItemHashCursor(const ItemHashCursor&) = delete;
  ItemHashCursor& operator=(const ItemHashCursor&) = delete;

  /// Bytes [offset, offset + bytes) of the item are final and hold what
  /// `data` holds (the item's own bytes there, or an equal copy the caller
  /// has hot). Parts outside the item or already hashed are ignored.
  void Landed(size_t offset, size_t bytes, const void* data);
  /// XXH3-64 of the whole item, hashing what is still left from the
  /// buffer. Call once; nothing may be fed afterwards.
  uint64_t Finish();

  /// Bytes hashed so far (the cursor), and of those, from the buffer (cold).
  size_t cursor() const { return cursor_; }
  size_t cold_bytes() const { return cold_; }

 private:
  void Hash(const void* data, size_t bytes);

  struct State;
  const uint8_t* base_;
  size_t bytes_;
  size_t cursor_ = 0;
  size_t cold_ = 0;
  bool finished_ = false;
  std::unique_ptr<State> state_;
  std::map<size_t, size_t> pending_;  // start -> end, disjoint, not adjacent, all > cursor_
};

/// The size of the blocks a fused pass takes its bytes in: each block is
/// read by every pass (a MAC, one or two checksums) while it is in cache.
inline constexpr size_t kFusedBlockBytes = size_t{256} << 10;

/// Calls `fn(offset, block, block_bytes)` for the blocks of kFusedBlockBytes
/// (the last shorter) of the `bytes` bytes at `data`, in order.
void ForEachBlock(const void* data, size_t bytes,
                  const std::function<void(size_t offset, const uint8_t* block, size_t n)>& fn);

}  // namespace reshard::agent
