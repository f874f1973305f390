// Unit tests of the server layer's shared pieces: the absl -> gRPC status
// conversion (over common/rpc's, tested in tests/common/status_test.cc), the
// RPC wrapper (metrics, exceptions) and the receive limit.
#include "services/coordinator/server/rpc_status.h"

#include <stdexcept>

#include "gtest/gtest.h"
#include "prometheus/registry.h"
#include "services/coordinator/server/server.h"

namespace reshard::coordinator {
namespace {

TEST(RpcStatusTest, SameCodeAndMessageForEveryCode) {
  EXPECT_TRUE(ToGrpcStatus(absl::OkStatus()).ok());
  for (int code = 1; code <= 16; ++code) {
    const absl::Status s(static_cast<absl::StatusCode>(code), "job \"x\" is busy");
    const grpc::Status g = ToGrpcStatus(s);
    EXPECT_EQ(static_cast<int>(g.error_code()), code);
    EXPECT_EQ(g.error_message(), "job \"x\" is busy");
  }
  // Long messages are cut as common/rpc cuts them.
  EXPECT_EQ(ToGrpcStatus(absl::InternalError(std::string(rpc::kMaxStatusMessageBytes + 10, 'a')))
                .error_message(),
            std::string(rpc::kMaxStatusMessageBytes, 'a') + " ... (10 more bytes)");
}

TEST(RpcStatusTest, RunRpcRecordsAndConvertsExceptions) {
  auto registry = std::make_shared<prometheus::Registry>();
  CoordinatorMetrics metrics(registry);
  EXPECT_EQ(RunRpc(&metrics, "GetJob", [] { return absl::NotFoundError("job \"j\" not found"); })
                .error_code(),
            grpc::StatusCode::NOT_FOUND);
  EXPECT_TRUE(RunRpc(&metrics, "GetJob", [] { return absl::OkStatus(); }).ok());
  const grpc::Status thrown =
      RunRpc(&metrics, "ListJobs", []() -> absl::Status { throw std::runtime_error("boom"); });
  EXPECT_EQ(thrown.error_code(), grpc::StatusCode::INTERNAL);
  EXPECT_NE(thrown.error_message().find("boom"), std::string::npos);
  EXPECT_TRUE(RunRpc(nullptr, "GetJob", [] { return absl::OkStatus(); }).ok());

  std::map<std::string, uint64_t> counts;
  for (const auto& family : registry->Collect()) {
    if (family.name != "reshard_coordinator_rpc_duration_seconds") continue;
    for (const auto& m : family.metric) {
      std::string key;
      for (const auto& l : m.label) key += l.name + "=" + l.value + ";";
      counts[key] = m.histogram.sample_count;
    }
  }
  EXPECT_EQ(counts["code=NOT_FOUND;method=GetJob;"], 1u);
  EXPECT_EQ(counts["code=OK;method=GetJob;"], 1u);
  EXPECT_EQ(counts["code=INTERNAL;method=ListJobs;"], 1u);
}

TEST(RpcStatusTest, ReceiveLimitLeavesRoomAboveTheSpecLimit) {
  CoordinatorConfig config;
  config.max_spec_bytes = 1024;
  EXPECT_EQ(MaxReceiveMessageBytes(config), 4 << 20);
  config.max_spec_bytes = 64 << 20;
  EXPECT_EQ(MaxReceiveMessageBytes(config), (64 << 20) + kRequestMarginBytes);
  config.max_spec_bytes = int64_t{1} << 40;
  EXPECT_EQ(MaxReceiveMessageBytes(config), std::numeric_limits<int>::max());
}

}  // namespace
}  // namespace reshard::coordinator
