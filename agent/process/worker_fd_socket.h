// The worker socket's companion, `<worker socket>.fds` (issue 19; docs/security.md,
// "Workers"): shard files are the agent's alone (mode 0600, sealed 0400), so
// a worker maps a file descriptor the agent opened for it instead of a path.
// gRPC cannot carry descriptors, so they travel over this small unix socket
// (SCM_RIGHTS): one request per connection, a 4-byte little-endian length
// and a v1::WorkerFdRequest in, a 4-byte little-endian length and a
// v1::WorkerFdResponse out, with the descriptor attached when its code is 0.
// What a request may have is decided by the handler (WorkerServiceImpl::
// OpenForWorker: the job's worker token, the buffer's state).
//
// Each connection is served on a thread of its own, at most kMaxConnections at
// once (more are answered RESOURCE_EXHAUSTED), each bounded by kIoTimeout per
// read or write. Thread-safe; Stop() is idempotent and waits for the
// connections being served.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "agent/shard_store/shard_store.h"
#include "reshard/v1/worker.pb.h"

namespace reshard::agent {

class WorkerFdSocket {
 public:
  /// Answers one request from `caller` ("pid P uid U gid G"): a descriptor the
  /// socket sends and then closes, or why not.
  using Handler = std::function<absl::StatusOr<RankBuffer::WorkerFile>(
      const v1::WorkerFdRequest& request, const std::string& caller)>;

  static constexpr int kMaxConnections = 64;
  static constexpr int kMaxRequestBytes = 64 << 10;
  static constexpr std::chrono::seconds kIoTimeout{5};

  /// The companion path of worker socket `worker_socket`.
  static std::string PathFor(const std::string& worker_socket) { return worker_socket + ".fds"; }

  /// Binds and listens on `path` with group `gid` (< 0: the agent's) and
  /// `mode`, like the worker socket. Unavailable naming the path.
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<WorkerFdSocket>> Listen(
      const std::string& path, int gid, int mode);
  ~WorkerFdSocket();

  /// Accepts connections on a thread of its own and answers each with
  /// `handler` (which must outlive Stop()).
  void Serve(Handler handler);
  /// Stops accepting, waits for the connections being served and removes the
  /// socket file.
  void Stop();

 private:
  WorkerFdSocket(std::string path, int fd) : path_(std::move(path)), fd_(fd) {}
  void ServeConnection(int conn);

  const std::string path_;
  const int fd_;
  Handler handler_;
  std::atomic<bool> stopping_{false};
  std::thread acceptor_;
  std::mutex mu_;
  std::condition_variable idle_;
  int active_ = 0;  // connections being served
};

}  // namespace reshard::agent
