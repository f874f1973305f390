// The agent across a real network cut: three hosts, each agent in its own
// network namespace joined to the root namespace by a veth pair (the
// coordinator and PostgreSQL stay in the root namespace, which routes
// between the hosts). While an operation transfers, one host's link goes
// down: the operation must abort and the old generation stay loadable.
// Needs root / CAP_NET_ADMIN; skips with a message otherwise.
#include <gtest/gtest.h>
#include <stdlib.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "grpcpp/grpcpp.h"
#include "tests/agent/e2e/e2e_support.h"
#include "tests/coordinator/harness/test_postgres.h"
#include "tests/coordinator/server/coordinator_process.h"
#include "tests/coordinator/server/test_jobs.h"
#include "tests/support/wait.h"

namespace reshard::agent::testing {
namespace {

using coordinator::testing::CoordinatorProcess;
using coordinator::testing::CreateFreshDatabase;
using coordinator::testing::MakeLayout;

int Sh(const std::string& cmd) {
  int rc = std::system((cmd + " >/dev/null 2>&1").c_str());
  return rc == -1 ? -1 : WEXITSTATUS(rc);
}

bool Final(v1::OperationState s) {
  return s == v1::OPERATION_STATE_COMMITTED || s == v1::OPERATION_STATE_ABORTED ||
         s == v1::OPERATION_STATE_FAILED;
}

class NetnsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    tag_ = std::to_string(getpid() % 100000);
    const std::string probe = "rsprobe" + tag_;
    if (Sh("ip netns add " + probe) != 0) {
      GTEST_SKIP() << "cannot create network namespaces (needs root or CAP_NET_ADMIN and the "
                      "ip tool); skipping the network-cut test";
    }
    Sh("ip netns del " + probe);
    if (FILE* f = std::fopen("/proc/sys/net/ipv4/ip_forward", "r")) {
      char c = '0';
      if (std::fread(&c, 1, 1, f) == 1) ip_forward_ = c;
      std::fclose(f);
    }
    Sh("sysctl -w net.ipv4.ip_forward=1");
    for (int i = 0; i < 3; ++i) {
      const std::string ns = Ns(i), a = RootIf(i), b = NsIf(i);
      const std::string net = absl::StrCat("10.213.", i, ".");
      created_.push_back(ns);
      ASSERT_EQ(Sh("ip netns add " + ns), 0);
      ASSERT_EQ(Sh("ip link add " + a + " type veth peer name " + b), 0);
      ASSERT_EQ(Sh("ip link set " + b + " netns " + ns), 0);
      ASSERT_EQ(Sh("ip addr add " + net + "1/24 dev " + a), 0);
      ASSERT_EQ(Sh("ip link set " + a + " up"), 0);
      ASSERT_EQ(Sh("ip netns exec " + ns + " ip addr add " + net + "2/24 dev " + b), 0);
      ASSERT_EQ(Sh("ip netns exec " + ns + " ip link set " + b + " up"), 0);
      ASSERT_EQ(Sh("ip netns exec " + ns + " ip link set lo up"), 0);
      ASSERT_EQ(Sh("ip netns exec " + ns + " ip route add default via " + net + "1"), 0);
    }
    char tmpl[] = "/tmp/reshard-agent-netns-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    absl::StatusOr<std::string> dsn = CreateFreshDatabase("agent_netns");
    ASSERT_TRUE(dsn.ok()) << dsn.status();
    auto c = CoordinatorProcess::Start({"--dsn", *dsn, "--listen", "0.0.0.0:0", "--metrics-listen",
                                        "127.0.0.1:0", "--lease-ms", "1500", "--tick-ms", "50",
                                        "--leader-retry-ms", "100", "--insecure"});
    ASSERT_TRUE(c.ok()) << c.status();
    coordinator_ = std::move(*c);
    stub_ = v1::CoordinatorService::NewStub(
        grpc::CreateChannel(coordinator_->address(), grpc::InsecureChannelCredentials()));
    for (int i = 0; i < 3; ++i) {
      const std::string h = absl::StrCat("h", i);
      sockets_[h] = dir_ + "/" + h + ".sock";
      AgentProcess::Options o;
      o.host_id = h;
      o.coordinator = absl::StrCat("10.213.", i, ".1:", coordinator_->port());
      o.worker_socket = sockets_[h];
      o.shm_dir = dir_ + "/shm-" + h;
      o.wrapper = {"ip", "netns", "exec", Ns(i)};
      o.extra_args = {"--insecure"};
      o.env = {{"UCX_NET_DEVICES", NsIf(i)}, {"UCX_TLS", "tcp,self"}};
      auto a = AgentProcess::Start(o);
      ASSERT_TRUE(a.ok()) << a.status();
      agents_.push_back(std::move(*a));
    }
  }

