#include "agent/process/worker_socket.h"

#include <fcntl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/log.h"
#include "grpcpp/grpcpp.h"
#include "grpcpp/server_posix.h"

namespace reshard::agent {

absl::StatusOr<int> ListenUnix(const std::string& path, int gid, int mode) {
  auto fail = [&](const std::string& what) {
    return absl::UnavailableError(
        absl::StrCat("worker socket ", path, ": ", what, ": ", std::strerror(errno)));
  };
  sockaddr_un addr{};
  if (path.size() >= sizeof(addr.sun_path)) {
    return absl::InvalidArgumentError(absl::StrCat("worker socket ", path, ": longer than ",
                                                   sizeof(addr.sun_path) - 1, " bytes"));
  }
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, path.data(), path.size());
  const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return fail("socket");
  ::unlink(path.c_str());  // a stale socket of an earlier run
  if (::bind(fd, reinterpret_cast<const sockaddr*>(&addr), sizeof(addr)) != 0) {
    absl::Status s = fail("bind");
    ::close(fd);
    return s;
  }
  // Group and mode before listen: connecting needs write permission on it.
  if ((gid >= 0 && ::chown(path.c_str(), static_cast<uid_t>(-1), static_cast<gid_t>(gid)) != 0) ||
      ::chmod(path.c_str(), static_cast<mode_t>(mode)) != 0) {
    absl::Status s = fail("setting its group and mode");
    ::close(fd);
    ::unlink(path.c_str());
    return s;
  }
  if (::listen(fd, 128) != 0) {
    absl::Status s = fail("listen");
    ::close(fd);
    ::unlink(path.c_str());
    return s;
  }
  return fd;
}

absl::StatusOr<std::unique_ptr<WorkerSocket>> WorkerSocket::Listen(const std::string& path, int gid,
                                                                   int mode) {
  absl::StatusOr<int> fd = ListenUnix(path, gid, mode);
  if (!fd.ok()) return fd.status();
  return std::unique_ptr<WorkerSocket>(new WorkerSocket(path, *fd));
}

WorkerSocket::~WorkerSocket() { Stop(); }

void WorkerSocket::Serve(grpc::Server* server) {
  acceptor_ = std::thread([this, server] {
    while (!stopping_.load()) {
      const int conn = ::accept4(fd_, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
      if (conn < 0) {
        if (errno == EINTR || errno == ECONNABORTED) continue;
        if (!stopping_.load()) {
          RESHARD_LOG(WARNING) << "worker socket " << path_ << ": accept: " << std::strerror(errno);
        }
        if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
          std::this_thread::sleep_for(std::chrono::milliseconds(100));  // out of resources
          continue;
        }
        return;
      }
      PeerCredentials creds;
      ucred uc{};
      socklen_t len = sizeof(uc);
      if (::getsockopt(conn, SOL_SOCKET, SO_PEERCRED, &uc, &len) == 0) {
        creds = PeerCredentials{uc.pid, uc.uid, uc.gid};
      }
      {
        std::lock_guard<std::mutex> l(mu_);
        by_fd_[conn] = creds;
      }
      grpc::AddInsecureChannelFromFd(server, conn);
    }
  });
}

void WorkerSocket::Stop() {
  if (stopping_.exchange(true)) return;
  ::shutdown(fd_, SHUT_RDWR);  // wakes accept()
  if (acceptor_.joinable()) acceptor_.join();
  ::close(fd_);
  ::unlink(path_.c_str());
}

std::optional<PeerCredentials> WorkerSocket::CredentialsOf(const std::string& peer) const {
  int fd = -1;
  if (!absl::StartsWith(peer, "fd:") || !absl::SimpleAtoi(peer.substr(3), &fd)) {
    return std::nullopt;
  }
  std::lock_guard<std::mutex> l(mu_);
  auto it = by_fd_.find(fd);
  if (it == by_fd_.end()) return std::nullopt;
  return it->second;
}

std::string WorkerSocket::Describe(const std::string& peer) const {
  std::optional<PeerCredentials> c = CredentialsOf(peer);
  if (!c.has_value()) return peer;
  return absl::StrCat("pid ", c->pid, " uid ", c->uid, " gid ", c->gid);
}

}  // namespace reshard::agent
