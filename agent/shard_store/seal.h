// Internal to the shard store: sealing a rank buffer (docs/agent.md,
// "Generation lifecycle"), the checks that make a sealed buffer immutable.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "agent/shard_store/rank_buffer_file.h"

namespace reshard::agent::store_internal {

/// Reserves `bytes` more against the memory limit for a sealing copy of
/// `key`'s buffer, or says why not (ResourceExhausted).
using ReserveCopyFn = std::function<absl::Status(const RankBufferKey& key, int64_t bytes)>;

// Seal of a sealed buffer: its checksums, if `expected` agrees.
absl::StatusOr<std::vector<uint64_t>> SealedAgain(const MappedRankBuffer& b,
                                                  const std::vector<uint64_t>& expected);

// DataLoss naming the first item whose checksum in `sums` is not `expected`'s.
absl::Status CompareChecksums(const RankBufferKey& key, const std::vector<ItemSlot>& items,
                              const std::vector<uint64_t>& sums,
                              const std::vector<uint64_t>& expected);

// XXH3-64 of every item of `b`, from its bytes.
std::vector<uint64_t> ChecksumItems(RankBuffer& b);

// Checksums a published buffer (`*sums`) and returns what will be its
// sealed self: `b` when no process can write its file any more (a read
// lease was granted: nobody has it open for writing, and nobody can
// truncate it or open it for writing until the lease is gone), else a
// private copy, read with pread into a new file `<path>.sealing` (a file
// truncated meanwhile gives a short read, never a SIGBUS) for which `reserve`
// made room; the copy's bytes count in `accounting`. When it is `b`, the
// lease goes to `*lease`: the caller holds it until the seal is recorded, so
// that no worker opens the file for writing (or truncates it) between the
// checksum and the buffer turning sealed.
absl::StatusOr<std::shared_ptr<MappedRankBuffer>> SealPublished(
    const std::shared_ptr<MappedRankBuffer>& b, const std::shared_ptr<Accounting>& accounting,
    const ReserveCopyFn& reserve, std::vector<uint64_t>* sums, std::unique_ptr<ReadLease>* lease);

}  // namespace reshard::agent::store_internal
