// The worker API against the buffers operations write, and the memory the
// worker service keeps (issue 19, defects 1 and 4), end to end: PostgreSQL,
// the real reshard-coordinator and four real reshard-agent processes; the
// test plays the workers, holding the job's worker token.
//
// Defect 1: a worker that SealShard-ed the destination buffer of a new
// generation while an operation wrote it made the agent remap it read-only
// under the operation's writes (SIGSEGV in UCX's receive, or "sealed already"
// aborts). Two cases cause it for real: a stop-free resize whose prepared
// pre-copy waits, unsealed, in the new generation's buffers until the
// cut-over (a window that stays open, so the first call hits it), and a
// migration whose UCX transfer receives into a 31 MiB rank buffer while a
// worker seals it in a loop (the issue's own reproduction, three attempts).
// Every such call must answer FAILED_PRECONDITION naming job, generation and
// rank, the agents stay up, and the operation commits byte for byte.
//
// Defect 4: 30 checkpoints of a 2,000-tensor PTC (about 1 MB of heap per
// generation in the agent) leave the worker service's cache and the agent's
// RSS flat, and DeleteJob empties the cache.
#include <signal.h>
#include <sys/types.h>

#include <atomic>
#include <chrono>
#include <fstream>
#include <functional>
#include <iostream>
#include <limits>
#include <map>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "tests/agent/e2e/e2e_fixture.h"
#include "tests/coordinator/server/scrape.h"
#include "tests/support/job_builders.h"
#include "tests/support/wait.h"

namespace reshard::agent::testing {
namespace {

using Clock = std::chrono::steady_clock;
using coordinator::testing::MetricValue;
constexpr int64_t kBatch = 8;

// Whether `pid` is a live process (not gone, not a zombie).
bool Running(pid_t pid) {
  std::ifstream stat(absl::StrCat("/proc/", pid, "/stat"));
  std::string line;
  if (!std::getline(stat, line)) return false;
  const size_t paren = line.rfind(')');
  return paren != std::string::npos && paren + 2 < line.size() && line[paren + 2] != 'Z';
}

// VmRSS of `pid` in bytes (0 when unknown).
int64_t RssBytes(pid_t pid) {
  std::ifstream status(absl::StrCat("/proc/", pid, "/status"));
  std::string line;
  while (std::getline(status, line)) {
    if (absl::StartsWith(line, "VmRSS:")) {
      std::istringstream in(line.substr(6));
      int64_t kb = 0;
      in >> kb;
      return kb * 1024;
    }
  }
  return 0;
}

class WorkerGuardE2eTest : public AgentE2eTest {
 protected:
  std::unique_ptr<v1::WorkerService::Stub> Worker(const std::string& host) {
    return v1::WorkerService::NewStub(
        grpc::CreateChannel("unix:" + sockets_[host], grpc::InsecureChannelCredentials()));
  }

  // A worker holding the job's token seals (job, generation, rank) on `host`.
  grpc::Status SealShard(const std::string& host, int64_t generation, int rank) {
    v1::SealShardRequest req;
    req.set_job_id(job_id_);
    req.set_generation(generation);
    req.set_rank(rank);
    v1::SealShardResponse resp;
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
    AddWorkerToken(&ctx, job_id_);
    return Worker(host)->SealShard(&ctx, req, &resp);
  }
  grpc::Status PublishShard(const std::string& host, int64_t generation, int rank) {
    v1::PublishShardRequest req;
    req.set_job_id(job_id_);
    req.set_generation(generation);
    req.set_rank(rank);
    v1::PublishShardResponse resp;
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
    AddWorkerToken(&ctx, job_id_);
    return Worker(host)->PublishShard(&ctx, req, &resp);
  }
  grpc::Status OpenGeneration(const std::string& host, int64_t generation, int rank) {
    v1::OpenGenerationRequest req;
    req.set_job_id(job_id_);
    req.set_generation(generation);
    req.set_rank(rank);
    v1::OpenGenerationResponse resp;
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
    AddWorkerToken(&ctx, job_id_);
    return Worker(host)->OpenGeneration(&ctx, req, &resp);
  }

  // FAILED_PRECONDITION whose message names the job, the generation and the
  // rank.
  void ExpectRefused(const grpc::Status& s, int64_t generation, int rank, const std::string& what) {
    if (s.error_code() != grpc::StatusCode::FAILED_PRECONDITION) {
      ADD_FAILURE() << what << " answered " << s.error_code() << " \"" << s.error_message()
                    << "\", not FAILED_PRECONDITION";
      return;
    }
    EXPECT_TRUE(absl::StrContains(s.error_message(), job_id_)) << what << ": " << s.error_message();
    EXPECT_TRUE(absl::StrContains(s.error_message(), absl::StrCat("generation ", generation)))
        << what << ": " << s.error_message();
    EXPECT_TRUE(absl::StrContains(s.error_message(), absl::StrCat("rank ", rank)))
        << what << ": " << s.error_message();
  }

