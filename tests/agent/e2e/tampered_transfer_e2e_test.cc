// Tampered transfers through the whole system (issue 11 item 4): PostgreSQL,
// the real coordinator and real agents (e2e_fixture.h), one of which is
// replaced by a rogue (rogue_agent_main.cc) that holds its host's shards and
// its operation's secret but alters what it sends: the MAC of its transfer
// proofs, or the bytes of its data chunks. The honest receivers refuse (a
// wrong proof: PERMISSION_DENIED naming the host; altered bytes: DATA_LOSS
// naming the step and source host), the coordinator aborts the operation
// without committing bytes nobody verified, and the job's generation 1 is
// intact byte for byte; with the real agent back, the same resize commits.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <chrono>
#include <string>
#include <thread>

#include "absl/strings/str_cat.h"
#include "tests/agent/e2e/e2e_fixture.h"

namespace reshard::agent::testing {
namespace {

using ::testing::HasSubstr;

class TamperedTransferE2eTest : public AgentE2eTest {
 protected:
  // Replaces host `h`'s agent by the rogue (same flags, shm dir and socket).
  void StartRogue(const std::string& h, const std::string& tamper) {
    agents_[h]->Kill();
    AgentProcess::Options o;
    o.host_id = h;
    o.coordinator = coordinator_->address();
    o.worker_socket = sockets_[h];
    o.shm_dir = dir_ + "/shm-" + h;
    o.extra_args = {"--memory-limit-bytes", std::to_string(int64_t{1} << 30), "--insecure"};
    o.env = {{"UCX_NET_DEVICES", "lo"}, {"UCX_TLS", "tcp,self"}};
    o.wrapper = {RESHARD_ROGUE_AGENT_BIN, "--tamper", tamper};
    auto a = AgentProcess::Start(o);
    ASSERT_TRUE(a.ok()) << a.status();
    agents_[h] = std::move(*a);
  }

  // Resizes to `target`, retrying while the coordinator refuses a new
  // operation (a host that just came back); expects it to abort and returns
  // its error.
  std::string ExpectAborted(const v1::Layout& target) {
    v1::Operation op = StartResizeOnceAccepted(target);
    EXPECT_FALSE(op.id().empty());
    op = WaitFinal(op.id());
    EXPECT_EQ(op.state(), v1::OPERATION_STATE_ABORTED) << op.error();
    return op.error();
  }

  // The job is still at generation 1 and every byte of it is intact (the
  // real agent back on the rogue's host).
  void ExpectGenerationOneIntact(const std::string& rogue_host) {
    EXPECT_EQ(GetJob().generation(), 1);
    agents_[rogue_host]->Kill();
    ASSERT_NO_FATAL_FAILURE(StartAgent(rogue_host));
    ASSERT_NO_FATAL_FAILURE(WaitHostsAlive());
    absl::Status v = Verify(sockets_, job_id_, 1, contents_);
    ASSERT_TRUE(v.ok()) << v;
  }
};

// Every new rank on h2, h3: both old hosts (h0, and h1 the rogue) send.
v1::Layout Target() { return coordinator::testing::MakeLayout(2, 2, 2, {"h2", "h3"}, 4); }

TEST_F(TamperedTransferE2eTest, AWrongTransferProofIsRefusedAndNothingIsCommitted) {
  ASSERT_NO_FATAL_FAILURE(RegisterAndPublish(test_support::GptJobSpec("gpt", "e2e", {"h0", "h1"})));
  ASSERT_NO_FATAL_FAILURE(StartRogue("h1", "proof"));
  ASSERT_NO_FATAL_FAILURE(WaitHostsAlive());
  const std::string error = ExpectAborted(Target());
  EXPECT_THAT(error, HasSubstr("PERMISSION_DENIED"));
  EXPECT_THAT(error, HasSubstr("peer host \"h1\" sent a wrong proof"));
  ASSERT_NO_FATAL_FAILURE(ExpectGenerationOneIntact("h1"));
  // The honest agent is back: the same resize commits, byte for byte.
  ASSERT_NO_FATAL_FAILURE(ExpectCommitted(StartResizeOnceAccepted(Target()), Target()));
}

TEST_F(TamperedTransferE2eTest, BytesAlteredAfterTheSourceReadAreDataLossAndNothingIsCommitted) {
  ASSERT_NO_FATAL_FAILURE(RegisterAndPublish(test_support::GptJobSpec("gpt", "e2e", {"h0", "h1"})));
  ASSERT_NO_FATAL_FAILURE(StartRogue("h1", "data"));
  ASSERT_NO_FATAL_FAILURE(WaitHostsAlive());
  const std::string error = ExpectAborted(Target());
  EXPECT_THAT(error, HasSubstr("DATA_LOSS"));
  EXPECT_THAT(error, HasSubstr(absl::StrCat("job \"", job_id_, "\"")));
  EXPECT_THAT(error, HasSubstr("from source host \"h1\""));
  EXPECT_THAT(error, HasSubstr("differ from the"));
  ASSERT_NO_FATAL_FAILURE(ExpectGenerationOneIntact("h1"));
}

}  // namespace
}  // namespace reshard::agent::testing
