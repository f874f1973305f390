// The throwaway certificate authority (test_pki.h): it issues certificates
// through openssl child processes, and its wait for them ends even when the
// children are reaped elsewhere.
#include "tests/coordinator/harness/test_pki.h"

#include <signal.h>

#include <chrono>
#include <filesystem>
#include <future>
#include <memory>
#include <thread>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace reshard::coordinator::testing {
namespace {

using ::testing::HasSubstr;

TEST(TestPkiTest, IssuesACertificateForACommonName) {
  absl::StatusOr<std::unique_ptr<TestPki>> pki = TestPki::Create("pki-issue");
  ASSERT_TRUE(pki.ok()) << pki.status();
  EXPECT_TRUE(std::filesystem::is_regular_file((*pki)->ca()));
  absl::StatusOr<CertFiles> files = (*pki)->Issue("agent:h0");
  ASSERT_TRUE(files.ok()) << files.status();
  EXPECT_TRUE(std::filesystem::is_regular_file(files->cert));
  EXPECT_TRUE(std::filesystem::is_regular_file(files->key));
}

// With SIGCHLD ignored the kernel reaps every child, so waitpid fails with
// ECHILD: the wait for openssl must end (an error: its exit status is
// unknown) instead of calling waitpid again forever.
TEST(TestPkiTest, AChildReapedElsewhereEndsTheWait) {
  struct sigaction ignore{};
  ignore.sa_handler = SIG_IGN;
  struct sigaction old{};
  ASSERT_EQ(sigaction(SIGCHLD, &ignore, &old), 0);
  auto answer = std::make_shared<std::promise<absl::Status>>();
  std::future<absl::Status> status = answer->get_future();
  // Detached: if the wait never ends, the test fails instead of hanging.
  std::thread([answer] { answer->set_value(TestPki::Create("pki-echild").status()); }).detach();
  const bool answered = status.wait_for(std::chrono::seconds(30)) == std::future_status::ready;
  sigaction(SIGCHLD, &old, nullptr);
  ASSERT_TRUE(answered) << "TestPki::Create still waits for openssl 30 s later";
  const absl::Status s = status.get();
  EXPECT_EQ(s.code(), absl::StatusCode::kInternal) << s;
  EXPECT_THAT(s.message(), HasSubstr("exit status -1"));
}

}  // namespace
}  // namespace reshard::coordinator::testing
