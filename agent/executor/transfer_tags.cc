#include "agent/executor/transfer_tags.h"

#include "absl/strings/str_cat.h"
#include "agent/executor/peer_proof.h"
#include "common/log.h"

namespace reshard::agent {
namespace {

// All ones could make the transports' reserved tag (kReservedTag).
constexpr uint32_t kAllOnes = (uint32_t{1} << kTagKeyBits) - 1;

}  // namespace

uint32_t OperationTagKey(const std::string& operation_id) {
  uint32_t h = 2166136261u;
  for (unsigned char c : operation_id) {
    h ^= c;
    h *= 16777619u;
  }
  // XOR-fold to kTagKeyBits so every input bit still counts.
  const uint32_t key = (h >> kTagKeyBits) ^ (h & kAllOnes);
  return key == kAllOnes ? kAllOnes - 1 : key;
}

uint32_t TransferTagKey(const std::string& secret, const std::string& operation_id) {
  if (secret.empty()) return OperationTagKey(operation_id);
  std::string data;
  AppendMacField(data, "reshard-tag-key-v1");
  AppendMacField(data, operation_id);
  const std::string mac = HmacSha256Of(secret, data);
  uint32_t key = 0;
  for (int i = 0; i < 4; ++i) key = key << 8 | static_cast<uint8_t>(mac[i]);
  key &= kAllOnes;
  return key == kAllOnes ? kAllOnes - 1 : key;
}

std::string TransferContext(const v1::HostTask& task) {
  if (!task.prepare()) return task.operation_id();
  return absl::StrCat(task.operation_id(), " (prepare)");
}

uint32_t TaskTagKey(const v1::HostTask& task) {
  const uint32_t transfer = TransferTagKey(task.transfer_secret(), task.operation_id());
  if (!task.prepare()) return transfer;
  const uint32_t key = TransferTagKey(task.transfer_secret(), TransferContext(task));
  if (key != transfer) return key;
  // Both keys lie below the all-ones key (reserved); so does the next one.
  return (key + 1) % kAllOnes;
}

absl::StatusOr<uint64_t> TransferTag(uint32_t key, int64_t step_index, int64_t chunk) {
  if (step_index < 0 || step_index >= kMaxTaggedSteps) {
    return absl::InvalidArgumentError(absl::StrCat("step index ", step_index,
                                                   " does not fit a transfer tag (at most ",
                                                   kMaxTaggedSteps - 1, ")"));
  }
  if (chunk < 0 || chunk >= kMaxChunksPerStep) {
    return absl::InvalidArgumentError(absl::StrCat("step ", step_index, ": chunk ", chunk,
                                                   " does not fit a transfer tag (at most ",
                                                   kMaxChunksPerStep - 1, ")"));
  }
  RESHARD_CHECK(key < (uint32_t{1} << kTagKeyBits));
  return uint64_t{key} << (kTagStepBits + kTagChunkBits) |
         static_cast<uint64_t>(step_index) << kTagChunkBits | static_cast<uint64_t>(chunk);
}

uint64_t ProofTag(uint32_t key) { return TransferTag(key, kProofStepIndex, 0).value(); }

absl::StatusOr<uint64_t> SealTag(uint32_t key, int64_t step_index) {
  return TransferTag(key, step_index, kSealChunk);
}

uint64_t TagBase(uint32_t key) { return TransferTag(key, 0, 0).value(); }

}  // namespace reshard::agent
