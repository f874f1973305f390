#include "agent/executor/mover.h"

#include <algorithm>
#include <set>
#include <thread>

#include "absl/strings/str_cat.h"
#include "agent/executor/peer_proof.h"
#include "agent/executor/peer_wait.h"
#include "agent/executor/transfer_tags.h"

namespace reshard::agent {

absl::Status ConnectTaskPeers(Transport* transport, const std::string& host_id,
                              const v1::HostTask& task, const std::function<bool()>& cancelled) {
  constexpr int kConnectAttempts = 4;
  for (const v1::PeerHost& p : task.peers()) {
    if (p.host_id() == host_id || p.ucx_address().empty()) continue;
    absl::Status connect;
    for (int attempt = 0; attempt < kConnectAttempts; ++attempt) {
      if (attempt > 0) std::this_thread::sleep_for(std::chrono::milliseconds(100 << attempt));
      connect = transport->Connect(p.host_id(), p.ucx_address());
      if (connect.ok() || !absl::IsUnavailable(connect) || (cancelled && cancelled())) break;
    }
    if (!connect.ok()) {
      return absl::Status(connect.code(), absl::StrCat("connecting to host \"", p.host_id(),
                                                       "\": ", connect.message()));
    }
  }
  return absl::OkStatus();
}

MoverCapabilities UcxHostMover::capabilities() const {
  MoverCapabilities c;
  c.name = transport_->name();
  c.memory_kinds = {MemoryKind::kHost};
  c.remote = true;
  c.notifications = true;  // a tagged receive completes when its message is in
  return c;
}

absl::Status UcxHostMover::Prepare(const std::string& host_id, const v1::HostTask& task,
                                   const std::function<bool()>& cancelled) {
  return ConnectTaskPeers(transport_, host_id, task, cancelled);
}

void UcxHostMover::Post(uint64_t id, MoverTransfer t) {
  TransferDone cb = [state = completions_, id, hold = std::move(t.hold)](absl::Status s) {
    std::lock_guard<std::mutex> l(state->mu);
    state->done.emplace_back(id, std::move(s));
    state->cv.notify_one();
  };
  if (t.is_send) {
    transport_->Send(t.peer, t.tag, t.data, t.bytes, std::move(cb));
  } else {
    transport_->Receive(t.tag, t.data, t.bytes, std::move(cb));
  }
}

void UcxHostMover::Poll(std::chrono::steady_clock::duration wait,
                        std::deque<MoverCompletion>* out) {
  std::unique_lock<std::mutex> l(completions_->mu);
  if (completions_->done.empty() && wait > std::chrono::steady_clock::duration::zero()) {
    completions_->cv.wait_for(l, wait);
  }
  while (!completions_->done.empty()) {
    out->push_back(std::move(completions_->done.front()));
    completions_->done.pop_front();
  }
}

void UcxHostMover::Cancel(uint64_t tag, uint64_t mask) { transport_->CancelTags(tag, mask); }

Mover* MoverFor(const std::vector<Mover*>& movers, MemoryKind src, MemoryKind dst) {
  for (Mover* m : movers) {
    const MoverCapabilities c = m->capabilities();
    auto has = [&](MemoryKind k) {
      return std::find(c.memory_kinds.begin(), c.memory_kinds.end(), k) != c.memory_kinds.end();
    };
    if (c.remote && has(src) && has(dst)) return m;
  }
  return nullptr;
}

absl::Status PreparePeersAndProve(Mover* mover, Transport* transport,
                                  const TaskExecutor::Options& options,
                                  const std::string& host_id, const v1::HostTask& task,
                                  const std::vector<RemoteStep>& remotes,
                                  const std::function<bool()>& cancelled,
                                  const std::function<void(const std::string& what)>& waiting) {
  if (mover != nullptr) {
    if (absl::Status s = mover->Prepare(host_id, task, cancelled); !s.ok()) return s;
  }
  // Every sender proves to every receiver that it belongs to the operation
  // before any receive of its data is posted.
  if (task.transfer_secret().empty() || remotes.empty()) return absl::OkStatus();
  std::set<std::string> send_to, receive_from;
  for (const RemoteStep& r : remotes) (r.is_send ? send_to : receive_from).insert(r.peer);
  if (waiting) {
    waiting(absl::StrCat("transfer proofs (", receive_from.size(), " to receive, ",
                         send_to.size(), " to send)"));
  }
  return ExchangePeerProofs(transport, task.transfer_secret(), TransferContext(task), host_id,
                            ProofTag(TaskTagKey(task)), send_to, receive_from, cancelled,
                            PeerWaitBudget(std::chrono::milliseconds(options.proof_timeout_ms),
                                           options.coordinator_reach));
}

}  // namespace reshard::agent
