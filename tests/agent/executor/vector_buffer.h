// An in-memory rank buffer of known items, for the executor tests: what
// RenderRank fills and what the pre-copy check reads. Not thread-safe.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "agent/shard_store/shard_store.h"

namespace reshard::agent::executor_testing {

class VectorBuffer : public RankBuffer {
 public:
  /// `size` zero bytes holding `items`.
  VectorBuffer(const std::vector<ItemSlot>& items, int64_t size) : items_(items), bytes_(size) {}
  const RankBufferKey& key() const override { return key_; }
  const std::string& path() const override { return path_; }
  uint8_t* data() override { return bytes_.data(); }
  int64_t size() const override { return static_cast<int64_t>(bytes_.size()); }
  const std::vector<ItemSlot>& items() const override { return items_; }
  bool sealed() const override { return false; }
  std::vector<uint64_t> checksums() const override { return {}; }
  bool published() const override { return false; }
  absl::Status CheckFile() const override { return absl::OkStatus(); }
  absl::StatusOr<std::unique_ptr<ReadLease>> LeaseForReading() const override {
    return absl::UnimplementedError("a test buffer has no file");
  }

 private:
  RankBufferKey key_;
  std::string path_;
  std::vector<ItemSlot> items_;
  std::vector<uint8_t> bytes_;
};

}  // namespace reshard::agent::executor_testing
