// Pieces shared by the transfer benchmarks: several agents in one process
// (shard store, UCX transport over loopback TCP, executor each), running one
// task on all of them at once; and the reference bandwidths (ucx_perftest,
// the bare transport). Not thread-safe.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "agent/executor/executor.h"
#include "agent/transfer/ucx_transport.h"
#include "reshard/v1/agent.pb.h"

namespace reshard::agent::bench {

struct Agent {
  std::string id;  // "h0", "h1", ...
  std::filesystem::path dir;
  std::unique_ptr<ShardStore> store;
  std::unique_ptr<UcxTransport> transport;
  std::unique_ptr<TaskExecutor> executor;
};

/// The UCX_TLS of the agents, the bare transport and ucx_perftest ("tcp"
/// unless set; "tcp,sm" lets UCX use shared memory between agents on one
/// machine). Set before any other call.
void SetUcxTransports(const std::string& tls);
/// false: the agents' transports connect by worker address, not through a
/// listener (docs/agent.md, "Known UCX defect"), to compare the two.
void SetUcxListen(bool listen);

/// Where the agents' shm dirs are made ("/dev/shm" unless set; e.g. a tmpfs
/// mounted with huge=within_size). Set before any other call.
void SetShmRoot(const std::string& dir);

/// `n` agents h0..h<n-1>, each with its own shm dir under the shm root and a
/// spare pool of `spare_bytes` (0: none), which starts filling at once.
std::vector<Agent> MakeAgents(int n, int64_t memory_limit_bytes, int64_t spare_bytes = 0);
/// Waits until every agent's spare pool is full (false after a minute), then
/// kSettleSeconds more.
bool WaitForSpares(std::vector<Agent>* agents);

/// How long a timed run waits after its setup, pool or not. This VM returns
/// freed memory to its host after about 2 s (virtio-balloon free page
/// reporting); a page allocated later costs a host fault on top of zeroing, so
/// without the wait a run right after another's teardown reuses pages still
/// backed and is faster than an agent that has been idle would be.
inline constexpr double kSettleSeconds = 3;
/// Shuts the transports down and removes the shm dirs.
void DropAgents(std::vector<Agent>* agents);

/// Creates generation `generation` of every rank of `layout` on its host's
/// agent, every page written (a pattern), as workers would have published it.
bool FillRanks(std::vector<Agent>* agents, const std::string& job, const v1::Ptc& ptc,
               const v1::Layout& layout, int64_t generation);

/// A task for `plan` with every agent as a peer; with `transfer_secret`
/// (as the coordinator always sends one) the agents prove themselves to each
/// other and seal every cross-host step (docs/security.md).
v1::HostTask MakeTask(const std::vector<Agent>& agents, const std::string& job, const v1::Ptc& ptc,
                      const v1::TransferPlan& plan, const std::string& transfer_secret = "");

/// Where one agent's Execute spent its time (seconds from the common start).
struct AgentTimes {
  double created = 0;   // new buffers made (first progress report)
  double moved = 0;     // every byte in (progress reports done == total)
  double sealed = 0;    // Execute returned
  int64_t written = 0;  // bytes the agent wrote into its new buffers
};

/// CPU seconds (user + system) this process has used so far: the agents are
/// in-process, so the difference around a run is what they spent on it.
double ProcessCpuSeconds();

/// Runs `task` on every agent at once; wall seconds (negative on failure,
/// each failed Execute's status printed to stderr) and each agent's times.
/// `cancel`: every Execute is cancelled (a forced failure). `cpu_seconds`,
/// if set, receives the CPU seconds all agents used during the run.
double RunTask(std::vector<Agent>* agents, const v1::HostTask& task, std::vector<AgentTimes>* times,
               bool cancel = false, double* cpu_seconds = nullptr);

/// ucx_perftest tag_bw over tcp/lo, `message` bytes x `iters`: MiB/s, or
/// negative with `why`.
double PerftestMiBps(int64_t message, int64_t iters, std::string* why);

/// Two bare UCX transports over tcp/lo moving `total` bytes in `message`-byte
/// tag messages, all posted at once into warm buffers: MiB/s, or negative.
double BareTransportMiBps(int64_t total, int64_t message);

}  // namespace reshard::agent::bench
