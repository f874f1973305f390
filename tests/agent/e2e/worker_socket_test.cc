// The agent's worker socket (agent/process/worker_socket.h): a real gRPC
// server behind a socket the agent accepts itself; a call made from this
// process is attributed to this process's pid, uid and gid (SO_PEERCRED),
// the socket has the mode asked for before anyone can connect, and Stop()
// removes it.
#include "agent/process/worker_socket.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <optional>
#include <string>

#include "grpcpp/grpcpp.h"
#include "reshard/v1/worker.grpc.pb.h"

namespace reshard::agent {
namespace {

// Answers PublishShard with the caller's credentials as the socket saw them.
class EchoCaller final : public v1::WorkerService::Service {
 public:
  explicit EchoCaller(const WorkerSocket* socket) : socket_(socket) {}
  grpc::Status PublishShard(grpc::ServerContext* ctx, const v1::PublishShardRequest*,
                            v1::PublishShardResponse* resp) override {
    std::optional<PeerCredentials> c = socket_->CredentialsOf(ctx->peer());
    if (!c.has_value()) return grpc::Status(grpc::StatusCode::NOT_FOUND, ctx->peer());
    resp->set_path(std::to_string(c->pid) + " " + std::to_string(c->uid) + " " +
                   std::to_string(c->gid));
    return grpc::Status::OK;
  }

 private:
  const WorkerSocket* socket_;
};

TEST(WorkerSocketTest, CallsCarryTheCallersPeerCredentials) {
  const std::string path = (std::filesystem::temp_directory_path() /
                            ("reshard-ws-test-" + std::to_string(getpid()) + ".sock"))
                               .string();
  absl::StatusOr<std::unique_ptr<WorkerSocket>> socket = WorkerSocket::Listen(path, -1, 0600);
  ASSERT_TRUE(socket.ok()) << socket.status();
  struct stat st {};
  ASSERT_EQ(::stat(path.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  EXPECT_TRUE(S_ISSOCK(st.st_mode));

  EchoCaller service(socket->get());
  grpc::ServerBuilder builder;
  builder.RegisterService(&service);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  ASSERT_NE(server, nullptr);
  (*socket)->Serve(server.get());

  auto stub = v1::WorkerService::NewStub(
      grpc::CreateChannel("unix:" + path, grpc::InsecureChannelCredentials()));
  for (int call = 0; call < 2; ++call) {  // the same connection twice
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(20));
    v1::PublishShardResponse resp;
    grpc::Status s = stub->PublishShard(&ctx, v1::PublishShardRequest(), &resp);
    ASSERT_TRUE(s.ok()) << s.error_message();
    EXPECT_EQ(resp.path(), std::to_string(getpid()) + " " + std::to_string(getuid()) + " " +
                               std::to_string(getgid()));
  }
  EXPECT_EQ((*socket)->CredentialsOf("unix:/elsewhere"), std::nullopt);

  (*socket)->Stop();
  EXPECT_FALSE(std::filesystem::exists(path));
  server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
}

}  // namespace
}  // namespace reshard::agent
