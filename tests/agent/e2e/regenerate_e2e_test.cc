// Workers are told which blobs were regenerated (issue 13): a job with a
// regenerable per-rank rng_state loses a host for good; the recovery
// zero-fills the values nobody holds any more, and OpenGeneration (through
// the C++ WorkerClient) reports `regenerated` for exactly those (rank, item)s
// and for no other, also after the agent that holds them restarts.
#include <gtest/gtest.h>

#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "client/cpp/worker_client.h"
#include "tests/agent/e2e/e2e_fixture.h"

namespace reshard::agent::testing {
namespace {

class RegenerateE2eTest : public AgentE2eTest {
 protected:
  std::string WorkerToken() {
    v1::GetWorkerTokenRequest req;
    req.set_job_id(job_id_);
    v1::GetWorkerTokenResponse resp;
    grpc::ClientContext ctx;
    grpc::Status s = stub_->GetWorkerToken(&ctx, req, &resp);
    EXPECT_TRUE(s.ok()) << s.error_message();
    return resp.worker_token();
  }

  // (rank, item name) of every item the agents of `layout` report as
  // regenerated in the current generation, loaded with the C++ WorkerClient.
  std::vector<std::pair<int, std::string>> Regenerated(const v1::Layout& layout) {
    client::WorkerClient::Options o;
    o.token = WorkerToken();
    std::vector<std::pair<int, std::string>> out;
    const std::vector<std::string> hosts = RankHosts(layout);
    for (size_t r = 0; r < hosts.size(); ++r) {
      client::WorkerClient worker(sockets_[hosts[r]], o);
      absl::StatusOr<client::LoadedShard> shard =
          worker.Load(job_id_, generation_, static_cast<int>(r));
      EXPECT_TRUE(shard.ok()) << "rank " << r << ": " << shard.status();
      if (!shard.ok()) continue;
      for (const std::string& name : shard->regenerated()) {
        out.emplace_back(static_cast<int>(r), name);
        // What the worker is told to regenerate is zeros, not a stale value.
        absl::StatusOr<absl::Span<const uint8_t>> bytes = shard->item_data(name);
        EXPECT_TRUE(bytes.ok()) << bytes.status();
        if (!bytes.ok()) continue;
        EXPECT_EQ(std::string(bytes->begin(), bytes->end()), std::string(bytes->size(), '\0'))
            << "rank " << r << " item " << name;
      }
    }
    return out;
  }

  // Kills `h`'s agent and starts it again on the same shm dir and socket.
  void Restart(const std::string& h) {
    agents_[h]->Kill();
    ASSERT_NO_FATAL_FAILURE(StartAgent(h));
    ASSERT_NO_FATAL_FAILURE(WaitHostsAlive());
  }
};

TEST_F(RegenerateE2eTest, OpenGenerationReportsExactlyTheRegeneratedBlobs) {
  // tp 2, pp 2, dp 2 on h0..h3 (two ranks a host): every tensor has a
  // data-parallel replica on another host, the per-rank rng_state none.
  v1::JobSpec spec = test_support::ReplicatedGptJobSpec("gpt-rng", "e2e");
  v1::BlobSpec* rng = spec.mutable_ptc()->add_blobs();
  rng->set_name("rng_state");
  rng->set_size_bytes(64);
  rng->set_scope(v1::BLOB_PER_RANK);
  rng->set_regenerable(true);
  ASSERT_NO_FATAL_FAILURE(RegisterAndPublish(spec));
  EXPECT_TRUE(Regenerated(spec.layout()).empty()) << "published buffers regenerate nothing";

  agents_["h1"]->Kill();  // old ranks 2 and 3, for good
  agents_.erase("h1");
  ASSERT_NO_FATAL_FAILURE(WaitLost("h1"));
  // New rank r needs old rank r's rng_state: ranks 0 and 1 (on h3) from h0,
  // ranks 2 and 3 (on h0) from the lost h1, so zeros for their workers to
  // regenerate. ExpectCommitted checks every byte (the zeros included).
  const v1::Layout target = MakeLayout(2, 2, 1, {"h3", "h0"}, 2);
  ASSERT_NO_FATAL_FAILURE(RecoverOnto("h1", target));
  const std::vector<std::pair<int, std::string>> want = {{2, "rng_state"}, {3, "rng_state"}};
  EXPECT_EQ(Regenerated(target), want);

  // The record is the buffer's: h0's agent restarts and still says so.
  ASSERT_NO_FATAL_FAILURE(Restart("h0"));
  EXPECT_EQ(Regenerated(target), want);
}

}  // namespace
}  // namespace reshard::agent::testing
