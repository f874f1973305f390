// WorkerClient::BeginPublish against an agent that answers UNAVAILABLE
// ("generation not open yet") and then never answers: retried with the
// table's kWorkerPublish backoff, every attempt bounded by what is left of
// call_timeout (common/rpc/retry.h, AttemptDeadline), so a publish never
// outlives its call_timeout. A real gRPC server on a unix socket.
#include <stdlib.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "client/cpp/worker_client.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "reshard/v1/worker.grpc.pb.h"

namespace reshard::client {
namespace {

// PublishShard: UNAVAILABLE for `unavailable_for` after the first call, then
// no answer until the caller's deadline. Records each call's deadline.
class NotOpenYet final : public v1::WorkerService::Service {
 public:
  explicit NotOpenYet(absl::Duration unavailable_for) : unavailable_for_(unavailable_for) {}

  grpc::Status PublishShard(grpc::ServerContext* context, const v1::PublishShardRequest*,
                            v1::PublishShardResponse*) override {
    const absl::Time now = absl::Now();
    {
      std::lock_guard<std::mutex> l(mu_);
      if (first_ == absl::InfinitePast()) first_ = now;
      deadlines_.push_back(absl::FromChrono(context->deadline()));
      if (now - first_ < unavailable_for_) {
        return grpc::Status(grpc::StatusCode::UNAVAILABLE,
                            "generation 2 of job \"j\" is not open here yet");
      }
    }
    while (!context->IsCancelled()) std::this_thread::sleep_for(std::chrono::milliseconds(5));
    return grpc::Status(grpc::StatusCode::CANCELLED, "caller gone");
  }

  std::vector<absl::Time> deadlines() {
    std::lock_guard<std::mutex> l(mu_);
    return deadlines_;
  }

 private:
  const absl::Duration unavailable_for_;
  std::mutex mu_;
  absl::Time first_ = absl::InfinitePast();  // guarded by mu_
  std::vector<absl::Time> deadlines_;        // guarded by mu_
};

TEST(WorkerPublishRetryTest, EveryAttemptEndsByTheCallsDeadline) {
  std::string dir = testing::TempDir() + "/worker_publish_XXXXXX";
  ASSERT_NE(::mkdtemp(dir.data()), nullptr);
  const std::string socket = dir + "/worker.sock";
  NotOpenYet service(absl::Milliseconds(400));
  grpc::ServerBuilder builder;
  builder.AddListeningPort("unix:" + socket, grpc::InsecureServerCredentials());
  builder.RegisterService(&service);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  ASSERT_NE(server, nullptr);

  WorkerClient::Options options;
  options.call_timeout = absl::Seconds(1);
  options.token = "worker-token";
  WorkerClient client(socket, options);
  const absl::Time start = absl::Now();
  absl::StatusOr<ShardWriter> writer = client.BeginPublish("j", 2, 0);
  const absl::Duration took = absl::Now() - start;

  EXPECT_EQ(writer.status().code(), absl::StatusCode::kDeadlineExceeded) << writer.status();
  EXPECT_TRUE(
      absl::StartsWith(writer.status().message(), "publishing job \"j\" generation 2 rank 0: "))
      << writer.status();
  // Retried while UNAVAILABLE (20 ms doubling, jittered: several attempts in
  // 400 ms), then the attempt that gets no answer ends with the call.
  const std::vector<absl::Time> deadlines = service.deadlines();
  ASSERT_GE(deadlines.size(), 4u);
  const auto [lo, hi] = std::minmax_element(deadlines.begin(), deadlines.end());
  EXPECT_LT(*hi - *lo, absl::Milliseconds(50))
      << "attempt deadlines spread over " << (*hi - *lo) << "; each attempt must get the time left";
  EXPECT_LT(took, absl::Milliseconds(1300)) << "a 1 s publish took " << took;
  EXPECT_GE(took, absl::Milliseconds(900));

  server->Shutdown(std::chrono::system_clock::now());
  std::error_code ignored;
  std::filesystem::remove_all(dir, ignored);
}

}  // namespace
}  // namespace reshard::client
