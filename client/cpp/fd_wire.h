// The wire of the agent's descriptor socket, `<worker socket>.fds`
// (agent/process/worker_fd_socket.h), as the worker speaks it: a message is
// a 4-byte little-endian length and that many bytes of protobuf, and an
// answer's descriptor rides with its bytes (SCM_RIGHTS). Header-only and
// free of the client's dependencies, so that a test playing the worker
// (tests/agent/e2e/worker_fd_socket_test.cc) speaks it too. Stateless,
// thread-safe.
#pragma once

#include <sys/socket.h>
#include <sys/types.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

namespace reshard::client::fd_wire {

/// The 4 bytes that announce a message of `n` bytes.
inline std::string LengthPrefix(uint32_t n) {
  std::string out(4, '\0');
  for (int i = 0; i < 4; ++i) out[i] = static_cast<char>((n >> (8 * i)) & 0xff);
  return out;
}

/// `body` behind its length.
inline std::string Framed(const std::string& body) {
  return LengthPrefix(static_cast<uint32_t>(body.size())) + body;
}

/// One recvmsg on `sock` (again when interrupted): appends the bytes it read
/// to `*data` and every descriptor that came with them to `*fds` (the
/// caller's to close; close-on-exec). Returns how many bytes it read, 0 when
/// the peer closed, -1 with errno set on an error.
inline ssize_t Receive(int sock, std::string* data, std::vector<int>* fds) {
  for (;;) {
    char buf[4096];
    iovec iov{buf, sizeof(buf)};
    alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))] = {};
    msghdr msg{};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control;
    msg.msg_controllen = sizeof(control);
    const ssize_t got = ::recvmsg(sock, &msg, MSG_CMSG_CLOEXEC);
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) return got;
    for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c != nullptr; c = CMSG_NXTHDR(&msg, c)) {
      if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS &&
          c->cmsg_len >= CMSG_LEN(sizeof(int))) {
        int fd = -1;
        std::memcpy(&fd, CMSG_DATA(c), sizeof(int));
        fds->push_back(fd);
      }
    }
    data->append(buf, static_cast<size_t>(got));
    return got;
  }
}

}  // namespace reshard::client::fd_wire
