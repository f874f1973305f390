// A peer dies while a transport answers its first connection (docs/agent.md,
// "Known UCX defect"). Three processes per trial: an answering transport (a
// child, whose output is kept), a peer that connects to it, sends 1 MiB (a
// rendezvous), stops itself (its sockets still accept, nothing answers) and
// is SIGKILLed a moment later, and this test, which then asks the answering
// transport to send it 1 MiB and, once it has them, to shut down. Over a
// sweep of fault timings.
//
// With worker addresses UCX 1.13 aborts the answering process on the purged
// reply (openucx/ucx#8175): RESHARD_TEST_UCX_WORKER_ADDRESS=1 makes the
// answering transport connect that way, and this test fails. A transport
// that listens never answers such a request. One abort of another kind is
// left (the accepting side's TCP endpoint to the dead peer, about once in
// 600 such deaths; faultlib.UCX_PEER_DEATH_ABORTS): it is counted and
// printed, not failed, as the fault suite treats it.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>

#include <chrono>
#include <cstdlib>
#include <fstream>
#include <future>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "agent/transfer/ucx_address.h"
#include "agent/transfer/ucx_transport.h"
#include "tests/agent/transfer/peer_process.h"

namespace reshard::agent {
namespace {

using std::chrono::seconds;

constexpr char kReplyPurgeAbort[] =
    "Assertion `(req->send.wireup.type == UCP_WIREUP_MSG_EP_REMOVED)";
constexpr char kAcceptedEndpointAbort[] =
    "Assertion `!(ep->flags & UCT_TCP_EP_FLAG_CTX_TYPE_TX)' failed";

std::string ReadFile(const std::string& path) {
  std::ifstream f(path);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

TEST(UcxPeerDiesWhileConnectingTest, TheAnsweringTransportSurvives) {
  signal(SIGPIPE, SIG_IGN);  // writing to an answering process that died
  const char* env = std::getenv("RESHARD_TEST_UCX_WORKER_ADDRESS");
  const bool worker_address = env != nullptr && std::string(env) == "1";
  UcxOptions options;
  options.net_devices = "lo";
  options.transports = "tcp,self";
  auto test_side = MakeUcxTransportImpl(options);
  ASSERT_TRUE(test_side.ok()) << test_side.status();
  const std::string log = ::testing::TempDir() + "ucx_answering_peer.log";
  const int pauses_us[] = {0, 200, 2000};
  const int kills_after_us[] = {0, 500, 5000, 50000};
  uint64_t tag = uint64_t{41} << 32;
  int other_aborts = 0;
  for (int pause_us : pauses_us) {
    for (int kill_after_us : kills_after_us) {
      SCOPED_TRACE(::testing::Message() << "dying peer pauses " << pause_us << " us, killed "
                                        << kill_after_us << " us after it stopped");
      const uint64_t answer_tag = ++tag;
      auto answering = PeerProcess::StartAnswering(answer_tag, worker_address, log);
      ASSERT_NE(answering, nullptr) << "answering peer did not start";
      EXPECT_EQ(IsListenerAddress(answering->address()), !worker_address);
      auto dying =
          PeerProcess::StartSendAndStop(answering->address(), size_t{1} << 20, ++tag, pause_us);
      ASSERT_NE(dying, nullptr) << "dying peer did not start";
      ASSERT_TRUE(dying->WaitStopped(seconds(30))) << "the dying peer did not stop itself";
      // The fault's timing (what is swept), not a wait for an event.
      std::this_thread::sleep_for(std::chrono::microseconds(kill_after_us));
      dying->Kill();
      // Still moving bytes: the answering transport sends us 1 MiB.
      std::vector<uint8_t> got(size_t{1} << 20, 0);
      std::promise<absl::Status> received;
      (*test_side)->Receive(answer_tag, got.data(), got.size(), [&](absl::Status s) {
        received.set_value(s);
      });
      const bool asked = answering->SendAddress((*test_side)->LocalAddress());
      const bool answered = asked && answering->ReadByte();
      // Its send completing means only that its buffer is free again: over
      // TCP, UCX 1.13 completes a rendezvous send once its put is done and
      // sends the receiver the put's end (ATP) on its own, so the receive here
      // completes only when that arrives. An answering transport that shut
      // down at once force-closes its endpoint and may drop it, and our
      // receive never completes (1 run in 3 of this test under load). So it
      // shuts down only once we have the bytes: closing its input is our
      // acknowledgement.
      std::future<absl::Status> r = received.get_future();
      const bool delivered = answered && r.wait_for(seconds(30)) == std::future_status::ready;
      answering->CloseInput();
      const std::optional<int> status = answering->WaitExit(seconds(30));
      ASSERT_TRUE(status.has_value()) << "the answering peer did not exit";
      const std::string output = ReadFile(log);
      if (WIFSIGNALED(*status) && output.find(kAcceptedEndpointAbort) != std::string::npos) {
        ++other_aborts;
        std::printf("known UCX abort of the accepting side's endpoint (not the reply's):\n%s\n",
                    output.substr(0, 2000).c_str());
        (*test_side)->CancelTags(answer_tag, ~uint64_t{0});
        continue;
      }
      ASSERT_TRUE(WIFEXITED(*status) && WEXITSTATUS(*status) == 0)
          << "the answering peer " << (WIFSIGNALED(*status) ? "was killed by signal " : "exited ")
          << (WIFSIGNALED(*status) ? WTERMSIG(*status) : WEXITSTATUS(*status))
          << (output.find(kReplyPurgeAbort) != std::string::npos
                  ? " (UCX's abort on the purged reply to the dead peer's connection request)"
                  : "")
          << "; its output:\n"
          << output.substr(0, 4000);
      EXPECT_TRUE(answered) << "the answering peer did not report its send";
      ASSERT_TRUE(delivered) << "the answering peer's 1 MiB did not arrive within 30 s";
      EXPECT_TRUE(r.get().ok());
      EXPECT_EQ(got, std::vector<uint8_t>(got.size(), 5));
    }
  }
  if (other_aborts > 0) std::printf("%d trial(s) hit the other known UCX abort\n", other_aborts);
  (*test_side)->Shutdown();
}

}  // namespace
}  // namespace reshard::agent
