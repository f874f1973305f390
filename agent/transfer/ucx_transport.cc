// The UCX transport (ucx_transport.h): the Transport calls, the progress
// thread that runs every UCX call, and the order of shutdown. Its parts, cut
// as NIXL's UCX plugin cuts them: the context and worker (ucx_worker.h), the
// listener and endpoints (ucx_connections.h), the requests in flight and
// their cancellation (ucx_requests.h), and the drain of cancelled messages
// (ucx_discard.h). There is no memory registration: tag send/receive reads
// and writes the callers' host buffers as they are.
#include "agent/transfer/ucx_transport.h"

#include <chrono>
#include <deque>
#include <functional>
#include <future>
#include <memory>
#include <mutex>
#include <thread>

#include "absl/strings/str_cat.h"
#include "agent/transfer/ucx_connections.h"
#include "agent/transfer/ucx_discard.h"
#include "agent/transfer/ucx_requests.h"
#include "agent/transfer/ucx_worker.h"

namespace reshard::agent {
namespace {

// At shutdown, how long force-closed endpoints get to fail their sends.
constexpr auto kShutdownGrace = std::chrono::seconds(5);
// At shutdown, how long no connection request must have come before the
// listener may go.
constexpr auto kConnectQuiet = std::chrono::milliseconds(50);
// How long the idle progress thread sleeps at most.
constexpr int kSleepMs = 100;

class UcxTransportImpl final : public UcxTransport {
 public:
  ~UcxTransportImpl() override { Shutdown(); }

  absl::Status Init(const UcxOptions& options) {
    if (absl::Status s = worker_.Init(options); !s.ok()) return s;
    requests_ = std::make_unique<UcxRequests>(worker_.get());
    connections_ = std::make_unique<UcxConnections>(
        worker_.get(),
        [this] {
          std::lock_guard<std::mutex> l(mu_);
          return stopping_;
        },
        [this](const std::string& why) { requests_->FailReceives(why); });
    absl::StatusOr<std::string> address = connections_->Listen(options);
    if (!address.ok()) return address.status();
    address_ = *std::move(address);
    if (absl::Status s = worker_.EnableSleep(); !s.ok()) return s;
    discards_ = std::make_unique<UcxDiscards>(worker_.get());
    requests_->PostNoticeReceive();  // before the thread: no other UCX call yet
    thread_ = std::thread([this] { Loop(); });
    return absl::OkStatus();
  }

  std::string name() const override { return "ucx"; }
  std::string LocalAddress() const override { return address_; }

  absl::Status Connect(const std::string& peer_id, const std::string& address) override {
    if (address.empty())
      return absl::InvalidArgumentError(absl::StrCat("peer \"", peer_id, "\": empty UCX address"));
    auto promise = std::make_shared<std::promise<absl::Status>>();
    auto future = promise->get_future();
    if (!Post([this, peer_id, address, promise] {
          promise->set_value(connections_->Connect(peer_id, address));
        })) {
      return absl::CancelledError("UCX transport shut down");
    }
    return future.get();
  }

  void Send(const std::string& peer_id, uint64_t tag, const void* data, size_t bytes,
            TransferDone done) override {
    if (tag == kReservedTag) {
      if (done) done(absl::InvalidArgumentError("send: tag ~0 is reserved by the transport"));
      return;
    }
    UcxRequest* r = requests_->New(tag, bytes, std::move(done));
    r->is_send = true;
    r->peer = peer_id;
    if (!Post([this, r, data] {
          absl::StatusOr<UcxEndpoint*> e = connections_->EndpointFor(r->peer);
          if (!e.ok()) return UcxRequests::Fail(r, e.status());
          requests_->Send(r, *e, data);
        })) {
      UcxRequests::Fail(r, absl::CancelledError("UCX transport shut down"));
    }
  }

  void Receive(uint64_t tag, void* data, size_t bytes, TransferDone done) override {
    if (tag == kReservedTag) {
      if (done) done(absl::InvalidArgumentError("receive: tag ~0 is reserved by the transport"));
      return;
    }
    UcxRequest* r = requests_->New(tag, bytes, std::move(done));
    if (!Post([this, r, data] { requests_->Receive(r, data); }))
      UcxRequests::Fail(r, absl::CancelledError("UCX transport shut down"));
  }

  void CancelTags(uint64_t tag, uint64_t mask) override {
    Post([this, tag, mask] {
      const auto now = UcxClock::now();
      // Peers may still send us this operation's messages: drop them.
      discards_->Add(tag, mask, now);
      for (UcxEndpoint* e : requests_->Cancel(tag, mask)) {
        connections_->WatchCancelled(e, now);
        requests_->SendDiscardNotice(e, tag & mask, mask);
      }
    });
  }

