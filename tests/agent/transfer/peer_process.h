// A UCX transport in a child process (ucx_peer_main.cc) that tests can stop,
// kill and watch exit, for real: ucx_transport_test.cc, ucx_peer_death_test.cc.
#pragma once

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "agent/transfer/transport.h"

extern char** environ;

namespace reshard::agent {

class PeerProcess {
 public:
  /// Starts a peer that connects to `test_side` and posts `receives` receives
  /// of `bytes` each, tags `tag_base` + i.
  static std::unique_ptr<PeerProcess> Start(Transport& test_side, uint64_t receives, size_t bytes,
                                            uint64_t tag_base) {
    auto p = Spawn({std::to_string(receives), std::to_string(bytes), std::to_string(tag_base)});
    if (p == nullptr || !p->SendAddress(test_side.LocalAddress()) || !p->ReadByte()) return nullptr;
    return p;
  }

  /// Starts a peer that connects to `to_address`, sends `bytes` under `tag`,
  /// waits `pause_us` and stops itself (see WaitStopped).
  static std::unique_ptr<PeerProcess> StartSendAndStop(const std::string& to_address, size_t bytes,
                                                       uint64_t tag, int pause_us) {
    auto p = Spawn(
        {"--send-and-stop", std::to_string(bytes), std::to_string(tag), std::to_string(pause_us)});
    if (p == nullptr || !p->SendAddress(to_address) || !p->ReadByte()) return nullptr;
    return p;
  }

  /// Starts a peer that waits to be asked to send (Answer), with everything
  /// UCX prints going to `log_path`; by worker address if `worker_address`.
  static std::unique_ptr<PeerProcess> StartAnswering(uint64_t tag, bool worker_address,
                                                     const std::string& log_path) {
    std::vector<std::string> args = {"--answer", std::to_string(tag)};
    if (worker_address) args.push_back("--worker-address");
    return Spawn(args, log_path);
  }

  ~PeerProcess() {
    Kill();
    CloseInput();
    if (out_ >= 0) close(out_);
  }

  const std::string& address() const { return address_; }

  /// Writes an address (an 8-byte length, then its bytes).
  bool SendAddress(const std::string& address) {
    const uint64_t len = address.size();
    return Write(&len, sizeof(len)) && Write(address.data(), address.size());
  }

  /// Reads the one byte the peer writes when it has done its part.
  bool ReadByte() {
    char c = 0;
    return Read(&c, 1);
  }

  /// Closes the peer's stdin: an answering or receiving peer shuts down.
  void CloseInput() {
    if (in_ >= 0) close(in_);
    in_ = -1;
  }

  /// Waits until the process has stopped itself (SIGSTOP); false if it did
  /// not within `timeout` or exited instead.
  bool WaitStopped(std::chrono::steady_clock::duration timeout) {
    std::optional<int> status = Wait(timeout, WUNTRACED);
    return status.has_value() && WIFSTOPPED(*status);
  }

  /// The exit status (waitpid's) once the process has ended; none if it is
  /// still running after `timeout`.
  std::optional<int> WaitExit(std::chrono::steady_clock::duration timeout) {
    std::optional<int> status = Wait(timeout, 0);
    if (status.has_value()) pid_ = -1;
    return status;
  }

  void Kill() {
    if (pid_ <= 0) return;
    kill(pid_, SIGKILL);
    waitpid(pid_, nullptr, 0);
    pid_ = -1;
  }

 private:
  PeerProcess() = default;

  // Starts the peer binary with `args` and reads the address it writes.
  static std::unique_ptr<PeerProcess> Spawn(const std::vector<std::string>& args,
                                            const std::string& log_path = "") {
    int to_child[2], from_child[2];
    if (pipe2(to_child, O_CLOEXEC) != 0 || pipe2(from_child, O_CLOEXEC) != 0) return nullptr;
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_adddup2(&actions, to_child[0], 0);
    posix_spawn_file_actions_adddup2(&actions, from_child[1], 1);
    std::vector<std::string> env_strings;
    for (char** e = environ; *e != nullptr; ++e) env_strings.push_back(*e);
    if (!log_path.empty()) {
      posix_spawn_file_actions_addopen(&actions, 2, log_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC,
                                       0644);
      env_strings.push_back("UCX_LOG_FILE=stderr");  // not stdout: that is the protocol
    }
    std::vector<char*> env;
    for (std::string& e : env_strings) env.push_back(e.data());
    env.push_back(nullptr);
    std::vector<const char*> argv = {RESHARD_UCX_PEER_PATH};
    for (const std::string& a : args) argv.push_back(a.c_str());
    argv.push_back(nullptr);
    auto p = std::unique_ptr<PeerProcess>(new PeerProcess);
    const int rc = posix_spawn(&p->pid_, RESHARD_UCX_PEER_PATH, &actions, nullptr,
                               const_cast<char**>(argv.data()), env.data());
    posix_spawn_file_actions_destroy(&actions);
    close(to_child[0]);
    close(from_child[1]);
    p->in_ = to_child[1];
    p->out_ = from_child[0];
    if (rc != 0) {
      p->pid_ = -1;
      return nullptr;
    }
    uint64_t len = 0;
    if (!p->Read(&len, sizeof(len)) || len > (1 << 20)) return nullptr;
    p->address_.resize(len);
    if (!p->Read(p->address_.data(), len)) return nullptr;
    return p;
  }

  std::optional<int> Wait(std::chrono::steady_clock::duration timeout, int flags) {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    for (;;) {
      int status = 0;
      const pid_t r = waitpid(pid_, &status, flags | WNOHANG);
      if (r == pid_) return status;
      if (r < 0 || std::chrono::steady_clock::now() >= deadline) return std::nullopt;
      poll(nullptr, 0, 1);
    }
  }

  // Reads exactly `n` bytes, giving up after 30 s without data.
  bool Read(void* data, size_t n) {
    char* p = static_cast<char*>(data);
    while (n > 0) {
      pollfd pfd{out_, POLLIN, 0};
      if (poll(&pfd, 1, 30000) <= 0) return false;
      const ssize_t k = read(out_, p, n);
      if (k <= 0) return false;
      p += k;
      n -= static_cast<size_t>(k);
    }
    return true;
  }

  bool Write(const void* data, size_t n) {
    const char* p = static_cast<const char*>(data);
    while (n > 0) {
      const ssize_t k = write(in_, p, n);
      if (k <= 0) return false;
      p += k;
      n -= static_cast<size_t>(k);
    }
    return true;
  }

  pid_t pid_ = -1;
  int in_ = -1;
  int out_ = -1;
  std::string address_;
};

}  // namespace reshard::agent
