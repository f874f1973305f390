// Verifying a stop-free operation's pre-copy at the cut-over (issue 19, 2b;
// docs/agent.md, "Two phases"; docs/coordinator.md, "Agents prepare").
// The transfer phase skips every step whose source shard did not change
// since the prepare, so the bytes the prepare wrote into those steps'
// destinations are committed as they are. Nothing may change them in between
// unseen: the prepare records, per destination region it wrote (each local
// copy's and receive's destination, each zero fill), the XXH3-64 of its bytes
// as written; the transfer phase reads every region it does not write again
// back and compares it (a read pass over the skipped bytes, on this host,
// no network). A region that differs fails the task with DATA_LOSS naming
// job, generation, rank, item and step, and nothing is committed.
// The record lives in the agent's memory as long as the buffers do: an agent
// that restarts removes unsealed task buffers (so its transfer phase is
// refused for missing buffers before any record is looked up).
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "agent/executor/host_steps.h"
#include "agent/shard_store/shard_store.h"
#include "reshard/v1/agent.pb.h"

namespace reshard::agent {

/// One destination region a prepare wrote in a new rank buffer.
struct PrecopyRegion {
  int64_t step = -1;  // CopyStep.index; -1 for a zero fill
  int rank = 0;       // the new rank
  int item = 0;
  int64_t offset = 0;  // elements, from the item's start
  std::vector<int64_t> strides;
  std::vector<int64_t> shape;
  int element_bytes = 0;
  std::string what;  // for messages: `step 17 (received from host "h1")`
  uint64_t checksum = 0;

  int64_t bytes() const;
};

/// The regions `hs` writes into this host's new buffers (every destination of
/// its local copies and receives, its zero fills), checksums not yet set.
std::vector<PrecopyRegion> PrecopyRegions(const v1::TransferPlan& plan, const HostSteps& hs);

/// XXH3-64 of the region's bytes, in row-major order of its shape, with
/// `item_base` the start of its item.
uint64_t RegionChecksum(const uint8_t* item_base, const PrecopyRegion& region);

/// The new buffer of a rank (one of the task's new ranks).
using BufferOfRank = std::function<RankBuffer*(int rank)>;

/// Sets every region's checksum from the bytes now in its buffer; on up to
/// `threads` threads.
void ChecksumRegions(const BufferOfRank& buffer, int threads, std::vector<PrecopyRegion>* regions);

/// Reads back every region of `regions` whose step is not in `rewritten`
/// (zero fills always) and compares it with its recorded checksum: DATA_LOSS
/// naming job, generation, rank, item (and its name in `plan`), step and
/// bytes of the first that differs. On up to `threads` threads.
[[nodiscard]] absl::Status VerifyPrecopy(const std::vector<PrecopyRegion>& regions,
                                         const std::set<int64_t>& rewritten,
                                         const BufferOfRank& buffer, const v1::TransferPlan& plan,
                                         const std::string& job, int64_t generation, int threads);

/// What one host's prepare of one operation wrote. Thread-safe.
class PrecopyRecords {
 public:
  struct Record {
    std::string job;
    int64_t generation = 0;
    std::vector<int> ranks;  // the new ranks, ascending
    std::vector<PrecopyRegion> regions;
  };
  using RecordPtr = std::shared_ptr<const Record>;

  /// Replaces the record of (host, operation).
  void Put(const std::string& host, const std::string& operation, Record record);
  /// The record of (host, operation), or null.
  RecordPtr Find(const std::string& host, const std::string& operation) const;
  void Erase(const std::string& host, const std::string& operation);
  /// Drops every record whose buffers are gone from `store` (the operation
  /// was aborted, its job deleted, or its transfer phase failed).
  void Prune(ShardStore& store);
  size_t size() const;

 private:
  mutable std::mutex mu_;
  std::map<std::pair<std::string, std::string>, RecordPtr> records_;
};

}  // namespace reshard::agent