  void ExpectAgentsRunning() {
    for (const auto& [host, agent] : agents_) {
      EXPECT_TRUE(Running(agent->pid())) << "the agent of " << host << " died";
    }
  }
};

// The deterministic window: a stop-free resize's agents pre-copy the new
// layout into generation 3's buffers and hold them, unsealed, until the
// cut-over writes the changed shards into them. On the code before the fix
// SealShard sealed them (remapping them read-only), and the cut-over's writes
// then killed the agent or failed the operation.
TEST_F(WorkerGuardE2eTest, AWorkerCannotSealOrPublishAPreparedBuffer) {
  const v1::DatasetState d = TokensDataset(kBatch);
  const v1::JobSpec spec = test_support::GptJobSpec("gpt", "e2e", {"h0", "h1"});
  v1::Job job;
  ASSERT_NO_FATAL_FAILURE(RegisterAndPublish(spec, &d, &job));
  // tp 2 -> 4 onto h0 and h2 (ranks 0-3 on h0, 4-7 on h2).
  const v1::Layout target = MakeLayout(4, 2, 1, {"h0", "h2"}, 4);
  const v1::Operation started = StartResize(target, /*stop_free=*/true);
  ASSERT_FALSE(started.id().empty());
  const v1::Operation prepared = WaitUntil(
      started.id(), [](const v1::Operation& o) { return o.agents_prepared_unix_ms() > 0; });
  ASSERT_GT(prepared.agents_prepared_unix_ms(), 0)
      << v1::OperationState_Name(prepared.state()) << " " << prepared.error();
  const int64_t pending = started.to_generation();

  const std::vector<std::string> hosts = RankHosts(target);
  for (int rank = 0; rank < static_cast<int>(hosts.size()); ++rank) {
    SCOPED_TRACE(absl::StrCat("rank ", rank, " on ", hosts[rank]));
    ExpectRefused(SealShard(hosts[rank], pending, rank), pending, rank, "SealShard");
    ExpectRefused(PublishShard(hosts[rank], pending, rank), pending, rank, "PublishShard");
    ExpectRefused(OpenGeneration(hosts[rank], pending, rank), pending, rank, "OpenGeneration");
  }
  ExpectAgentsRunning();

  // The workers are warm; the old layout's checkpoint of step 1 (every other
  // tensor changed) cuts over, writing the changed shards into the prepared
  // buffers.
  v1::MarkPreparedRequest mark;
  mark.set_operation_id(started.id());
  v1::Operation marked;
  grpc::ClientContext mctx;
  ASSERT_TRUE(stub_->MarkPrepared(&mctx, mark, &marked).ok());
  auto step1 = EvenTensorsChanged();
  ASSERT_TRUE(step1.ok()) << step1.status();
  v1::CheckpointRequest cut;
  cut.set_job_id(job_id_);
  cut.set_expected_generation(generation_);
  cut.set_with_step(true);
  cut.set_step(1);
  cut.set_cursor(kBatch);
  cut.set_layout_fingerprint(job.dataset_state().layout_fingerprint());
  cut.set_cut_over_operation_id(started.id());
  const v1::Operation checkpoint = Checkpoint(cut);
  ASSERT_FALSE(checkpoint.id().empty());
  absl::Status published = PublishCheckpoint(checkpoint.to_generation(), *step1);
  ASSERT_TRUE(published.ok()) << published;

  const v1::Operation op = WaitFinal(started.id());
  ExpectAgentsRunning();
  ASSERT_EQ(op.state(), v1::OPERATION_STATE_COMMITTED) << op.error();
  auto want = Reshard(ptc_, *step1, target, {});
  ASSERT_TRUE(want.ok()) << want.status();
  absl::Status v = Verify(sockets_, job_id_, pending, *want);
  EXPECT_TRUE(v.ok()) << v;
}

// The reproduction: the job in both layouts on the same hosts (tp 2
// on h0,h1 -> h1,h0, a 62.5 MiB tensor, 31 MiB per rank received over UCX),
// and a worker with the job's token sealing the new generation's rank
// buffers in a loop while the transfer receives into them. Three attempts;
// on the code before the fix the first one already sealed a buffer under the
// receive (the agent died of SIGSEGV or the operation aborted).
TEST_F(WorkerGuardE2eTest, AWorkerCannotSealABufferATransferReceivesInto) {
  v1::JobSpec spec;
  spec.set_name("big");
  spec.set_tenant("e2e");
  v1::Ptc* ptc = spec.mutable_ptc();
  ptc->set_num_layers(1);
  // 4000 x 4096 fp32: 62.5 MiB (the test's verifier takes at most 50 M
  // elements in all the layouts it compares).
  test_support::SetTpSplit(test_support::AddTensor(ptc, "w", {4000, 4096}), 0);
  *spec.mutable_layout() = MakeLayout(2, 1, 1, {"h0", "h1"}, 1);
  ASSERT_NO_FATAL_FAILURE(RegisterAndPublish(spec));

  int refused = 0;
  for (int attempt = 0; attempt < 3; ++attempt) {
    SCOPED_TRACE(absl::StrCat("attempt ", attempt));
    const v1::Layout target = MakeLayout(2, 1, 1,
                                         attempt % 2 == 0 ? std::vector<std::string>{"h1", "h0"}
                                                          : std::vector<std::string>{"h0", "h1"},
                                         1);
    const int64_t next = generation_ + 1;
    std::atomic<bool> stop{false};
    std::map<grpc::StatusCode, int> codes;
    std::vector<std::string> sealed;  // calls that sealed: the defect
    std::thread worker([&] {
      while (!stop.load()) {
        for (const char* host : {"h0", "h1"}) {
          for (int rank = 0; rank < 2; ++rank) {
            grpc::Status s = SealShard(host, next, rank);
            ++codes[s.error_code()];
            if (s.ok()) sealed.push_back(absl::StrCat(host, " rank ", rank));
            if (s.error_code() == grpc::StatusCode::FAILED_PRECONDITION) {
              ExpectRefused(s, next, rank, "SealShard");
            }
          }
        }
      }
    });
    v1::MigrateRequest migrate;
    migrate.set_job_id(job_id_);
    migrate.set_expected_generation(generation_);
    *migrate.mutable_placement() = target.placement();
    v1::Operation started;
    grpc::ClientContext mctx;
    grpc::Status ms = stub_->Migrate(&mctx, migrate, &started);
    const v1::Operation op = ms.ok() ? WaitFinal(started.id()) : v1::Operation();
    stop.store(true);
    worker.join();
    refused += codes[grpc::StatusCode::FAILED_PRECONDITION];
    std::cout << "attempt " << attempt << ": SealShard answers (code: calls)";
    for (const auto& [code, n] : codes) std::cout << " " << code << ": " << n;
    std::cout << std::endl;
    ASSERT_TRUE(ms.ok()) << ms.error_message();
    ExpectAgentsRunning();
    EXPECT_TRUE(sealed.empty()) << "SealShard sealed an operation's buffer: "
                                << absl::StrJoin(sealed, ", ");
    for (const auto& [code, n] : codes) {
      EXPECT_TRUE(code == grpc::StatusCode::FAILED_PRECONDITION ||
                  code == grpc::StatusCode::NOT_FOUND)
          << n << " SealShard calls answered " << code;
    }
    ASSERT_EQ(op.state(), v1::OPERATION_STATE_COMMITTED) << op.error();
    auto now = Reshard(ptc_, contents_, target, {});
    ASSERT_TRUE(now.ok()) << now.status();
    contents_ = std::move(*now);
    generation_ = op.to_generation();
    absl::Status v = Verify(sockets_, job_id_, generation_, contents_);
    ASSERT_TRUE(v.ok()) << v;
  }
  // The loop did reach the buffers while the transfers wrote them.
  EXPECT_GT(refused, 0);
}

// 30 checkpoints of a job whose PTC has 2,000 tensors, each generation loaded
// by its worker: the worker service's cache holds the generations the host
// holds, not every one the job had, the agent's RSS stays flat after the
// first five, and DeleteJob empties the cache. On the code before the fix
// every generation's PTC and layout stayed cached (31 entries, RSS 36 -> 59
// MB, kept after DeleteJob).
TEST_F(WorkerGuardE2eTest, TheWorkerCacheHoldsWhatTheHostHoldsAndEmptiesOnDeleteJob) {
  v1::JobSpec spec;
  spec.set_name("wide");
  spec.set_tenant("e2e");
  v1::Ptc* ptc = spec.mutable_ptc();
  ptc->set_num_layers(1);
  for (int i = 0; i < 2000; ++i) {
    v1::TensorSpec* t = ptc->add_tensors();
    t->set_name(absl::StrCat("layers.", i / 10, ".block.", i % 10, ".weight"));
    t->set_dtype(v1::DTYPE_BFLOAT16);
    t->add_shape(8);
    t->mutable_partition()->mutable_pipeline()->set_mode(v1::PIPELINE_EVERY_STAGE);
  }
  *spec.mutable_layout() = MakeLayout(1, 1, 1, {"h0"}, 1);
  ASSERT_NO_FATAL_FAILURE(RegisterAndPublish(spec));
  const pid_t agent = agents_["h0"]->pid();

  constexpr int kCheckpoints = 30;
  constexpr int kWarmUp = 5;
  // 8 MiB: above what the agent's RSS moves by here with the fix (1 to 3
  // MiB on a loaded 2-core box), well below what it grew by without it (23
  // MB over these 25 checkpoints with every generation cached; 13 MB with
  // the cache evicting but the freed heap kept in malloc's arenas).
  // The agent trims malloc's arenas at most once a second, so one sample
  // may catch freed heap not yet given back: the warm figure is the highest
  // of the three samples up to kWarmUp, the end figure the lowest of the last
  // five. Growth of ~1 MB a checkpoint still shows as ~20 MB.
  constexpr int64_t kRssTolerance = int64_t{8} << 20;
  constexpr int kEndSamples = 5;
  int64_t warm_rss = 0;
  int64_t end_rss = std::numeric_limits<int64_t>::max();
  double max_generations = 0;
  for (int i = 1; i <= kCheckpoints; ++i) {
    SCOPED_TRACE(absl::StrCat("checkpoint ", i));
    v1::CheckpointRequest req;
    req.set_job_id(job_id_);
    req.set_expected_generation(generation_);
    const v1::Operation checkpoint = Checkpoint(req);
    ASSERT_FALSE(checkpoint.id().empty());
    absl::Status published = PublishCheckpoint(checkpoint.to_generation(), contents_);
    ASSERT_TRUE(published.ok()) << published;
    const v1::Operation op = WaitFinal(checkpoint.id());
    ASSERT_EQ(op.state(), v1::OPERATION_STATE_COMMITTED) << op.error();
    generation_ = op.to_generation();
    absl::Status v = Verify(sockets_, job_id_, generation_, contents_);
    ASSERT_TRUE(v.ok()) << v;
    // The cache holds only generations the host holds (one scrape gives
    // both; a release in progress settles within the wait).
    double cached = -1, held = -1;
    EXPECT_TRUE(test_support::Eventually([&] {
      absl::StatusOr<std::string> body = AgentMetrics("h0");
      if (!body.ok()) return false;
      cached = MetricValue(*body, "reshard_agent_worker_cache_entries", {{"kind", "generation"}})
                   .value_or(-1);
      held = MetricValue(*body, "reshard_agent_generations_held", {}).value_or(-1);
      return cached >= 0 && held >= 0 && cached <= held;
    })) << "worker cache holds "
        << cached << " generations, the host " << held;
    max_generations = std::max(max_generations, cached);
    if (i > kWarmUp - 3 && i <= kWarmUp) warm_rss = std::max(warm_rss, RssBytes(agent));
    if (i > kCheckpoints - kEndSamples) end_rss = std::min(end_rss, RssBytes(agent));
  }
  // The host releases retired generations on its heartbeat, and a publish
  // no longer waits for one (issue 20), so a few checkpoints may commit per
  // heartbeat: the host, and the cache with it, holds those few, never one
  // per checkpoint (31 before the cache was bounded).
  EXPECT_LE(max_generations, 10);
  EXPECT_LT(end_rss - warm_rss, kRssTolerance)
      << "agent RSS at most " << warm_rss << " over checkpoints " << kWarmUp - 2 << " to "
      << kWarmUp << ", at least " << end_rss << " over the last " << kEndSamples;

  v1::DeleteJobRequest del;
  del.set_job_id(job_id_);
  v1::DeleteJobResponse deleted;
  grpc::ClientContext dctx;
  grpc::Status s = stub_->DeleteJob(&dctx, del, &deleted);
  ASSERT_TRUE(s.ok()) << s.error_message();
  // The agent hears of the delete on a heartbeat and drops the job's
  // buffers; the cache forgets it with them.
  EXPECT_TRUE(test_support::Eventually([&] {
    std::optional<double> bytes = AgentMetric("h0", "reshard_agent_worker_cache_bytes");
    std::optional<double> entries = AgentMetric("h0", "reshard_agent_worker_cache_entries");
    return bytes.has_value() && *bytes == 0 && entries.has_value() && *entries == 0;
  })) << "cache bytes "
      << AgentMetric("h0", "reshard_agent_worker_cache_bytes").value_or(-1) << ", entries "
      << AgentMetric("h0", "reshard_agent_worker_cache_entries").value_or(-1);
  EXPECT_EQ(AgentMetric("h0", "reshard_agent_rank_buffers_held").value_or(-1), 0);
  // Its freed heap goes back on the next trim.
  int64_t deleted_rss = 0;
  EXPECT_TRUE(test_support::Eventually([&] {
    deleted_rss = RssBytes(agent);
    return deleted_rss - warm_rss < kRssTolerance;
  })) << "agent RSS "
      << deleted_rss << " after DeleteJob, " << warm_rss << " when warm";
  ExpectAgentsRunning();
}

}  // namespace
}  // namespace reshard::agent::testing