  void TearDown() override {
    agents_.clear();
    if (coordinator_) coordinator_->Kill();
    for (const std::string& ns : created_) Sh("ip netns del " + ns);  // removes its veth too
    for (int i = 0; i < 3; ++i) Sh("ip link del " + RootIf(i));
    if (!created_.empty() && ip_forward_ != '1') {
      Sh(std::string("sysctl -w net.ipv4.ip_forward=") + ip_forward_);
    }
    if (!dir_.empty()) {
      std::error_code ec;
      std::filesystem::remove_all(dir_, ec);
    }
  }

  std::string Ns(int i) const { return absl::StrCat("rsns", tag_, "h", i); }
  std::string RootIf(int i) const { return absl::StrCat("rsa", tag_, "h", i); }
  std::string NsIf(int i) const { return absl::StrCat("rsb", tag_, "h", i); }

  v1::Operation Get(const std::string& id) {
    v1::GetOperationRequest req;
    req.set_operation_id(id);
    v1::Operation op;
    grpc::ClientContext ctx;
    EXPECT_TRUE(stub_->GetOperation(&ctx, req, &op).ok());
    return op;
  }

  std::string tag_;
  char ip_forward_ = '1';  // restored by TearDown
  std::vector<std::string> created_;
  std::string dir_;
  std::unique_ptr<CoordinatorProcess> coordinator_;
  std::unique_ptr<v1::CoordinatorService::Stub> stub_;
  std::map<std::string, std::string> sockets_;
  std::vector<std::unique_ptr<AgentProcess>> agents_;
};

TEST_F(NetnsTest, LinkCutMidTransferAbortsAndOldGenerationSurvives) {
  // Wait until all three hosts registered (a test that went on with fewer
  // would fail later, for another reason).
  int alive = 0;
  ASSERT_TRUE(test_support::Eventually(
      [&] {
        v1::ListHostsResponse hosts;
        grpc::ClientContext list_ctx;
        alive = 0;
        if (stub_->ListHosts(&list_ctx, v1::ListHostsRequest(), &hosts).ok()) {
          for (const v1::Host& h : hosts.hosts()) alive += h.state() == v1::HOST_STATE_ALIVE;
        }
        return alive == 3;
      },
      absl::Seconds(10)))
      << alive << " of 3 hosts alive";
  const v1::JobSpec spec = test_support::GptJobSpec("gpt", "netns", {"h0", "h1"});
  v1::RegisterJobRequest req;
  *req.mutable_spec() = spec;
  v1::RegisterJobResponse resp;
  grpc::ClientContext ctx;
  grpc::Status s = stub_->RegisterJob(&ctx, req, &resp);
  ASSERT_TRUE(s.ok()) << s.error_message();
  const std::string job = resp.job().id();
  SetWorkerToken(job, resp.worker_token());
  auto contents = RandomContents(spec.ptc(), spec.layout(), 7);
  ASSERT_TRUE(contents.ok()) << contents.status();
  absl::Status p = Publish(sockets_, job, 1, *contents);
  ASSERT_TRUE(p.ok()) << p;

  // Move stage 0 to h2 (h0 sends to it), then cut h0 off the network.
  // h0 sends at 1 Mbit/s: its few hundred KB then take a second or more,
  // so that the cut lands in the transfer, not after it (unshaped, the
  // whole transfer can end between the poll that sees TRANSFERRING and the
  // cut).
  ASSERT_EQ(Sh("ip netns exec " + Ns(0) + " tc qdisc add dev " + NsIf(0) +
               " root tbf rate 1mbit burst 16kb latency 2s"),
            0);
  const v1::Layout target = MakeLayout(2, 2, 2, {"h2", "h1"}, 4);
  v1::ResizeRequest rr;
  rr.set_job_id(job);
  rr.set_expected_generation(1);
  *rr.mutable_placement() = target.placement();
  *rr.mutable_config() = target.config();
  v1::Operation op;
  grpc::ClientContext rctx;
  s = stub_->Resize(&rctx, rr, &op);
  ASSERT_TRUE(s.ok()) << s.error_message();
  test_support::Eventually(
      [&] {
        op = Get(op.id());
        return op.state() == v1::OPERATION_STATE_TRANSFERRING || Final(op.state());
      },
      absl::Seconds(4), absl::Milliseconds(2));
  ASSERT_EQ(op.state(), v1::OPERATION_STATE_TRANSFERRING);
  ASSERT_EQ(Sh("ip link set " + RootIf(0) + " down"), 0);
  test_support::Eventually(
      [&] {
        op = Get(op.id());
        return Final(op.state());
      },
      absl::Seconds(90));
  EXPECT_EQ(op.state(), v1::OPERATION_STATE_ABORTED) << op.error();

  // Generation 1 is still whole on h0 (reached through its unix socket) and h1.
  absl::Status v = Verify(sockets_, job, 1, *contents);
  EXPECT_TRUE(v.ok()) << v;
}

}  // namespace
}  // namespace reshard::agent::testing
