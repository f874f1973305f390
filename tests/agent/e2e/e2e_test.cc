// End to end: PostgreSQL, the real reshard-coordinator and four real
// reshard-agent processes (h0..h3, each with its own shm dir, UCX over
// loopback). The test plays the training workers: it registers a GPT-style
// job, publishes every rank's shards with random bytes through each host's
// WorkerService, runs resizes, a migration and a recovery, and after each
// commit compares every new rank's buffer, byte by byte, with the reference
// the independent verifier model derives. Faults are caused: an agent is
// SIGKILLed while its operation transfers, and a host is lost for good.
#include <gtest/gtest.h>
#include <stdlib.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "grpcpp/grpcpp.h"
#include "tests/agent/e2e/e2e_fixture.h"
#include "tests/agent/e2e/e2e_support.h"
#include "tests/coordinator/harness/test_postgres.h"
#include "tests/coordinator/server/coordinator_process.h"
#include "tests/coordinator/server/test_jobs.h"

namespace reshard::agent::testing {
namespace {

using coordinator::testing::MakeLayout;

TEST_F(AgentE2eTest, PublishedGenerationIsLoadable) {
  ASSERT_NO_FATAL_FAILURE(RegisterAndPublish(test_support::GptJobSpec("gpt", "e2e", {"h0", "h1"})));
  absl::Status v = Verify(sockets_, job_id_, 1, contents_);
  EXPECT_TRUE(v.ok()) << v;
}

TEST_F(AgentE2eTest, ResizesTpPpDpAndMigrates) {
  ASSERT_NO_FATAL_FAILURE(RegisterAndPublish(test_support::GptJobSpec("gpt", "e2e", {"h0", "h1"})));
  // Start: tp 2, pp 2, dp 2 on h0, h1 x 4.
  ASSERT_NO_FATAL_FAILURE(ResizeTo(MakeLayout(4, 2, 1, {"h0", "h1"}, 4)));              // TP up
  ASSERT_NO_FATAL_FAILURE(ResizeTo(MakeLayout(2, 2, 2, {"h0", "h1"}, 4)));              // TP down
  ASSERT_NO_FATAL_FAILURE(ResizeTo(MakeLayout(2, 4, 1, {"h0", "h1"}, 4)));              // PP up
  ASSERT_NO_FATAL_FAILURE(ResizeTo(MakeLayout(2, 2, 2, {"h0", "h1"}, 4)));              // PP down
  ASSERT_NO_FATAL_FAILURE(ResizeTo(MakeLayout(2, 2, 1, {"h2"}, 4)));                    // DP down
  ASSERT_NO_FATAL_FAILURE(ResizeTo(MakeLayout(2, 2, 2, {"h0", "h1", "h2", "h3"}, 2)));  // DP up

  // Migrate: same config, every rank on another host.
  v1::Layout target = MakeLayout(2, 2, 2, {"h2", "h3", "h0", "h1"}, 2);
  ASSERT_NO_FATAL_FAILURE(MigrateTo(target));
}

TEST_F(AgentE2eTest, RecoversFromALostHost) {
  // One data-parallel replica of one stage per host: h1 holds a copy of h0's.
  ASSERT_NO_FATAL_FAILURE(
      RegisterAndPublish(test_support::ReplicatedGptJobSpec("gpt-replicated", "e2e")));
  agents_["h1"]->Kill();
  ASSERT_NO_FATAL_FAILURE(WaitLost("h1"));

  v1::Layout target = MakeLayout(2, 2, 1, {"h3", "h0"}, 2);
  ASSERT_NO_FATAL_FAILURE(RecoverOnto("h1", target));
}

TEST_F(AgentE2eTest, AgentKilledMidTransferAbortsAndRetrySucceeds) {
  ASSERT_NO_FATAL_FAILURE(RegisterAndPublish(test_support::GptJobSpec("gpt", "e2e", {"h0", "h1"})));
  // Every new rank on h2, h3: both old hosts send, both new hosts receive.
  const v1::Layout target = MakeLayout(2, 2, 2, {"h2", "h3"}, 4);
  v1::Operation op = StartResize(target);
  ASSERT_FALSE(op.id().empty());
  // Kill a destination as soon as the transfer starts.
  op = WaitTransferring(op);
  ASSERT_EQ(op.state(), v1::OPERATION_STATE_TRANSFERRING);
  agents_["h3"]->Kill();
  op = WaitFinal(op.id());
  EXPECT_EQ(op.state(), v1::OPERATION_STATE_ABORTED) << op.error();

  // The old generation is intact and loadable on its hosts.
  absl::Status v = Verify(sockets_, job_id_, generation_, contents_);
  ASSERT_TRUE(v.ok()) << v;

  // The agent comes back (same shm dir) and the retry commits.
  ASSERT_NO_FATAL_FAILURE(StartAgent("h3"));
  ASSERT_NO_FATAL_FAILURE(WaitHostsAlive());
  ASSERT_NO_FATAL_FAILURE(ExpectCommitted(StartResizeOnceAccepted(target), target));
}

TEST_F(AgentE2eTest, WorkerServiceRefusesBadRequests) {
  const v1::JobSpec spec = test_support::GptJobSpec("gpt", "e2e", {"h0", "h1"});
  v1::RegisterJobRequest rj;
  *rj.mutable_spec() = spec;
  v1::RegisterJobResponse job;
  grpc::ClientContext rctx;
  ASSERT_TRUE(stub_->RegisterJob(&rctx, rj, &job).ok());
  SetWorkerToken(job.job().id(), job.worker_token());
  auto worker = v1::WorkerService::NewStub(
      grpc::CreateChannel("unix:" + sockets_["h0"], grpc::InsecureChannelCredentials()));
  auto publish = [&](int64_t generation, int rank) {
    v1::PublishShardRequest req;
    req.set_job_id(job.job().id());
    req.set_generation(generation);
    req.set_rank(rank);
    v1::PublishShardResponse resp;
    grpc::ClientContext ctx;
    AddWorkerToken(&ctx, job.job().id());
    return worker->PublishShard(&ctx, req, &resp).error_code();
  };
  EXPECT_EQ(publish(2, 0), grpc::StatusCode::FAILED_PRECONDITION);  // not the current one
  EXPECT_EQ(publish(1, 8), grpc::StatusCode::INVALID_ARGUMENT);     // world is 8
  {
    v1::PublishShardRequest req;
    req.set_job_id("no-such-job");
    req.set_generation(1);
    v1::PublishShardResponse resp;
    grpc::ClientContext ctx;
    AddWorkerToken(&ctx, job.job().id());  // the token of another job, which does not exist
    EXPECT_EQ(worker->PublishShard(&ctx, req, &resp).error_code(), grpc::StatusCode::NOT_FOUND);
  }
  ASSERT_EQ(publish(1, 0), grpc::StatusCode::OK);

  v1::OpenGenerationRequest open;
  open.set_job_id(job.job().id());
  open.set_generation(1);
  open.set_rank(0);
  v1::OpenGenerationResponse opened;
  {
    grpc::ClientContext ctx;
    AddWorkerToken(&ctx, job.job().id());
    EXPECT_EQ(worker->OpenGeneration(&ctx, open, &opened).error_code(),
              grpc::StatusCode::FAILED_PRECONDITION);  // not sealed yet
  }
  open.set_rank(1);
  {
    grpc::ClientContext ctx;
    AddWorkerToken(&ctx, job.job().id());
    EXPECT_EQ(worker->OpenGeneration(&ctx, open, &opened).error_code(),
              grpc::StatusCode::NOT_FOUND);  // never published
  }

  v1::SealShardRequest seal;
  seal.set_job_id(job.job().id());
  seal.set_generation(1);
  seal.set_rank(0);
  v1::SealShardResponse sealed;
  {
    grpc::ClientContext ctx;
    AddWorkerToken(&ctx, job.job().id());
    ASSERT_TRUE(worker->SealShard(&ctx, seal, &sealed).ok());
  }
  // Sealing again with a wrong expected checksum for the first item.
  for (int i = 0; i < sealed.checksums_size(); ++i) {
    seal.add_expected_checksums(sealed.checksums(i) + (i == 0 ? 1 : 0));
  }
  v1::SealShardResponse resealed;
  {
    grpc::ClientContext ctx;
    AddWorkerToken(&ctx, job.job().id());
    EXPECT_EQ(worker->SealShard(&ctx, seal, &resealed).error_code(), grpc::StatusCode::DATA_LOSS);
  }
  open.set_rank(0);
  {
    grpc::ClientContext ctx;
    AddWorkerToken(&ctx, job.job().id());
    ASSERT_TRUE(worker->OpenGeneration(&ctx, open, &opened).ok());
    EXPECT_EQ(opened.checksums_size(), sealed.checksums_size());
    ASSERT_GT(opened.items_size(), 0);
    EXPECT_EQ(opened.items(0).name(), spec.ptc().tensors(0).name());
  }
}

// docs/security.md, "Worker tokens": the agent serves a worker-socket call
// only with the worker token of the job it names.
TEST_F(AgentE2eTest, WorkerSocketNeedsTheJobsWorkerToken) {
  std::vector<v1::RegisterJobResponse> jobs(2);
  for (int i = 0; i < 2; ++i) {
    v1::RegisterJobRequest rj;
    *rj.mutable_spec() = test_support::GptJobSpec(absl::StrCat("tok", i), "e2e", {"h0", "h1"});
    grpc::ClientContext rctx;
    ASSERT_TRUE(stub_->RegisterJob(&rctx, rj, &jobs[i]).ok());
    ASSERT_FALSE(jobs[i].worker_token().empty());
  }
  auto worker = v1::WorkerService::NewStub(
      grpc::CreateChannel("unix:" + sockets_["h0"], grpc::InsecureChannelCredentials()));
  auto publish = [&](const std::string& job_id, const std::string* token, std::string* message) {
    v1::PublishShardRequest req;
    req.set_job_id(job_id);
    req.set_generation(1);
    req.set_rank(0);
    v1::PublishShardResponse resp;
    grpc::ClientContext ctx;
    if (token != nullptr) ctx.AddMetadata("authorization", "Bearer " + *token);
    grpc::Status s = worker->PublishShard(&ctx, req, &resp);
    if (message != nullptr) *message = s.error_message();
    return s.error_code();
  };
  const std::string& job0 = jobs[0].job().id();
  std::string message;
  EXPECT_EQ(publish(job0, nullptr, &message), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_TRUE(absl::StrContains(message, job0)) << message;
  EXPECT_EQ(publish(job0, &jobs[1].worker_token(), &message), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_TRUE(absl::StrContains(message, absl::StrCat("job \"", job0, "\""))) << message;
  EXPECT_FALSE(absl::StrContains(message, jobs[1].worker_token())) << message;
  const std::string forged = "wt-" + job0 + ".AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA";
  EXPECT_EQ(publish(job0, &forged, nullptr), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_EQ(publish(job0, &jobs[0].worker_token(), &message), grpc::StatusCode::OK) << message;
}

TEST_F(AgentE2eTest, SigtermStopsAgentCleanly) {
  absl::StatusOr<int> rc = agents_["h2"]->Terminate();
  ASSERT_TRUE(rc.ok()) << rc.status();
  EXPECT_EQ(*rc, 0);
}

}  // namespace
}  // namespace reshard::agent::testing
