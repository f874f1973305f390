// A reshard-agent that misbehaves on the data plane, for the fault tests
// (tampered_transfer_e2e_test.cc): the real agent's pieces (shard store, UCX
// transport, executor, coordinator session, the same flags) with a transport
// that alters what it sends to other agents:
//   --tamper proof  the MAC of every transfer proof it sends (a peer that
//                   presents a wrong proof: not made with the operation's
//                   transfer secret);
//   --tamper data   one byte of every data chunk it sends (bytes altered
//                   after they were read from the sealed source, as on a
//                   faulty or hostile path).
// It serves no workers: it reloads the shards an earlier (real) agent of the
// host left in --shm-dir, and prints the real agent's start-up line.
// Usage: rogue_agent --tamper proof|data [AGENT_BINARY] AGENT_FLAGS...
// (AGENT_BINARY, when it is a path, is skipped: the e2e harness runs agents
// as a wrapper followed by the real binary's path.)
#include <atomic>
#include <cstdlib>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "agent/executor/executor.h"
#include "agent/executor/step_chunks.h"
#include "agent/process/config.h"
#include "agent/process/coordinator_session.h"
#include "agent/process/metrics.h"
#include "agent/shard_store/shard_store.h"
#include "agent/transfer/transport.h"
#include "common/log.h"
#include "common/signals.h"
#include "prometheus/registry.h"

namespace reshard::agent {
namespace {

// Sends a private, altered copy of every message `tamper` selects (the
// caller's buffer may be a read-only sealed mapping); everything else is
// forwarded unchanged.
class AlteringTransport : public Transport {
 public:
  AlteringTransport(std::unique_ptr<Transport> own, bool proofs)
      : own_(std::move(own)), proofs_(proofs) {}
  std::string name() const override { return own_->name(); }
  std::string LocalAddress() const override { return own_->LocalAddress(); }
  absl::Status Connect(const std::string& peer, const std::string& address) override {
    return own_->Connect(peer, address);
  }
  void Send(const std::string& peer, uint64_t tag, const void* data, size_t bytes,
            TransferDone done) override {
    const int64_t step = static_cast<int64_t>((tag >> kTagChunkBits) & (kMaxTaggedSteps - 1));
    const int64_t chunk = static_cast<int64_t>(tag & (kMaxChunksPerStep - 1));
    const bool proof = step == kProofStepIndex;
    const bool chunk_of_data = !proof && chunk != kSealChunk;
    if (bytes == 0 || (proofs_ ? !proof : !chunk_of_data)) {
      own_->Send(peer, tag, data, bytes, std::move(done));
      return;
    }
    auto copy = std::make_shared<std::string>(static_cast<const char*>(data), bytes);
    // A proof is the host id, length-prefixed (4 bytes, little endian; ids
    // are shorter than 256 bytes), then the MAC: alter the MAC's first byte.
    (*copy)[proofs_ ? 4 + static_cast<uint8_t>((*copy)[0]) : bytes / 2] ^= 0x01;
    if (!logged_.exchange(true)) {
      RESHARD_LOG(WARNING) << "rogue agent: altering every " << (proofs_ ? "proof" : "data chunk")
                           << " it sends, from step " << step << " to host " << peer << " on";
    }
    own_->Send(peer, tag, copy->data(), bytes,
               [copy, done = std::move(done)](absl::Status s) { done(std::move(s)); });
  }
  void Receive(uint64_t tag, void* data, size_t bytes, TransferDone done) override {
    own_->Receive(tag, data, bytes, std::move(done));
  }
  void CancelTags(uint64_t tag, uint64_t mask) override { own_->CancelTags(tag, mask); }
  void Shutdown() override { own_->Shutdown(); }

 private:
  std::unique_ptr<Transport> own_;
  bool proofs_;
  std::atomic<bool> logged_{false};
};

int Run(int argc, char** argv) {
  std::vector<std::string> args(argv + 1, argv + argc);
  if (args.size() < 2 || args[0] != "--tamper" || (args[1] != "proof" && args[1] != "data")) {
    std::cerr << "usage: rogue_agent --tamper proof|data [AGENT_BINARY] AGENT_FLAGS...\n";
    return 2;
  }
  const bool proofs = args[1] == "proof";
  args.erase(args.begin(), args.begin() + 2);
  if (!args.empty() && args[0].rfind("--", 0) != 0) args.erase(args.begin());
  absl::StatusOr<AgentConfig> config =
      ParseAgentConfig(args, [](const char* name) { return std::getenv(name); });
  if (!config.ok()) {
    std::cerr << "rogue_agent: " << config.status() << "\n";
    return 2;
  }
  BlockTerminationSignals();
  ShardStore::Options so;
  so.shm_dir = config->shm_dir;
  so.host_id = config->host_id;
  so.memory_limit_bytes = config->memory_limit_bytes;
  absl::StatusOr<std::unique_ptr<ShardStore>> store = ShardStore::Open(so);
  if (!store.ok()) {
    std::cerr << "rogue_agent: " << store.status() << "\n";
    return 1;
  }
  absl::StatusOr<std::unique_ptr<Transport>> ucx =
      MakeUcxTransport(UcxOptions{config->ucx_net_devices, config->ucx_tls});
  if (!ucx.ok()) {
    std::cerr << "rogue_agent: " << ucx.status() << "\n";
    return 1;
  }
  AlteringTransport transport(*std::move(ucx), proofs);
  TaskExecutor::Options eo;
  eo.proof_timeout_ms = 5000;
  eo.seal_timeout_ms = 5000;
  TaskExecutor executor(store->get(), &transport, eo);
  AgentMetrics metrics(std::make_shared<prometheus::Registry>());
  absl::StatusOr<std::shared_ptr<grpc::Channel>> channel =
      CoordinatorChannel(config->coordinator, config->tls);
  if (!channel.ok()) {
    std::cerr << "rogue_agent: " << channel.status() << "\n";
    return 1;
  }
  CoordinatorSession::Options o;
  o.host_id = config->host_id;
  o.address = config->address;
  o.memory_limit_bytes = config->memory_limit_bytes;
  o.heartbeat_ms = config->heartbeat_ms;
  o.metrics = &metrics;
  CoordinatorSession session(o, *channel, store->get(), &executor, &transport);
  session.Start();
  std::cout << "reshard-agent " << config->host_id << " ready worker-socket "
            << config->worker_socket << std::endl;
  WaitForTerminationSignal();
  session.Stop();
  transport.Shutdown();
  return 0;
}

}  // namespace
}  // namespace reshard::agent

int main(int argc, char** argv) { return reshard::agent::Run(argc, argv); }
