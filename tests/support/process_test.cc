// The shared spawner (tests/support/process.h) against real programs
// (/bin/sh, cat, env, sleep): streams, environment, PATH, the errors of the
// steps before exec, waiting with deadlines, the parent-death signal.
#include "tests/support/process.h"

#include <signal.h>
#include <stdlib.h>
#include <unistd.h>

#include <cstring>
#include <fstream>
#include <mutex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/support/wait.h"

namespace reshard::test_support {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

// Every line `child` writes on its stdout pipe, until it closes it.
std::vector<std::string> Lines(ChildProcess& child) {
  std::vector<std::string> lines;
  std::thread reader =
      StartLineReader(child.TakeOutFd(), [&](const std::string& l) { lines.push_back(l); });
  reader.join();
  return lines;
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

class ProcessTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/reshard-process-test-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override {
    std::string cmd = "rm -rf " + dir_;
    (void)std::system(cmd.c_str());
  }
  std::string dir_;
};

TEST_F(ProcessTest, StdoutAndStderrOnOnePipeLineByLine) {
  SpawnOptions o;
  o.argv = {"/bin/sh", "-c", "echo one; echo two >&2; printf three"};
  o.out = Stream::Pipe();
  o.err = Stream::SameAsOut();
  absl::StatusOr<ChildProcess> child = ChildProcess::Spawn(o);
  ASSERT_TRUE(child.ok()) << child.status();
  EXPECT_THAT(Lines(*child), ElementsAre("one", "two", "three"));
  EXPECT_EQ(child->WaitExit(absl::Seconds(30)), 0);
  EXPECT_FALSE(child->running());
}

TEST_F(ProcessTest, StdinPipeAndTheEndOfIt) {
  SpawnOptions o;
  o.argv = {"cat"};  // found in PATH before fork
  o.in = Stream::Pipe();
  o.out = Stream::Pipe();
  absl::StatusOr<ChildProcess> child = ChildProcess::Spawn(o);
  ASSERT_TRUE(child.ok()) << child.status();
  const std::string text = "a line\nand a last one";
  ASSERT_EQ(write(child->in_fd(), text.data(), text.size()), static_cast<ssize_t>(text.size()));
  child->CloseIn();
  EXPECT_THAT(Lines(*child), ElementsAre("a line", "and a last one"));
  EXPECT_EQ(child->WaitExit(absl::Seconds(30)), 0);
}

TEST_F(ProcessTest, EnvironmentIsOursWithTheOverrides) {
  setenv("RESHARD_PROCESS_TEST_KEPT", "kept", 1);
  setenv("RESHARD_PROCESS_TEST_SET", "old", 1);
  SpawnOptions o;
  o.argv = {"/bin/sh", "-c",
            "echo $RESHARD_PROCESS_TEST_KEPT $RESHARD_PROCESS_TEST_SET $RESHARD_PROCESS_TEST_NEW"};
  o.env = {{"RESHARD_PROCESS_TEST_SET", "new"}, {"RESHARD_PROCESS_TEST_NEW", "added"}};
  o.out = Stream::Pipe();
  absl::StatusOr<ChildProcess> child = ChildProcess::Spawn(o);
  ASSERT_TRUE(child.ok()) << child.status();
  EXPECT_THAT(Lines(*child), ElementsAre("kept new added"));
  EXPECT_EQ(child->WaitExit(absl::Seconds(30)), 0);
}

TEST_F(ProcessTest, FilesAppendedOrTruncatedAndTheWorkingDirectory) {
  const std::string log = dir_ + "/log";
  {
    std::ofstream(log) << "before\n";
  }
  SpawnOptions o;
  o.argv = {"/bin/sh", "-c", "pwd; echo err >&2"};
  o.cwd = dir_;
  o.in = Stream::Null();
  o.out = Stream::File(log);
  o.err = Stream::File(log);
  absl::StatusOr<ChildProcess> child = ChildProcess::Spawn(o);
  ASSERT_TRUE(child.ok()) << child.status();
  EXPECT_EQ(child->WaitExit(absl::Seconds(30)), 0);
  EXPECT_EQ(ReadFile(log), "before\n" + dir_ + "\nerr\n");

  o.argv = {"/bin/sh", "-c", "echo only"};
  o.out = Stream::File(log, /*append=*/false);
  o.err = Stream::Inherit();
  child = ChildProcess::Spawn(o);
  ASSERT_TRUE(child.ok()) << child.status();
  EXPECT_EQ(child->WaitExit(absl::Seconds(30)), 0);
  EXPECT_EQ(ReadFile(log), "only\n");
}

TEST_F(ProcessTest, StdoutToAParentFd) {
  int fds[2];
  ASSERT_EQ(pipe(fds), 0);
  SpawnOptions o;
  o.argv = {"/bin/sh", "-c", "echo via-fd"};
  o.out = Stream::ParentFd(fds[1]);
  absl::StatusOr<ChildProcess> child = ChildProcess::Spawn(o);
  close(fds[1]);
  ASSERT_TRUE(child.ok()) << child.status();
  std::vector<std::string> lines;
  StartLineReader(fds[0], [&](const std::string& l) { lines.push_back(l); }).join();
  EXPECT_THAT(lines, ElementsAre("via-fd"));
  EXPECT_EQ(child->WaitExit(absl::Seconds(30)), 0);
}

TEST_F(ProcessTest, ExitStatusAndSignals) {
  SpawnOptions o;
  o.argv = {"/bin/sh", "-c", "exit 3"};
  absl::StatusOr<ChildProcess> child = ChildProcess::Spawn(o);
  ASSERT_TRUE(child.ok()) << child.status();
  EXPECT_EQ(child->WaitExit(absl::Seconds(30)), 3);

  o.argv = {"sleep", "600"};
  child = ChildProcess::Spawn(o);
  ASSERT_TRUE(child.ok()) << child.status();
  int status = 0;
  EXPECT_FALSE(child->Exited(&status));
  EXPECT_EQ(child->WaitExit(absl::Milliseconds(50)), std::nullopt);
  absl::StatusOr<int> terminated = child->Terminate(absl::Seconds(30));
  ASSERT_TRUE(terminated.ok()) << terminated.status();
  EXPECT_EQ(*terminated, 128 + SIGTERM);
  EXPECT_FALSE(child->running());
  EXPECT_EQ(child->Terminate().status().code(), absl::StatusCode::kFailedPrecondition);

  child = ChildProcess::Spawn(o);
  ASSERT_TRUE(child.ok()) << child.status();
  absl::StatusOr<int> killed = child->Kill();
  ASSERT_TRUE(killed.ok()) << killed.status();
  EXPECT_EQ(*killed, 128 + SIGKILL);
}

TEST_F(ProcessTest, TerminateKillsAChildThatIgnoresSigterm) {
  SpawnOptions o;
  // The shell ignores SIGTERM, then says so (it is in place before the line).
  o.argv = {"/bin/sh", "-c", "trap '' TERM; echo ignoring; while :; do sleep 1; done"};
  o.out = Stream::Pipe();
  absl::StatusOr<ChildProcess> child = ChildProcess::Spawn(o);
  ASSERT_TRUE(child.ok()) << child.status();
  std::mutex mu;
  std::vector<std::string> lines;
  std::thread reader = StartLineReader(child->TakeOutFd(), [&](const std::string& l) {
    std::lock_guard<std::mutex> lock(mu);
    lines.push_back(l);
  });
  ASSERT_TRUE(Eventually([&] {
    std::lock_guard<std::mutex> lock(mu);
    return !lines.empty();
  }));
  const pid_t pid = child->pid();
  absl::StatusOr<int> terminated = child->Terminate(absl::Milliseconds(300));
  EXPECT_EQ(terminated.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(terminated.status().message(), HasSubstr("did not exit"));
  EXPECT_FALSE(child->running());
  EXPECT_EQ(kill(pid, 0), -1) << "still runs after Terminate";
  reader.join();  // EOF once the shell's last `sleep 1` ends
}

TEST_F(ProcessTest, NoSuchExecutableIsNotFoundBeforeFork) {
  SpawnOptions o;
  o.argv = {"reshard-no-such-program"};
  absl::StatusOr<ChildProcess> child = ChildProcess::Spawn(o);
  EXPECT_EQ(child.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(child.status().message(), HasSubstr("reshard-no-such-program"));

  o.argv = {dir_ + "/missing"};
  child = ChildProcess::Spawn(o);
  EXPECT_EQ(child.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(child.status().message(), HasSubstr("execve " + dir_ + "/missing"));

  // The child's PATH, not ours, is searched.
  o.argv = {"sh", "-c", "exit 0"};
  o.env = {{"PATH", dir_}};
  EXPECT_EQ(ChildProcess::Spawn(o).status().code(), absl::StatusCode::kNotFound);
}

TEST_F(ProcessTest, AStepBeforeExecThatFailsIsNamed) {
  SpawnOptions o;
  o.argv = {"/bin/true"};
  o.cwd = dir_ + "/no-such-dir";
  absl::StatusOr<ChildProcess> child = ChildProcess::Spawn(o);
  EXPECT_EQ(child.status().code(), absl::StatusCode::kInternal);
  EXPECT_THAT(child.status().message(), HasSubstr("chdir " + o.cwd + ": "));
  EXPECT_THAT(child.status().message(), HasSubstr(std::strerror(ENOENT)));

  o.cwd.clear();
  o.out = Stream::File(dir_ + "/no-such-dir/log");
  child = ChildProcess::Spawn(o);
  EXPECT_EQ(child.status().code(), absl::StatusCode::kInternal);
  EXPECT_THAT(child.status().message(), HasSubstr("opening stdout " + dir_ + "/no-such-dir/log"));
}

TEST_F(ProcessTest, DiesWithTheSpawningThread) {
  absl::StatusOr<ChildProcess> child = absl::UnknownError("not spawned");
  std::thread spawner([&] {
    SpawnOptions o;
    o.argv = {"sleep", "600"};
    o.die_with_parent = true;
    child = ChildProcess::Spawn(o);
  });
  spawner.join();
  ASSERT_TRUE(child.ok()) << child.status();
  EXPECT_EQ(child->WaitExit(absl::Seconds(30)), 128 + SIGKILL);
}

TEST_F(ProcessTest, ReapedElsewhereIsNotWaitedForForever) {
  SpawnOptions o;
  o.argv = {"/bin/sh", "-c", "exit 5"};
  absl::StatusOr<ChildProcess> child = ChildProcess::Spawn(o);
  ASSERT_TRUE(child.ok()) << child.status();
  const pid_t pid = child->Release();
  EXPECT_FALSE(child->running());
  EXPECT_EQ(WaitPid(pid), 5);
  // Reaped: waiting again answers at once instead of retrying.
  EXPECT_EQ(WaitPid(pid), -1);
  int status = 0;
  EXPECT_TRUE(PidExited(pid, &status));
  EXPECT_EQ(status, -1);
}

TEST_F(ProcessTest, AMovedChildIsOwnedOnce) {
  SpawnOptions o;
  o.argv = {"sleep", "600"};
  absl::StatusOr<ChildProcess> spawned = ChildProcess::Spawn(o);
  ASSERT_TRUE(spawned.ok()) << spawned.status();
  const pid_t pid = spawned->pid();
  {
    ChildProcess owner = *std::move(spawned);
    EXPECT_EQ(owner.pid(), pid);
    EXPECT_FALSE(spawned->running());
  }  // killed and reaped here
  int status = 0;
  EXPECT_TRUE(PidExited(pid, &status));
  EXPECT_EQ(status, -1);  // no such child any more
}

}  // namespace
}  // namespace reshard::test_support
