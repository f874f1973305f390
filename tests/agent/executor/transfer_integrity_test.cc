// End-to-end integrity of cross-host steps (step_seal.h), with the fault
// caused for real: bytes altered between the wire and the receiver (a
// transport wrapper on the receiving host), a seal altered the same way, and
// a rogue process that knows the operation's secret and tags and sends other
// bytes before the real sender. Each time the receiver fails with DATA_LOSS
// naming the job, item, step and source host, keeps no new buffer, and the
// old generation is intact; an untouched transfer still passes.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "agent/executor/peer_proof.h"
#include "agent/executor/step_seal.h"
#include "agent/executor/transfer_tags.h"
#include "tests/agent/executor/executor_fixture.h"

namespace reshard::agent {
namespace {

using namespace executor_testing;  // NOLINT: the fixture's helpers
using ::testing::HasSubstr;

constexpr char kSecret[] = "0123456789abcdef0123456789abcdef";

// Forwards to the host's own transport; flips one byte of the first message
// received that `pick(tag)` selects, after the transport wrote it and before
// the executor sees it; optionally swallows some sends.
class TamperingTransport : public Transport {
 public:
  TamperingTransport(Transport* own, std::function<bool(uint64_t tag)> pick)
      : own_(own), pick_(std::move(pick)) {}
  std::string name() const override { return own_->name(); }
  std::string LocalAddress() const override { return own_->LocalAddress(); }
  absl::Status Connect(const std::string& peer, const std::string& address) override {
    return own_->Connect(peer, address);
  }
  void Send(const std::string& peer, uint64_t tag, const void* data, size_t bytes,
            TransferDone done) override {
    if (drop_send_ && drop_send_(tag)) {
      done(absl::OkStatus());  // "sent", never delivered
      return;
    }
    own_->Send(peer, tag, data, bytes, std::move(done));
  }
  /// Sends that `pick(tag)` selects complete without leaving this host.
  void DropSends(std::function<bool(uint64_t tag)> pick) { drop_send_ = std::move(pick); }
  void Receive(uint64_t tag, void* data, size_t bytes, TransferDone done) override {
    own_->Receive(tag, data, bytes, [this, tag, data, bytes, done](absl::Status s) {
      if (s.ok() && bytes > 0 && pick_(tag) && !tampered_.exchange(true)) {
        static_cast<uint8_t*>(data)[bytes / 2] ^= 0x5a;
        tampered_step_ = StepOfTag(tag);
      }
      done(std::move(s));
    });
  }
  void CancelTags(uint64_t tag, uint64_t mask) override { own_->CancelTags(tag, mask); }
  void Shutdown() override { own_->Shutdown(); }

  bool tampered() const { return tampered_.load(); }
  int64_t tampered_step() const { return tampered_step_.load(); }

 private:
  Transport* own_;
  std::function<bool(uint64_t)> pick_;
  std::function<bool(uint64_t)> drop_send_;
  std::atomic<bool> tampered_{false};
  std::atomic<int64_t> tampered_step_{-1};
};

class TransferIntegrityTest : public ExecutorTest {
 protected:
  v1::HostTask SecretTask() {
    v1::HostTask whole = WholeTask();
    whole.set_transfer_secret(kSecret);
    return whole;
  }

  // The old generation of every rank matches the global tensors.
  void ExpectOldGenerationIntact() {
    const auto slots = planner::ExpandPlacement(from_.placement());
    for (int r = 0; r < static_cast<int>(slots.size()); ++r) {
      Host& h = hosts_[slots[r].host() == "h0" ? 0 : 1];
      auto got = h.store->Get({kJob, 1, r});
      ASSERT_TRUE(got.ok()) << got.status();
      EXPECT_TRUE((*got)->sealed());
      VectorBuffer want((*got)->items(), (*got)->size());
      RenderRank(ptc_, from_, r, 6, &want);
      EXPECT_EQ(0, std::memcmp(want.data(), (*got)->data(), want.size())) << "rank " << r;
    }
  }

