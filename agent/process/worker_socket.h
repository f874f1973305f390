// The agent's worker socket, accepted by the agent itself so that it knows
// who connected: every accepted connection's SO_PEERCRED (pid, uid, gid) is
// recorded before the connection is handed to the gRPC server
// (AddInsecureChannelFromFd, whose calls carry the peer "fd:<n>"). The
// WorkerService names the caller by it in its log lines (docs/security.md,
// "Workers"). The socket gets its group and mode before it listens, so there
// is no moment when it is open to everyone.
// Thread-safe; Stop() is idempotent.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>

#include "absl/status/statusor.h"

namespace grpc {
class Server;
}

namespace reshard::agent {

/// A caller's process credentials, as the kernel recorded them at connect.
struct PeerCredentials {
  pid_t pid = 0;
  uid_t uid = 0;
  gid_t gid = 0;
};

/// A unix stream socket listening on `path` (a stale socket there is
/// removed), with group `gid` (< 0: the agent's) and `mode` set before it
/// listens. Unavailable naming the path. The caller owns the descriptor.
[[nodiscard]] absl::StatusOr<int> ListenUnix(const std::string& path, int gid, int mode);

class WorkerSocket {
 public:
  /// Binds and listens on `path` (a stale socket there is removed), with
  /// group `gid` (< 0: the agent's) and `mode`. Unavailable naming the path.
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<WorkerSocket>> Listen(const std::string& path,
                                                                            int gid, int mode);
  ~WorkerSocket();

  /// Accepts connections on a thread of its own and hands each to `server`
  /// (which must outlive Stop()).
  void Serve(grpc::Server* server);
  /// Stops accepting and removes the socket file. Connections already handed
  /// over are the server's.
  void Stop();

  /// The credentials of the connection a call came on (`ServerContext::peer()`,
  /// "fd:<n>"); nullopt for an unknown peer.
  std::optional<PeerCredentials> CredentialsOf(const std::string& peer) const;
  /// "pid P uid U gid G" (or the peer string when unknown), for log lines.
  std::string Describe(const std::string& peer) const;

 private:
  WorkerSocket(std::string path, int fd) : path_(std::move(path)), fd_(fd) {}

  const std::string path_;
  const int fd_;
  std::atomic<bool> stopping_{false};
  std::thread acceptor_;
  mutable std::mutex mu_;
  std::map<int, PeerCredentials> by_fd_;  // the latest connection on each fd number
};

}  // namespace reshard::agent
