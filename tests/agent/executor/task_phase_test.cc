// The two phases of a stop-free operation never share a transfer tag key,
// a peer proof, a chunk key or a step seal (task_phase.h).
#include "agent/executor/task_phase.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "agent/executor/peer_proof.h"
#include "agent/executor/step_seal.h"
#include "agent/executor/transfer_tags.h"

namespace reshard::agent {
namespace {

constexpr uint32_t kAllOnes = (uint32_t{1} << kTagKeyBits) - 1;

v1::HostTask Task(const std::string& op, bool prepare, bool prepared,
                  const std::string& secret = "") {
  v1::HostTask t;
  t.set_operation_id(op);
  t.set_prepare(prepare);
  t.set_prepared(prepared);
  t.set_transfer_secret(secret);
  return t;
}

TEST(TaskPhaseTest, PhaseOfATask) {
  EXPECT_EQ(*PhaseOf(Task("op", false, false)), TaskPhase::kTransfer);
  EXPECT_EQ(*PhaseOf(Task("op", true, false)), TaskPhase::kPrepare);
  EXPECT_EQ(*PhaseOf(Task("op", false, true)), TaskPhase::kPrepared);
  auto both = PhaseOf(Task("op", true, true));
  EXPECT_TRUE(absl::IsInvalidArgument(both.status())) << both.status();
  v1::HostTask checkpoint = Task("op", true, false);
  checkpoint.set_publish_by_workers(true);
  auto publish = PhaseOf(checkpoint);
  EXPECT_TRUE(absl::IsInvalidArgument(publish.status())) << publish.status();
  EXPECT_THAT(std::string(publish.status().message()), ::testing::HasSubstr("publish_by_workers"));
}

// The transfer phase keeps the plain task's keys (agents of one operation
// agree whatever they run); only the prepare's differ.
TEST(TaskPhaseTest, ThePrepareHasKeysOfItsOwn) {
  for (const std::string& secret : {std::string(), std::string(32, 'k')}) {
    for (int i = 0; i < 2000; ++i) {
      const std::string op = absl::StrCat("op-", i);
      const v1::HostTask plain = Task(op, false, false, secret);
      const v1::HostTask prepare = Task(op, true, false, secret);
      const v1::HostTask prepared = Task(op, false, true, secret);
      EXPECT_EQ(TransferContext(plain), op);
      EXPECT_EQ(TransferContext(prepared), op);
      EXPECT_NE(TransferContext(prepare), op);
      EXPECT_EQ(TaskTagKey(plain), TransferTagKey(secret, op));
      EXPECT_EQ(TaskTagKey(prepared), TaskTagKey(plain));
      ASSERT_NE(TaskTagKey(prepare), TaskTagKey(prepared)) << op;
      EXPECT_LT(TaskTagKey(prepare), kAllOnes);
    }
  }
}

// An operation id whose prepare context hashes to the same 24-bit key as
// the id itself (about one in 2^24; this one was found by searching "op-N")
// still gets two keys.
TEST(TaskPhaseTest, APrepareKeyThatWouldCollideTakesAnother) {
  const std::string op = "op-24552542";
  const v1::HostTask prepare = Task(op, true, false);
  const v1::HostTask prepared = Task(op, false, true);
  ASSERT_EQ(TransferTagKey("", TransferContext(prepare)), TaskTagKey(prepared)) << op;
  EXPECT_NE(TaskTagKey(prepare), TaskTagKey(prepared)) << op;
  EXPECT_LT(TaskTagKey(prepare), kAllOnes);
}

TEST(TaskPhaseTest, APreparesProofsAndSealsDoNotCheckForTheTransfer) {
  const std::string secret(32, 's');
  const v1::HostTask prepare = Task("op-1", true, false, secret);
  const std::string prepare_ctx = TransferContext(prepare);
  const std::string transfer_ctx = TransferContext(Task("op-1", false, true, secret));
  auto proof = MakePeerProof(secret, prepare_ctx, "h0", "h1");
  ASSERT_TRUE(proof.ok()) << proof.status();
  EXPECT_TRUE(CheckPeerProof(secret, prepare_ctx, "h1", *proof).ok());
  auto wrong = CheckPeerProof(secret, transfer_ctx, "h1", *proof);
  EXPECT_TRUE(absl::IsPermissionDenied(wrong.status())) << wrong.status();

  const std::string digest(32, 'd');
  const std::string seal = MakeStepSeal(secret, prepare_ctx, "h0", "h1", 3, 100, digest);
  EXPECT_TRUE(CheckStepSeal(secret, prepare_ctx, "h0", "h1", 3, seal).ok());
  auto stale = CheckStepSeal(secret, transfer_ctx, "h0", "h1", 3, seal);
  EXPECT_TRUE(absl::IsDataLoss(stale.status())) << stale.status();

  EXPECT_NE(ChunkKey(secret, prepare_ctx, 3, 0), ChunkKey(secret, transfer_ctx, 3, 0));
}

}  // namespace
}  // namespace reshard::agent
