// A UCX transport in a child process (ucx_peer_main.cc) that tests can stop,
// kill and watch exit, for real: ucx_transport_test.cc, ucx_peer_death_test.cc.
#pragma once

#include <poll.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "agent/transfer/transport.h"
#include "tests/support/process.h"
#include "tests/support/wait.h"

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

  ~PeerProcess() = default;  // killed and reaped by child_ if it still runs

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
  void CloseInput() { child_.CloseIn(); }

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
    if (status.has_value() && !WIFSTOPPED(*status)) child_.Release();  // reaped here
    return status;
  }

  void Kill() { (void)child_.Kill(); }

 private:
  PeerProcess() = default;

  // Starts the peer binary with `args` (stdin and stdout: the protocol's
  // pipes; stderr to `log_path`, else ours) and reads the address it writes.
  static std::unique_ptr<PeerProcess> Spawn(const std::vector<std::string>& args,
                                            const std::string& log_path = "") {
    test_support::SpawnOptions options;
    options.argv = {RESHARD_UCX_PEER_PATH};
    options.argv.insert(options.argv.end(), args.begin(), args.end());
    options.in = test_support::Stream::Pipe();
    options.out = test_support::Stream::Pipe();
    if (!log_path.empty()) {
      options.err = test_support::Stream::File(log_path, /*append=*/false);
      options.env = {{"UCX_LOG_FILE", "stderr"}};  // not stdout: that is the protocol
    }
    absl::StatusOr<test_support::ChildProcess> child = test_support::ChildProcess::Spawn(options);
    if (!child.ok()) return nullptr;
    auto p = std::unique_ptr<PeerProcess>(new PeerProcess);
    p->child_ = *std::move(child);
    uint64_t len = 0;
    if (!p->Read(&len, sizeof(len)) || len > (1 << 20)) return nullptr;
    p->address_.resize(len);
    if (!p->Read(p->address_.data(), len)) return nullptr;
    return p;
  }

  // waitpid(flags) polled every 1 ms until it reports or `timeout` passes;
  // waitpid's raw status.
  std::optional<int> Wait(std::chrono::steady_clock::duration timeout, int flags) {
    if (!child_.running()) return std::nullopt;
    std::optional<int> status;
    test_support::Eventually(
        [&] {
          int raw = 0;
          pid_t r;
          while ((r = waitpid(child_.pid(), &raw, flags | WNOHANG)) < 0 && errno == EINTR) {
          }
          if (r == child_.pid()) status = raw;
          return r != 0;  // reported, or an error (no such child)
        },
        absl::FromChrono(timeout), absl::Milliseconds(1));
    return status;
  }

  // Reads exactly `n` bytes, giving up after 30 s without data.
  bool Read(void* data, size_t n) {
    char* p = static_cast<char*>(data);
    while (n > 0) {
      pollfd pfd{child_.out_fd(), POLLIN, 0};
      if (poll(&pfd, 1, 30000) <= 0) return false;
      const ssize_t k = read(child_.out_fd(), p, n);
      if (k <= 0) return false;
      p += k;
      n -= static_cast<size_t>(k);
    }
    return true;
  }

  bool Write(const void* data, size_t n) {
    const char* p = static_cast<const char*>(data);
    while (n > 0) {
      const ssize_t k = write(child_.in_fd(), p, n);
      if (k <= 0) return false;
      p += k;
      n -= static_cast<size_t>(k);
    }
    return true;
  }

  test_support::ChildProcess child_;
  std::string address_;
};

}  // namespace reshard::agent
