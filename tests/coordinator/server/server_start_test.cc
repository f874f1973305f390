// CoordinatorServer::Start in-process over a real PostgreSQL: it serves on
// ports it picked, and a port already taken (by a socket that does not share
// it) is refused with UNAVAILABLE naming the flag and the address, leaving
// nothing serving.
#include "services/coordinator/server/server.h"

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <string>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "tests/coordinator/harness/test_postgres.h"

namespace reshard::coordinator {
namespace {

// A loopback TCP socket listening on `port` (0: one the kernel picks),
// without SO_REUSEPORT, so that no other socket can bind the port while it
// lives; port() is 0 when the port could not be bound.
class TakenPort {
 public:
  explicit TakenPort(int port = 0) {
    fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    addr.sin_port = htons(static_cast<uint16_t>(port));
    socklen_t len = sizeof(addr);
    if (fd_ < 0 || ::bind(fd_, reinterpret_cast<sockaddr*>(&addr), len) != 0 ||
        ::listen(fd_, 1) != 0 || ::getsockname(fd_, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
      return;
    }
    port_ = ntohs(addr.sin_port);
  }
  ~TakenPort() {
    if (fd_ >= 0) ::close(fd_);
  }
  int port() const { return port_; }
  std::string address() const { return absl::StrCat("127.0.0.1:", port_); }

 private:
  int fd_ = -1;
  int port_ = 0;
};

class ServerStartTest : public ::testing::Test {
 protected:
  void SetUp() override {
    absl::StatusOr<testing::TestPostgres*> pg = testing::SharedTestPostgres();
    ASSERT_TRUE(pg.ok()) << pg.status();
    const std::string name = absl::StrCat(
        "start_", ::testing::UnitTest::GetInstance()->current_test_info()->name());
    absl::StatusOr<std::string> dsn = (*pg)->CreateDatabase(absl::AsciiStrToLower(name));
    ASSERT_TRUE(dsn.ok()) << dsn.status();
    config_.dsn = *dsn;
    config_.listen = "127.0.0.1:0";
    config_.metrics_listen = "127.0.0.1:0";
    config_.tls.insecure = true;
    config_.replica_id = "start-test";
  }

  CoordinatorConfig config_;
};

TEST_F(ServerStartTest, ServesOnThePortsItPicked) {
  CoordinatorServer server(config_);
  ASSERT_TRUE(server.Start().ok());
  EXPECT_GT(server.port(), 0);
  EXPECT_GT(server.metrics_port(), 0);
  EXPECT_NE(server.port(), server.metrics_port());
  server.Shutdown();
}

TEST_F(ServerStartTest, AGrpcPortTakenIsRefusedNamingListen) {
  TakenPort taken;
  ASSERT_GT(taken.port(), 0);
  config_.listen = taken.address();
  CoordinatorServer server(config_);
  const absl::Status s = server.Start();
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable) << s;
  EXPECT_EQ(s.message(), absl::StrCat("--listen = \"", taken.address(),
                                      "\": cannot bind the gRPC server there"));
  EXPECT_EQ(server.metrics_port(), 0);  // refused before /metrics was served
}

TEST_F(ServerStartTest, AMetricsPortTakenIsRefusedNamingMetricsListen) {
  TakenPort taken;
  ASSERT_GT(taken.port(), 0);
  config_.metrics_listen = taken.address();
  CoordinatorServer server(config_);
  const absl::Status s = server.Start();
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable) << s;
  EXPECT_TRUE(absl::StartsWith(
      s.message(), absl::StrCat("--metrics-listen = \"", taken.address(),
                                "\": cannot serve /metrics there: ")))
      << s.message();
  EXPECT_FALSE(server.IsLeader());  // the leader loop never started
  // The gRPC port it had bound is released: a socket that does not share
  // ports (gRPC's does) binds it at once.
  ASSERT_GT(server.port(), 0);
  TakenPort released(server.port());
  EXPECT_EQ(released.port(), server.port());
}

}  // namespace
}  // namespace reshard::coordinator