  // The cross-host steps from h0 to h1 of `whole`.
  std::vector<const v1::CopyStep*> StepsToH1(const v1::HostTask& whole) {
    const auto old_slots = planner::ExpandPlacement(from_.placement());
    const auto new_slots = planner::ExpandPlacement(to_.placement());
    std::vector<const v1::CopyStep*> out;
    for (const v1::CopyStep& s : whole.plan().steps()) {
      if (old_slots[s.src_rank()].host() == "h0" && new_slots[s.dsts(0).rank()].host() == "h1") {
        out.push_back(&s);
      }
    }
    return out;
  }

  TamperingTransport* tamper_ = nullptr;  // h1's, when wrapped
};

TEST_F(TransferIntegrityTest, AnUntouchedTransferWithTheSecretPasses) {
  MakeHosts();
  FillOld();
  ExpectResharded(SecretTask(), 6);
}

// Many chunks per step (1000 bytes against rows of 1024, 96 and 16),
// strided at both ends (packed and unpacked through staging) and fanned out
// to two ranks: the tags of both ends agree chunk by chunk.
TEST_F(TransferIntegrityTest, ChunkedStridedAndFanOutStepsWithTheSecretPass) {
  ptc_ = ExecutorPtc(256);
  v1::TensorSpec c = Tensor("c", {64, 96});
  SetTpSplit(&c, 1);
  *ptc_.add_tensors() = c;
  from_ = MakeLayoutOnHosts(3, 1, 1, 3);
  to_ = MakeLayoutOnHosts(2, 1, 4, 4);
  MakeHosts(int64_t{1} << 30, 1000);
  FillOld();
  v1::HostTask whole = SecretTask();
  int64_t most_chunks = 0;
  for (const v1::CopyStep* s : StepsToH1(whole)) {
    const std::vector<int64_t> shape(s->shape().begin(), s->shape().end());
    const auto& item = whole.plan().items(s->item());
    most_chunks = std::max(most_chunks, StepChunks(shape, item.element_bytes(), 1000).count());
  }
  ASSERT_GT(most_chunks, 10);
  ExpectResharded(whole, 3);
}

TEST_F(TransferIntegrityTest, BytesAlteredInFlightAreDataLossAndNothingIsCommitted) {
  wrap_transport_ = [this](const std::string& host, Transport* own) -> std::unique_ptr<Transport> {
    if (host != "h1") return nullptr;
    auto t = std::make_unique<TamperingTransport>(own, [](uint64_t tag) {
      return StepOfTag(tag) != kProofStepIndex && ChunkOfTag(tag) != kSealChunk;  // data
    });
    tamper_ = t.get();
    return t;
  };
  MakeHosts();
  FillOld();
  const v1::HostTask whole = SecretTask();
  ASSERT_FALSE(StepsToH1(whole).empty());
  auto results = RunHosts(whole);
  ASSERT_TRUE(tamper_->tampered());
  const absl::Status& h1 = results[1].status();
  ASSERT_EQ(h1.code(), absl::StatusCode::kDataLoss) << h1;
  const std::string msg(h1.message());
  EXPECT_THAT(msg, HasSubstr("job \"job-x\""));
  EXPECT_THAT(msg, HasSubstr(absl::StrCat(" step ", tamper_->tampered_step(), " ")));
  EXPECT_THAT(msg, HasSubstr("from source host \"h0\""));
  EXPECT_THAT(msg, HasSubstr("differ from the"));
  EXPECT_THAT(msg, ::testing::MatchesRegex(".*item [0-9]+ \\(\"[a-z]+\"\\).*"));
  EXPECT_EQ(NewBuffers(hosts_[1]), 0);
  EXPECT_EQ(hosts_[1].transport->pending(), 0u);
  ExpectOldGenerationIntact();
}

TEST_F(TransferIntegrityTest, AnAlteredSealIsDataLoss) {
  wrap_transport_ = [this](const std::string& host, Transport* own) -> std::unique_ptr<Transport> {
    if (host != "h1") return nullptr;
    auto t = std::make_unique<TamperingTransport>(
        own, [](uint64_t tag) { return ChunkOfTag(tag) == kSealChunk; });
    tamper_ = t.get();
    return t;
  };
  MakeHosts();
  FillOld();
  auto results = RunHosts(SecretTask());
  ASSERT_TRUE(tamper_->tampered());
  const absl::Status& h1 = results[1].status();
  ASSERT_EQ(h1.code(), absl::StatusCode::kDataLoss) << h1;
  EXPECT_THAT(std::string(h1.message()), HasSubstr("does not check under the operation's"));
  EXPECT_THAT(std::string(h1.message()), HasSubstr("from source host \"h0\""));
  EXPECT_EQ(NewBuffers(hosts_[1]), 0);
  ExpectOldGenerationIntact();
}

// A process that knows the operation's secret (so its tags) but is not the
// step's source sends other bytes under the tag of a step from h0 to h1
// before h0 does: h1 receives them (tags match any peer), but they are not
// what h0 sealed.
TEST_F(TransferIntegrityTest, BytesFromARogueSenderWithTheSecretAreDataLoss) {
  MakeHosts();
  FillOld();
  const v1::HostTask whole = SecretTask();
  // The smallest step from h0 to h1: one chunk, sent eagerly by both.
  const v1::CopyStep* target = nullptr;
  for (const v1::CopyStep* s : StepsToH1(whole)) {
    if (target == nullptr || s->bytes() < target->bytes()) target = s;
  }
  ASSERT_NE(target, nullptr);
  ASSERT_LE(target->bytes(), 1024);
  auto rogue = MakeUcxTransportImpl(UcxOptions{"lo", "tcp,self"});
  ASSERT_TRUE(rogue.ok()) << rogue.status();
  ASSERT_TRUE((*rogue)->Connect("h1", hosts_[1].transport->LocalAddress()).ok());
  const uint64_t tag =
      TransferTag(TransferTagKey(kSecret, whole.operation_id()), target->index(), 0).value();
  std::vector<uint8_t> forged(target->bytes(), 0xee);
  std::promise<absl::Status> sent;
  (*rogue)->Send("h1", tag, forged.data(), forged.size(),
                 [&](absl::Status s) { sent.set_value(std::move(s)); });
  auto f = sent.get_future();
  ASSERT_EQ(f.wait_for(std::chrono::seconds(30)), std::future_status::ready);
  ASSERT_TRUE(f.get().ok());
  // h1 posts no data receive before the proofs: the rogue's message waits
  // there, ahead of h0's.
  auto results = RunHosts(whole);
  const absl::Status& h1 = results[1].status();
  ASSERT_EQ(h1.code(), absl::StatusCode::kDataLoss) << h1;
  EXPECT_THAT(std::string(h1.message()),
              HasSubstr(absl::StrCat(" step ", target->index(), " from source host \"h0\"")));
  EXPECT_EQ(NewBuffers(hosts_[1]), 0);
  ExpectOldGenerationIntact();
  (*rogue)->Shutdown();
}

// The sender of a step sends its data but dies before its seals (here: a
// wrapper on h0 swallows them): the receiver reports nothing, it fails
// naming the step whose seal is missing and its source.
TEST_F(TransferIntegrityTest, AMissingSealFailsTheReceiverNamingStepAndSource) {
  seal_timeout_ms_ = 500;
  wrap_transport_ = [this](const std::string& host, Transport* own) -> std::unique_ptr<Transport> {
    if (host != "h0") return nullptr;
    auto t = std::make_unique<TamperingTransport>(own, [](uint64_t) { return false; });
    t->DropSends([](uint64_t tag) { return ChunkOfTag(tag) == kSealChunk; });
    tamper_ = t.get();
    return t;
  };
  MakeHosts();
  FillOld();
  auto results = RunHosts(SecretTask());
  const absl::Status& h1 = results[1].status();
  ASSERT_EQ(h1.code(), absl::StatusCode::kDeadlineExceeded) << h1;
  EXPECT_THAT(std::string(h1.message()),
              ::testing::MatchesRegex(".*no seal of step [0-9]+ \\(item [0-9]+ .*\\) "
                                      "from host \"h0\".*"));
  EXPECT_EQ(NewBuffers(hosts_[1]), 0);
  ExpectOldGenerationIntact();
}

// ---- the message (unit) ----

TEST(StepSealTest, ChecksOnlyForTheSameSecretOperationHostsStepBytesAndDigest) {
  const std::string digest = StepDigest({ChunkTag{1}, ChunkTag{2}});
  const std::string seal = MakeStepSeal(kSecret, "op", "h0", "h1", 7, 1000, digest);
  ASSERT_EQ(seal.size(), kStepSealBytes);
  auto ok = CheckStepSeal(kSecret, "op", "h0", "h1", 7, seal);
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_EQ(ok->bytes, 1000);
  EXPECT_EQ(ok->digest, digest);
  const std::string other_secret(32, 'x');
  EXPECT_TRUE(absl::IsDataLoss(CheckStepSeal(other_secret, "op", "h0", "h1", 7, seal).status()));
  EXPECT_TRUE(absl::IsDataLoss(CheckStepSeal(kSecret, "op2", "h0", "h1", 7, seal).status()));
  EXPECT_TRUE(absl::IsDataLoss(CheckStepSeal(kSecret, "op", "h2", "h1", 7, seal).status()));
  EXPECT_TRUE(absl::IsDataLoss(CheckStepSeal(kSecret, "op", "h0", "h2", 7, seal).status()));
  EXPECT_TRUE(absl::IsDataLoss(CheckStepSeal(kSecret, "op", "h0", "h1", 8, seal).status()));
  for (size_t at : {size_t{0}, size_t{8}, size_t{16}, size_t{60}}) {  // step, bytes, digest, MAC
    std::string altered = seal;
    altered[at] ^= 1;
    auto s = CheckStepSeal(kSecret, "op", "h0", "h1", 7, altered).status();
    EXPECT_TRUE(absl::IsDataLoss(s)) << at << ": " << s;
    EXPECT_THAT(std::string(s.message()), HasSubstr("step 7 from host \"h0\"")) << at;
  }
  EXPECT_TRUE(absl::IsDataLoss(CheckStepSeal(kSecret, "op", "h0", "h1", 7, "short").status()));
}

TEST(StepSealTest, ChunkTagsDependOnEveryByteAndOnTheChunksKey) {
  std::vector<uint8_t> bytes(100000, 3);
  const std::string key = ChunkKey(kSecret, "op", 7, 0);
  ASSERT_EQ(key.size(), 32u);
  const ChunkTag tag = ChunkTagOf(key, bytes.data(), bytes.size());
  EXPECT_EQ(tag, ChunkTagOf(key, bytes.data(), bytes.size()));
  for (size_t at : {size_t{0}, size_t{50000}, bytes.size() - 1}) {
    std::vector<uint8_t> altered = bytes;
    altered[at] ^= 0x80;
    EXPECT_NE(tag, ChunkTagOf(key, altered.data(), altered.size())) << at;
  }
  EXPECT_NE(tag, ChunkTagOf(key, bytes.data(), bytes.size() - 1));
  for (const std::string& other : {ChunkKey(kSecret, "op", 7, 1), ChunkKey(kSecret, "op", 8, 0),
                                   ChunkKey(kSecret, "op2", 7, 0), ChunkKey("s", "op", 7, 0)}) {
    EXPECT_NE(key, other);
    EXPECT_NE(tag, ChunkTagOf(other, bytes.data(), bytes.size()));
  }
  // The digest follows the tags' order.
  EXPECT_NE(StepDigest({ChunkTag{1}, ChunkTag{2}}), StepDigest({ChunkTag{2}, ChunkTag{1}}));
}

}  // namespace
}  // namespace reshard::agent
