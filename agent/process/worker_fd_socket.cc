#include "agent/process/worker_fd_socket.h"

#include <sys/socket.h>
#include <sys/time.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <string>

#include "absl/strings/str_cat.h"
#include "agent/process/worker_socket.h"
#include "common/log.h"
#include "common/rpc/status.h"

namespace reshard::agent {
namespace {

// Reads exactly `n` bytes; false on EOF, error or timeout.
bool ReadFull(int fd, char* out, size_t n) {
  while (n > 0) {
    const ssize_t got = ::recv(fd, out, n, 0);
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) return false;
    out += got;
    n -= static_cast<size_t>(got);
  }
  return true;
}

// Sends `response` (length-prefixed) with `fd` attached (when >= 0) to the
// first byte; false on error or timeout.
bool SendResponse(int conn, const v1::WorkerFdResponse& response, int fd) {
  std::string body;
  response.SerializeToString(&body);
  const uint32_t n = static_cast<uint32_t>(body.size());
  std::string wire(4, '\0');
  for (int i = 0; i < 4; ++i) wire[i] = static_cast<char>((n >> (8 * i)) & 0xff);
  wire += body;
  size_t sent = 0;
  bool attach = fd >= 0;
  while (sent < wire.size()) {
    iovec iov{wire.data() + sent, wire.size() - sent};
    msghdr msg{};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))] = {};
    if (attach) {
      msg.msg_control = control;
      msg.msg_controllen = sizeof(control);
      cmsghdr* c = CMSG_FIRSTHDR(&msg);
      c->cmsg_level = SOL_SOCKET;
      c->cmsg_type = SCM_RIGHTS;
      c->cmsg_len = CMSG_LEN(sizeof(int));
      std::memcpy(CMSG_DATA(c), &fd, sizeof(int));
    }
    const ssize_t w = ::sendmsg(conn, &msg, MSG_NOSIGNAL);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return false;
    attach = false;  // the descriptor went with the first bytes
    sent += static_cast<size_t>(w);
  }
  return true;
}

std::string DescribePeer(int conn) {
  ucred uc{};
  socklen_t len = sizeof(uc);
  if (::getsockopt(conn, SOL_SOCKET, SO_PEERCRED, &uc, &len) != 0) return "unknown peer";
  return absl::StrCat("pid ", uc.pid, " uid ", uc.uid, " gid ", uc.gid);
}

}  // namespace

absl::StatusOr<std::unique_ptr<WorkerFdSocket>> WorkerFdSocket::Listen(const std::string& path,
                                                                       int gid, int mode) {
  absl::StatusOr<int> fd = ListenUnix(path, gid, mode);
  if (!fd.ok()) return fd.status();
  return std::unique_ptr<WorkerFdSocket>(new WorkerFdSocket(path, *fd));
}

WorkerFdSocket::~WorkerFdSocket() { Stop(); }

void WorkerFdSocket::Serve(Handler handler) {
  handler_ = std::move(handler);
  acceptor_ = std::thread([this] {
    while (!stopping_.load()) {
      const int conn = ::accept4(fd_, nullptr, nullptr, SOCK_CLOEXEC);
      if (conn < 0) {
        if (errno == EINTR || errno == ECONNABORTED) continue;
        if (!stopping_.load()) {
          RESHARD_LOG(WARNING) << "worker fd socket " << path_
                               << ": accept: " << std::strerror(errno);
        }
        if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
          std::this_thread::sleep_for(std::chrono::milliseconds(100));  // out of resources
          continue;
        }
        return;
      }
      const timeval tv{static_cast<time_t>(kIoTimeout.count()), 0};
      (void)::setsockopt(conn, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
      (void)::setsockopt(conn, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
      {
        std::lock_guard<std::mutex> l(mu_);
        if (active_ >= kMaxConnections) {
          v1::WorkerFdResponse busy;
          busy.set_code(rpc::ToWireCode(absl::StatusCode::kResourceExhausted));
          busy.set_message(absl::StrCat("worker fd socket ", path_, ": ", kMaxConnections,
                                        " connections are being served; retry"));
          (void)SendResponse(conn, busy, -1);
          ::close(conn);
          continue;
        }
        ++active_;
      }
      std::thread([this, conn] {
        ServeConnection(conn);
        ::close(conn);
        std::lock_guard<std::mutex> l(mu_);
        if (--active_ == 0) idle_.notify_all();
      }).detach();
    }
  });
}

void WorkerFdSocket::ServeConnection(int conn) {
  const std::string caller = DescribePeer(conn);
  unsigned char header[4];
  if (!ReadFull(conn, reinterpret_cast<char*>(header), sizeof(header))) return;
  const uint32_t n = header[0] | (header[1] << 8) | (header[2] << 16) |
                     (static_cast<uint32_t>(header[3]) << 24);
  v1::WorkerFdResponse response;
  absl::StatusOr<RankBuffer::WorkerFile> file = absl::UnknownError("not answered");
  v1::WorkerFdRequest request;
  std::string body;
  if (n > static_cast<uint32_t>(kMaxRequestBytes)) {
    file = absl::InvalidArgumentError(
        absl::StrCat("request of ", n, " bytes, more than ", kMaxRequestBytes));
  } else {
    body.resize(n);
    if (n > 0 && !ReadFull(conn, body.data(), n)) return;
    if (!request.ParseFromString(body)) {
      file = absl::InvalidArgumentError("the request is not a reshard.v1.WorkerFdRequest");
    } else {
      file = handler_(request, caller);
    }
  }
  if (file.ok()) {
    response.set_size(file->size);
    if (!SendResponse(conn, response, file->fd)) {
      RESHARD_LOG(WARNING) << "worker fd socket: the descriptor of job " << request.job_id()
                           << " generation " << request.generation() << " rank " << request.rank()
                           << " could not be sent to " << caller;
    }
    ::close(file->fd);
    return;
  }
  response.set_code(rpc::ToWireCode(file.status().code()));
  response.set_message(std::string(file.status().message()));
  (void)SendResponse(conn, response, -1);
}

void WorkerFdSocket::Stop() {
  if (stopping_.exchange(true)) return;
  ::shutdown(fd_, SHUT_RDWR);  // wakes accept()
  if (acceptor_.joinable()) acceptor_.join();
  {
    std::unique_lock<std::mutex> l(mu_);
    idle_.wait(l, [this] { return active_ == 0; });
  }
  ::close(fd_);
  ::unlink(path_.c_str());
}

}  // namespace reshard::agent
