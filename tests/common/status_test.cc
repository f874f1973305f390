// Unit tests of common/rpc/status.h: the conversions both ways, the wire
// code, the code names, the context prefix and the cut of long messages.
#include "common/rpc/status.h"

#include <string>

#include "gtest/gtest.h"

namespace reshard::rpc {
namespace {

TEST(RpcStatusTest, ToGrpcKeepsCodeAndMessageForEveryCode) {
  EXPECT_TRUE(ToGrpc(absl::OkStatus()).ok());
  for (int code = 1; code <= 16; ++code) {
    const absl::Status s(static_cast<absl::StatusCode>(code), "job \"x\" is busy");
    const grpc::Status g = ToGrpc(s);
    EXPECT_EQ(static_cast<int>(g.error_code()), code);
    EXPECT_EQ(g.error_message(), "job \"x\" is busy");
  }
}

TEST(RpcStatusTest, ToGrpcCutsLongMessages) {
  const grpc::Status g = ToGrpc(absl::InternalError(std::string(kMaxStatusMessageBytes + 3, 'b')));
  EXPECT_EQ(g.error_code(), grpc::StatusCode::INTERNAL);
  EXPECT_EQ(g.error_message(), std::string(kMaxStatusMessageBytes, 'b') + " ... (3 more bytes)");
}

TEST(RpcStatusTest, FromGrpcKeepsCodeAndMessageForEveryCode) {
  EXPECT_EQ(FromGrpc(grpc::Status::OK), absl::OkStatus());
  for (int code = 1; code <= 16; ++code) {
    const grpc::Status g(static_cast<grpc::StatusCode>(code), "host \"h\" is LOST");
    EXPECT_EQ(FromGrpc(g), absl::Status(static_cast<absl::StatusCode>(code), "host \"h\" is LOST"));
  }
  // Round trip.
  const absl::Status s = absl::FailedPreconditionError("operation \"o\" is TRANSFERRING");
  EXPECT_EQ(FromGrpc(ToGrpc(s)), s);
}

TEST(RpcStatusTest, FromGrpcWithWhatPrefixesTheMessage) {
  EXPECT_EQ(FromGrpc(grpc::Status(grpc::StatusCode::NOT_FOUND, "job \"j\" not found"), "GetJob"),
            absl::NotFoundError("GetJob: job \"j\" not found"));
  EXPECT_EQ(FromGrpc(grpc::Status::OK, "GetJob"), absl::OkStatus());
}

TEST(RpcStatusTest, WithContextKeepsTheCodeAndOk) {
  EXPECT_EQ(WithContext(absl::UnavailableError("connection refused"), "publish \"s\""),
            absl::UnavailableError("publish \"s\": connection refused"));
  EXPECT_EQ(WithContext(absl::OkStatus(), "publish"), absl::OkStatus());
  EXPECT_EQ(WithContext(absl::AbortedError(""), "seal"), absl::AbortedError("seal: "));
}

TEST(RpcStatusTest, WireCodes) {
  for (int code = 1; code <= 16; ++code) {
    const auto c = static_cast<absl::StatusCode>(code);
    EXPECT_EQ(ToWireCode(c), code);
    EXPECT_EQ(FromWireCode(ToWireCode(c), "m"), absl::Status(c, "m"));
  }
  EXPECT_EQ(ToWireCode(absl::StatusCode::kOk), 0);
  EXPECT_EQ(FromWireCode(0, "ignored"), absl::OkStatus());
  // Out of range: UNKNOWN, the message kept.
  EXPECT_EQ(FromWireCode(17, "bad"), absl::UnknownError("bad"));
  EXPECT_EQ(FromWireCode(-1, "bad"), absl::UnknownError("bad"));
  EXPECT_EQ(FromWireCode(int64_t{1} << 40, "bad"), absl::UnknownError("bad"));
}

TEST(RpcStatusTest, CodeNames) {
  const char* const kNames[] = {"OK",
                                "CANCELLED",
                                "UNKNOWN",
                                "INVALID_ARGUMENT",
                                "DEADLINE_EXCEEDED",
                                "NOT_FOUND",
                                "ALREADY_EXISTS",
                                "PERMISSION_DENIED",
                                "RESOURCE_EXHAUSTED",
                                "FAILED_PRECONDITION",
                                "ABORTED",
                                "OUT_OF_RANGE",
                                "UNIMPLEMENTED",
                                "INTERNAL",
                                "UNAVAILABLE",
                                "DATA_LOSS",
                                "UNAUTHENTICATED"};
  for (int code = 0; code <= 16; ++code) {
    EXPECT_EQ(CodeName(static_cast<absl::StatusCode>(code)), kNames[code]) << code;
  }
  EXPECT_EQ(CodeName(static_cast<absl::StatusCode>(17)), "CODE_17");
  EXPECT_EQ(CodeName(static_cast<absl::StatusCode>(-1)), "CODE_-1");
}

TEST(RpcStatusTest, LongMessagesAreCutAndSaySo) {
  const std::string fits(kMaxStatusMessageBytes, 'a');
  EXPECT_EQ(CutStatusMessage(fits), fits);
  const std::string cut = CutStatusMessage(std::string(kMaxStatusMessageBytes + 10, 'a'));
  EXPECT_EQ(cut, std::string(kMaxStatusMessageBytes, 'a') + " ... (10 more bytes)");

  // Newlines and non-ASCII bytes count three (percent-encoded on the wire),
  // and a UTF-8 sequence is never split.
  std::string lines;
  while (lines.size() < 3 * kMaxStatusMessageBytes) lines += "\xc3\xa9\n";  // "é\n"
  const std::string cut_lines = CutStatusMessage(lines);
  const size_t kept = cut_lines.find(" ... (");
  ASSERT_NE(kept, std::string::npos);
  EXPECT_LE(kept * 3, kMaxStatusMessageBytes);
  EXPECT_EQ(kept % 3, 0u);  // whole "é\n" triples only
  // '%' counts three as well.
  const std::string percents(kMaxStatusMessageBytes / 3 + 1, '%');
  EXPECT_EQ(CutStatusMessage(percents),
            std::string(kMaxStatusMessageBytes / 3, '%') + " ... (1 more bytes)");
}

}  // namespace
}  // namespace reshard::rpc
