// The worker socket's descriptor companion (worker_fd_socket.h) over a real
// unix socket: an answered request carries exactly one descriptor of the
// file the handler opened; a refusal carries the handler's code and message
// and no descriptor; a request that is not a WorkerFdRequest, or too large,
// is INVALID_ARGUMENT without reaching the handler; the socket gets its mode.
#include "agent/process/worker_fd_socket.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "client/cpp/fd_wire.h"

namespace reshard::agent {
namespace {

using client::fd_wire::Framed;
using client::fd_wire::LengthPrefix;

struct Reply {
  v1::WorkerFdResponse response;
  int fd = -1;
  int fds = 0;  // descriptors received
};

// Sends `wire` as is and reads the whole answer.
Reply Ask(const std::string& path, const std::string& wire) {
  Reply out;
  const int s = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, path.data(), path.size());
  EXPECT_EQ(::connect(s, reinterpret_cast<const sockaddr*>(&addr), sizeof(addr)), 0) << path;
  EXPECT_EQ(::send(s, wire.data(), wire.size(), MSG_NOSIGNAL), static_cast<ssize_t>(wire.size()));
  std::string data;
  std::vector<int> fds;
  while (client::fd_wire::Receive(s, &data, &fds) > 0) {
  }
  ::close(s);
  out.fds = static_cast<int>(fds.size());
  if (!fds.empty()) out.fd = fds.back();
  EXPECT_GE(data.size(), 4u);
  if (data.size() >= 4) {
    EXPECT_TRUE(out.response.ParseFromString(data.substr(4)));
  }
  return out;
}

class WorkerFdSocketTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/fdsock-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    file_ = dir_ + "/shard";
    const int fd = ::open(file_.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
    ASSERT_GE(fd, 0);
    ASSERT_EQ(::write(fd, "sealed bytes", 12), 12);
    ::close(fd);
    auto socket = WorkerFdSocket::Listen(WorkerFdSocket::PathFor(dir_ + "/w.sock"), -1, 0660);
    ASSERT_TRUE(socket.ok()) << socket.status();
    socket_ = *std::move(socket);
    socket_->Serve([this](const v1::WorkerFdRequest& req, const std::string& caller)
                       -> absl::StatusOr<RankBuffer::WorkerFile> {
      ++calls_;
      EXPECT_NE(caller.find(absl::StrCat("pid ", ::getpid())), std::string::npos) << caller;
      if (req.worker_token() != "wt-good") {
        return absl::PermissionDeniedError(absl::StrCat("job \"", req.job_id(), "\" refused"));
      }
      const int fd = ::open(file_.c_str(), O_RDONLY | O_CLOEXEC);
      if (fd < 0) return absl::InternalError("open");
      return RankBuffer::WorkerFile{fd, 12};
    });
  }
  void TearDown() override {
    socket_.reset();
    std::filesystem::remove_all(dir_);
  }
  std::string Path() const { return dir_ + "/w.sock.fds"; }

  std::string dir_, file_;
  std::unique_ptr<WorkerFdSocket> socket_;
  std::atomic<int> calls_{0};
};

TEST_F(WorkerFdSocketTest, AnAnsweredRequestCarriesOneDescriptorOfTheFile) {
  struct stat st {};
  ASSERT_EQ(::stat(Path().c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 0660u);
  v1::WorkerFdRequest req;
  req.set_worker_token("wt-good");
  req.set_job_id("j");
  req.set_access(v1::WorkerFdRequest::ACCESS_LOAD);
  Reply r = Ask(Path(), Framed(req.SerializeAsString()));
  EXPECT_EQ(r.response.code(), 0) << r.response.message();
  EXPECT_EQ(r.response.size(), 12);
  ASSERT_EQ(r.fds, 1);
  char buf[12];
  ASSERT_EQ(::pread(r.fd, buf, sizeof(buf), 0), 12);
  EXPECT_EQ(std::string(buf, 12), "sealed bytes");
  ::close(r.fd);
}

TEST_F(WorkerFdSocketTest, ARefusalCarriesTheCodeAndMessageAndNoDescriptor) {
  v1::WorkerFdRequest req;
  req.set_worker_token("wt-other");
  req.set_job_id("victim");
  Reply r = Ask(Path(), Framed(req.SerializeAsString()));
  EXPECT_EQ(r.response.code(), static_cast<int>(absl::StatusCode::kPermissionDenied));
  EXPECT_NE(r.response.message().find("\"victim\""), std::string::npos) << r.response.message();
  EXPECT_EQ(r.fds, 0);
}

TEST_F(WorkerFdSocketTest, MalformedOrOversizedRequestsNeverReachTheHandler) {
  Reply r = Ask(Path(), Framed("\xff\xff\xff"));
  EXPECT_EQ(r.response.code(), static_cast<int>(absl::StatusCode::kInvalidArgument));
  EXPECT_EQ(r.fds, 0);
  r = Ask(Path(), LengthPrefix(WorkerFdSocket::kMaxRequestBytes + 1));
  EXPECT_EQ(r.response.code(), static_cast<int>(absl::StatusCode::kInvalidArgument));
  EXPECT_EQ(r.fds, 0);
  EXPECT_EQ(calls_.load(), 0);
}

}  // namespace
}  // namespace reshard::agent
