// Support for the agent's end-to-end tests: reshard-agent as a child
// process (start-up line read from its stdout), and a job's reference
// contents (random bytes for every global element) that the test, playing the
// training workers, publishes through each host's WorkerService and later
// compares, element by element, with what OpenGeneration returns. The
// reference of a new layout comes from the independent verifier's model
// (verifier/model.h). Not thread-safe.
#pragma once

#include <sys/types.h>

#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "reshard/v1/coordinator.grpc.pb.h"
#include "reshard/v1/ptc.pb.h"
#include "reshard/v1/worker.grpc.pb.h"
#include "tests/support/process.h"

namespace grpc {
class ClientContext;
}

namespace reshard::agent::testing {

/// The binary under test (from CMake).
std::string AgentBinary();

class AgentProcess {
 public:
  struct Options {
    std::string host_id;
    std::string coordinator;    // host:port
    std::string worker_socket;  // path
    std::string shm_dir;
    std::vector<std::string> extra_args;
    /// Runs the agent through this prefix (e.g. {"ip", "netns", "exec", "ns"}).
    std::vector<std::string> wrapper;
    std::vector<std::pair<std::string, std::string>> env;  // added to the environment
  };
  /// Starts the agent and waits for its start-up line.
  static absl::StatusOr<std::unique_ptr<AgentProcess>> Start(const Options& options);
  ~AgentProcess();  // SIGKILL if still running

  void Kill();  // SIGKILL and reap
  /// SIGTERM, waits; the exit status.
  absl::StatusOr<int> Terminate();
  const Options& options() const { return options_; }
  pid_t pid() const { return pid_; }
  /// The port the agent serves /metrics on, from its start-up log ("host
  /// <id>: /metrics on port N"): 0 when it serves none. With
  /// `--metrics-listen 127.0.0.1:0` the kernel picks it, so no other process
  /// can take it between a test's choice and the agent's bind.
  int metrics_port() const { return metrics_port_; }

 private:
  AgentProcess() = default;
  Options options_;
  test_support::ChildProcess child_;
  pid_t pid_ = -1;  // -1 once killed or terminated
  int metrics_port_ = 0;
  std::thread reader_;
};

/// One job's contents in one layout: per rank, per item, the bytes its
/// buffer holds.
struct Contents {
  v1::Layout layout;
  std::vector<std::vector<std::string>> ranks;  // [rank][item]
};

/// Random bytes for every element of every item, laid out as `layout` says.
absl::StatusOr<Contents> RandomContents(const v1::Ptc& ptc, const v1::Layout& layout,
                                        uint64_t seed);

/// What `to` must hold after a plan from `from` (the lost hosts' ranks
/// excluded as sources).
absl::StatusOr<Contents> Reshard(const v1::Ptc& ptc, const Contents& from, const v1::Layout& to,
                                 const std::vector<std::string>& lost_hosts);

/// The host of every rank of `layout`.
std::vector<std::string> RankHosts(const v1::Layout& layout);

/// Remembers the worker token of `job_id` (RegisterJob's `worker_token`):
/// Publish and Verify send it (docs/security.md, "Worker tokens").
/// Thread-safe.
void SetWorkerToken(const std::string& job_id, const std::string& token);
/// Adds `authorization: Bearer <token of job_id>` when one is remembered.
void AddWorkerToken(grpc::ClientContext* ctx, const std::string& job_id);

/// Publishes and seals every rank of `c` (ranks on `skip_hosts` excepted)
/// through the WorkerService of its host (`sockets`: host -> socket path).
absl::Status Publish(const std::map<std::string, std::string>& sockets, const std::string& job_id,
                     int64_t generation, const Contents& c);

/// Publishes and seals rank `rank` of `c` alone (as Publish does each).
absl::Status PublishRank(const std::map<std::string, std::string>& sockets,
                         const std::string& job_id, int64_t generation, const Contents& c,
                         int rank);

/// Opens every rank of `c` (ranks on `skip_hosts` excepted) of
/// `generation` through its host's WorkerService and compares every byte.
absl::Status Verify(const std::map<std::string, std::string>& sockets, const std::string& job_id,
                    int64_t generation, const Contents& c,
                    const std::vector<std::string>& skip_hosts = {});

}  // namespace reshard::agent::testing