  void Shutdown() override {
    {
      std::lock_guard<std::mutex> l(mu_);
      if (stopping_) {
        if (!thread_.joinable()) return;
      }
      stopping_ = true;
    }
    if (worker_.get() != nullptr) worker_.Signal();
    if (thread_.joinable()) thread_.join();
    worker_.CloseSleep();
    // The listener goes immediately before the worker, whose destruction
    // closes the connection manager's endpoints. UCX 1.13 (fixed in 1.14,
    // openucx/ucx#8243) lets a TCP connection the listener accepted but whose
    // request has not yet arrived outlive the listener: when the request then
    // arrives, UCX's async thread calls into the freed listener
    // (ucp_cm_server_conn_request_cb). Destroying the listener here, after
    // the progress thread's shutdown grace and not before it, leaves that
    // race a window of microseconds instead of seconds.
    if (connections_ != nullptr) connections_->DestroyListener();
    worker_.DestroyWorker();
    discards_.reset();  // its scratch buffers, now that UCX is done with them
    if (requests_ != nullptr) requests_->FreeAbandoned();
    worker_.Cleanup();
  }

  size_t pending() const override { return requests_ ? requests_->pending_count() : 0; }

 private:
  // Queues `fn` for the progress thread; false once stopping.
  bool Post(std::function<void()> fn) {
    {
      std::lock_guard<std::mutex> l(mu_);
      if (stopping_) return false;
      queue_.push_back(std::move(fn));
      worker_.Signal();  // thread-safe; under mu_ so the worker is alive
    }
    return true;
  }

  void Loop() {
    int idle = 0;
    for (;;) {
      std::deque<std::function<void()>> work;
      bool stop;
      {
        std::lock_guard<std::mutex> l(mu_);
        work.swap(queue_);
        stop = stopping_;
      }
      for (auto& fn : work) fn();
      if (stop) break;
      connections_->Progress();
      bool busy = worker_.Progress();
      if (requests_->TakeNotice(discards_.get())) busy = true;
      if (discards_->active() && discards_->Progress(UcxClock::now())) busy = true;
      if (busy || !work.empty()) {
        idle = 0;
        continue;
      }
      if (++idle < IdleSpins()) continue;
      // Nothing happening: sleep until UCX or Post wakes the worker.
      if (worker_.Sleep(kSleepMs)) idle = 0;
    }
    Stop();
  }

  // Stopping: cancel the receives, force-close every endpoint (which fails
  // its sends: UCX cannot cancel them, and a flush would wait for receivers
  // that may never match), and progress until UCX has completed them, so no
  // request is left on an endpoint the worker destroys.
  void Stop() {
    requests_->CancelReceives();
    connections_->CloseAll();
    // Progress until every request has completed and no connection request
    // has come for kConnectQuiet (each is rejected as it comes): a peer that
    // connected just before the stop gets its answer now, while the listener
    // lives (see Shutdown on why that matters with UCX 1.13).
    const auto deadline = UcxClock::now() + kShutdownGrace;
    connections_->QuietSince(UcxClock::now());
    while ((!requests_->empty() ||
            UcxClock::now() - connections_->last_conn_request() < kConnectQuiet) &&
           UcxClock::now() < deadline) {
      worker_.Progress();
    }
    // Anything still pending fails here; its UCX request is left to the
    // worker's destruction.
    requests_->AbandonPending();
  }

  UcxWorker worker_;
  std::unique_ptr<UcxRequests> requests_;
  std::unique_ptr<UcxConnections> connections_;
  std::unique_ptr<UcxDiscards> discards_;
  std::string address_;
  std::thread thread_;

  std::mutex mu_;
  bool stopping_ = false;
  std::deque<std::function<void()>> queue_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<UcxTransport>> MakeUcxTransportImpl(const UcxOptions& options) {
  auto t = std::make_unique<UcxTransportImpl>();
  absl::Status s = t->Init(options);
  if (!s.ok()) return s;
  return std::unique_ptr<UcxTransport>(std::move(t));
}

absl::StatusOr<std::unique_ptr<Transport>> MakeUcxTransport(const UcxOptions& options) {
  auto t = MakeUcxTransportImpl(options);
  if (!t.ok()) return t.status();
  return std::unique_ptr<Transport>(std::move(*t));
}

}  // namespace reshard::agent
