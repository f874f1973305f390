#include "agent/transfer/ucx_transport.h"

#include <sys/epoll.h>
#include <ucp/api/ucp.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <deque>
#include <future>
#include <mutex>
#include <optional>
#include <random>
#include <thread>
#include <unordered_map>
#include <unordered_set>

#include "absl/strings/str_cat.h"
#include "agent/transfer/ucx_address.h"
#include "agent/transfer/ucx_discard.h"
#include "common/log.h"

namespace reshard::agent {
namespace {

absl::Status FromUcs(ucs_status_t s, const std::string& what) {
  if (s == UCS_OK) return absl::OkStatus();
  const std::string msg = absl::StrCat(what, ": ", ucs_status_string(s));
  switch (s) {
    case UCS_ERR_CANCELED:
      return absl::CancelledError(msg);
    case UCS_ERR_MESSAGE_TRUNCATED:
      return absl::InvalidArgumentError(msg);
    case UCS_ERR_NO_MEMORY:
      return absl::ResourceExhaustedError(msg);
    case UCS_ERR_INVALID_PARAM:
    case UCS_ERR_INVALID_ADDR:
      return absl::InvalidArgumentError(msg);
    case UCS_ERR_UNREACHABLE:
    case UCS_ERR_CONNECTION_RESET:
    case UCS_ERR_ENDPOINT_TIMEOUT:
    case UCS_ERR_REJECTED:
    case UCS_ERR_NOT_CONNECTED:
    case UCS_ERR_TIMED_OUT:
    case UCS_ERR_IO_ERROR:
    default:
      return absl::UnavailableError(msg);
  }
}

constexpr uint64_t kFullMask = ~uint64_t{0};

using Clock = std::chrono::steady_clock;

// After CancelTags, how long cancelled sends get to be drained by their
// receiver (ucx_discard.h) before their endpoint is retired and force-closed
// as a last resort (with worker addresses, that also breaks the peer's
// transfers to us: UCX pairs the two sides' endpoints into one connection).
constexpr auto kCancelFallback = std::chrono::seconds(8);
// The tag of a discard notice: "drop what I sent you under (tag, mask)".
constexpr uint64_t kDiscardNoticeTag = kReservedTag;
// At shutdown, how long force-closed endpoints get to fail their sends.
constexpr auto kShutdownGrace = std::chrono::seconds(5);
// At shutdown, how long no connection request must have come before the
// listener may go.
constexpr auto kConnectQuiet = std::chrono::milliseconds(50);
// Idle progress calls before the progress thread sleeps in epoll. Each call
// is a syscall (UCX's TCP progress polls its sockets); spinning 1000 of them
// kept the thread busy through a whole transfer on a shaped link, where a
// socket takes a little more every few microseconds, and made the agents
// CPU-bound (about 5 CPU-s per GB written at 1 Gbit/s); 8 halved that. With
// 8 the fault soak used to fail (receives "canceled", endpoints timing out
// after agent restarts); the cause was force-closing endpoints that UCX
// shares with the peer's transfers to us, now gone (ucx_discard.h), and the
// soak and the fault suite pass with 8. RESHARD_UCX_IDLE_SPINS overrides it
// (docs/agent.md).
int IdleSpins() {
  static const int spins = [] {
    const char* v = std::getenv("RESHARD_UCX_IDLE_SPINS");
    return v != nullptr && std::atoi(v) >= 0 ? std::atoi(v) : 8;
  }();
  return spins;
}

class UcxTransportImpl;
struct Endpoint;

// One send or receive in flight; owned by the transport until it completes.
struct Request {
  UcxTransportImpl* transport = nullptr;
  uint64_t tag = 0;
  size_t bytes = 0;
  bool is_send = false;
  std::string peer;             // sends only
  Endpoint* ep = nullptr;       // sends only: the endpoint it went out on
  bool cancelled = false;       // matched a CancelTags
  uint64_t notice[2] = {0, 0};  // a discard notice's payload (tag, mask)
  void* ucx = nullptr;
  TransferDone done;
  bool abandoned = false;  // failed at shutdown; UCX may still call back
  // Inside ucp_tag_*_nbx: UCX may complete the request and call back before
  // the call returns (always so for UCP_OP_ATTR_FLAG_NO_IMM_CMPL).
  bool submitting = false;
  bool completed_early = false;
  absl::Status early_status;
};

// One ucp endpoint to a peer. UCX (1.13) cannot cancel a send request: a
// rendezvous send completes only when the receiver matches it, or when its
// endpoint fails or is force-closed (UCX then completes every request on it
// with an error, after its transport endpoints are discarded, so the buffer
// is no longer read). Cancelled sends are drained by the receiver
// (ucx_discard.h); only those still pending after kCancelFallback get their
// endpoint retired (new sends to the peer get a fresh one) and force-closed.
struct Endpoint {
  UcxTransportImpl* owner = nullptr;
  std::string peer;
  ucp_ep_h ep = nullptr;  // null once closed
  bool failed = false;
  std::string error;
  size_t sends = 0;       // pending sends on it
  size_t live_sends = 0;  // of which not cancelled
  bool retired = false;   // no longer a peer's current endpoint
  // Made from a connection request to our listener: the peer's endpoint to
  // us, over which UCX answers its sends (rendezvous replies). Never sent on.
  bool accepted = false;
  // Set while cancelled sends are pending on it: when they must be gone.
  std::optional<Clock::time_point> cancelled_by;
};

struct Peer {
  std::string address;
  Endpoint* current = nullptr;  // null: create one on the next send
};

class UcxTransportImpl final : public UcxTransport {
 public:
  ~UcxTransportImpl() override { Shutdown(); }

  absl::Status Init(const UcxOptions& options) {
    ucp_config_t* config = nullptr;
    ucs_status_t s = ucp_config_read(nullptr, nullptr, &config);
    if (s != UCS_OK) return FromUcs(s, "ucp_config_read");
    if (!options.net_devices.empty())
      ucp_config_modify(config, "NET_DEVICES", options.net_devices.c_str());
    if (!options.transports.empty()) ucp_config_modify(config, "TLS", options.transports.c_str());
    ucp_params_t params{};
    params.field_mask = UCP_PARAM_FIELD_FEATURES;
    params.features = UCP_FEATURE_TAG | UCP_FEATURE_WAKEUP;
    s = ucp_init(&params, config, &context_);
    ucp_config_release(config);
    if (s != UCS_OK) return FromUcs(s, "ucp_init");
    ucp_worker_params_t wp{};
    wp.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
    wp.thread_mode = UCS_THREAD_MODE_SINGLE;
    s = ucp_worker_create(context_, &wp, &worker_);
    if (s != UCS_OK) return FromUcs(s, "ucp_worker_create");
    if (absl::Status l = Listen(options); !l.ok()) return l;
    s = ucp_worker_get_efd(worker_, &efd_);
    if (s != UCS_OK) return FromUcs(s, "ucp_worker_get_efd");
    epfd_ = epoll_create1(EPOLL_CLOEXEC);
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.fd = efd_;
    epoll_ctl(epfd_, EPOLL_CTL_ADD, efd_, &ev);
    discards_ = std::make_unique<UcxDiscards>(worker_);
    PostNoticeReceive();  // before the thread: no other UCX call yet
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
          promise->set_value(DoConnect(peer_id, address));
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
    auto* r = NewRequest(tag, bytes, std::move(done));
    r->is_send = true;
    r->peer = peer_id;
    if (!Post([this, r, data] { DoSend(r, data); }))
      Fail(r, absl::CancelledError("UCX transport shut down"));
  }

  void Receive(uint64_t tag, void* data, size_t bytes, TransferDone done) override {
    if (tag == kReservedTag) {
      if (done) done(absl::InvalidArgumentError("receive: tag ~0 is reserved by the transport"));
      return;
    }
    auto* r = NewRequest(tag, bytes, std::move(done));
    if (!Post([this, r, data] { DoReceive(r, data); }))
      Fail(r, absl::CancelledError("UCX transport shut down"));
  }

  void CancelTags(uint64_t tag, uint64_t mask) override {
    Post([this, tag, mask] {
      const auto now = Clock::now();
      // Peers may still send us this operation's messages: drop them.
      discards_->Add(tag, mask, now);
      std::vector<Request*> victims;
      for (Request* r : pending_) {
        if ((r->tag & mask) == (tag & mask)) victims.push_back(r);
      }
      std::unordered_set<Endpoint*> notify;
      for (Request* r : victims) {
        if (!r->is_send) {
          ucp_request_cancel(worker_, r->ucx);
          continue;
        }
        // ucp_request_cancel ignores sends: the receiver drops them instead
        // (told by a discard notice), which completes them.
        if (!r->cancelled) {
          r->cancelled = true;
          --r->ep->live_sends;
        }
        if (!r->ep->cancelled_by) r->ep->cancelled_by = now + kCancelFallback;
        cancel_watch_ = true;
        notify.insert(r->ep);
      }
      for (Endpoint* e : notify) SendDiscardNotice(e, tag & mask, mask);
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
    if (worker_ != nullptr) ucp_worker_signal(worker_);
    if (thread_.joinable()) thread_.join();
    if (epfd_ >= 0) close(epfd_);
    epfd_ = -1;
    // The listener goes immediately before the worker, whose destruction
    // closes the connection manager's endpoints. UCX 1.13 (fixed in 1.14,
    // openucx/ucx#8243) lets a TCP connection the listener accepted but whose
    // request has not yet arrived outlive the listener: when the request then
    // arrives, UCX's async thread calls into the freed listener
    // (ucp_cm_server_conn_request_cb). Destroying the listener here, after
    // the progress thread's shutdown grace and not before it, leaves that
    // race a window of microseconds instead of seconds.
    if (listener_ != nullptr) ucp_listener_destroy(listener_);
    listener_ = nullptr;
    if (worker_ != nullptr) ucp_worker_destroy(worker_);
    worker_ = nullptr;
    discards_.reset();  // its scratch buffers, now that UCX is done with them
    for (Request* r : abandoned_) delete r;
    abandoned_.clear();
    if (context_ != nullptr) ucp_cleanup(context_);
    context_ = nullptr;
  }

  size_t pending() const override { return pending_count_.load(); }

 private:
  // The address peers connect to (ucx_address.h): a listener on the IPv4
  // address of our network device when there is one, else the worker's
  // address.
  absl::Status Listen(const UcxOptions& options) {
    const std::optional<in_addr> ip =
        options.listen ? ListenIpFor(options.net_devices) : std::nullopt;
    if (!ip.has_value()) {
      ucp_address_t* addr = nullptr;
      size_t len = 0;
      ucs_status_t s = ucp_worker_get_address(worker_, &addr, &len);
      if (s != UCS_OK) return FromUcs(s, "ucp_worker_get_address");
      address_.assign(reinterpret_cast<const char*>(addr), len);
      ucp_worker_release_address(worker_, addr);
      WarnOfWorkerAddressDefect(options.listen
                                    ? absl::StrCat("no IPv4 address on the network devices \"",
                                                   options.net_devices, "\" to listen on")
                                    : std::string("not listening (UcxOptions::listen is false)"));
      return absl::OkStatus();
    }
    sockaddr_in at{};
    at.sin_family = AF_INET;
    at.sin_addr = *ip;
    ucp_listener_params_t lp{};
    lp.field_mask = UCP_LISTENER_PARAM_FIELD_SOCK_ADDR | UCP_LISTENER_PARAM_FIELD_CONN_HANDLER;
    lp.sockaddr.addr = reinterpret_cast<const sockaddr*>(&at);
    lp.sockaddr.addrlen = sizeof(at);
    lp.conn_handler.cb = &OnConnectionRequest;
    lp.conn_handler.arg = this;
    ucs_status_t s = ucp_listener_create(worker_, &lp, &listener_);
    if (s != UCS_OK) return FromUcs(s, "ucp_listener_create");
    ucp_listener_attr_t la{};
    la.field_mask = UCP_LISTENER_ATTR_FIELD_SOCKADDR;
    s = ucp_listener_query(listener_, &la);
    if (s != UCS_OK) return FromUcs(s, "ucp_listener_query");
    at.sin_port = reinterpret_cast<const sockaddr_in*>(&la.sockaddr)->sin_port;
    address_ = FormatListenerAddress(
        at, std::random_device{}() * uint64_t{0x100000000} + std::random_device{}());
    RESHARD_LOG(INFO) << "UCX: peers connect to " << address_;
    return absl::OkStatus();
  }

  // UCX before 1.14 aborts the process when a peer dies while this worker
  // answers its first worker-address connection request (an assertion on the
  // purged reply, removed by openucx/ucx#8175). A listener avoids it.
  static void WarnOfWorkerAddressDefect(const std::string& why) {
    unsigned major = 0, minor = 0, release = 0;
    ucp_get_version(&major, &minor, &release);
    if (major > 1 || (major == 1 && minor >= 14)) return;
    RESHARD_LOG(WARNING) << "UCX: " << why << ", so peers connect by worker address; UCX " << major
                         << "." << minor << "." << release
                         << " then aborts this agent if a peer dies while answering its first "
                            "connection (docs/agent.md, \"Known UCX defect\")";
  }

  // A peer connects to our listener: its endpoint here answers its sends.
  static void OnConnectionRequest(ucp_conn_request_h request, void* arg) {
    static_cast<UcxTransportImpl*>(arg)->Accept(request);
  }

  void Accept(ucp_conn_request_h request) {
    bool stopping;
    {
      std::lock_guard<std::mutex> l(mu_);
      stopping = stopping_;
    }
    if (stopping) {
      last_conn_request_ = Clock::now();
      ucp_listener_reject(listener_, request);
      return;
    }
    auto e = std::make_unique<Endpoint>();
    e->owner = this;
    e->accepted = true;
    e->peer = "a peer's connection";
    ucp_conn_request_attr_t ca{};
    ca.field_mask = UCP_CONN_REQUEST_ATTR_FIELD_CLIENT_ADDR;
    if (ucp_conn_request_query(request, &ca) == UCS_OK && ca.client_address.ss_family == AF_INET) {
      e->peer = absl::StrCat("a connection from ",
                             IpPort(*reinterpret_cast<const sockaddr_in*>(&ca.client_address)));
    }
    ucp_ep_params_t ep{};
    ep.field_mask = UCP_EP_PARAM_FIELD_CONN_REQUEST | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                    UCP_EP_PARAM_FIELD_ERR_HANDLER;
    ep.conn_request = request;
    ep.err_mode = UCP_ERR_HANDLING_MODE_PEER;
    ep.err_handler.cb = &OnEpError;
    ep.err_handler.arg = e.get();
    ucs_status_t s = ucp_ep_create(worker_, &ep, &e->ep);
    if (s != UCS_OK) {
      RESHARD_LOG(WARNING) << "UCX: cannot accept " << e->peer << ": " << ucs_status_string(s);
      return;
    }
    Endpoint* raw = e.get();
    endpoints_.emplace(raw, std::move(e));
  }

  // Queues `fn` for the progress thread; false once stopping.
  bool Post(std::function<void()> fn) {
    {
      std::lock_guard<std::mutex> l(mu_);
      if (stopping_) return false;
      queue_.push_back(std::move(fn));
      ucp_worker_signal(worker_);  // thread-safe; under mu_ so the worker is alive
    }
    return true;
  }

  Request* NewRequest(uint64_t tag, size_t bytes, TransferDone done) {
    auto* r = new Request;
    r->transport = this;
    r->tag = tag;
    r->bytes = bytes;
    r->done = std::move(done);
    return r;
  }

  static void Fail(Request* r, absl::Status s) {
    auto done = std::move(r->done);
    delete r;
    if (done) done(std::move(s));
  }

  absl::Status DoConnect(const std::string& peer_id, const std::string& address) {
    auto it = peers_.find(peer_id);
    if (it != peers_.end()) {
      Endpoint* current = it->second->current;
      if (it->second->address == address && current != nullptr && !current->failed) {
        return absl::OkStatus();
      }
      // A new incarnation (or a failed endpoint): what is pending on the old
      // endpoint can never complete normally.
      if (current != nullptr) Retire(current);
      peers_.erase(it);
      CloseRetired();
    }
    auto peer = std::make_unique<Peer>();
    peer->address = address;
    absl::StatusOr<Endpoint*> ep = CreateEndpoint(peer_id, peer->address);
    if (!ep.ok() && CloseRetiredOf(peer_id)) {
      // Seen under load: UCX refused a new endpoint (unreachable) while a
      // retired one to the same worker was still closing. Close those now
      // and try once more.
      RESHARD_LOG(WARNING) << "UCX: connecting to \"" << peer_id << "\" failed (" << ep.status()
                           << ") with retired endpoints still open; closed them, trying again";
      ep = CreateEndpoint(peer_id, peer->address);
    }
    if (!ep.ok()) return ep.status();
    peer->current = *ep;
    peers_[peer_id] = std::move(peer);
    return absl::OkStatus();
  }

  absl::StatusOr<Endpoint*> CreateEndpoint(const std::string& peer_id, const std::string& address) {
    auto e = std::make_unique<Endpoint>();
    e->owner = this;
    e->peer = peer_id;
    ucp_ep_params_t ep{};
    ep.field_mask = UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE | UCP_EP_PARAM_FIELD_ERR_HANDLER;
    sockaddr_in at{};
    if (IsListenerAddress(address)) {
      absl::StatusOr<sockaddr_in> parsed = ParseListenerAddress(address);
      if (!parsed.ok()) return parsed.status();
      at = *parsed;
      ep.field_mask |= UCP_EP_PARAM_FIELD_FLAGS | UCP_EP_PARAM_FIELD_SOCK_ADDR;
      ep.flags = UCP_EP_PARAMS_FLAGS_CLIENT_SERVER;
      ep.sockaddr.addr = reinterpret_cast<const sockaddr*>(&at);
      ep.sockaddr.addrlen = sizeof(at);
    } else {
      ep.field_mask |= UCP_EP_PARAM_FIELD_REMOTE_ADDRESS;
      ep.address = reinterpret_cast<const ucp_address_t*>(address.data());
    }
    ep.err_mode = UCP_ERR_HANDLING_MODE_PEER;
    ep.err_handler.cb = &OnEpError;
    ep.err_handler.arg = e.get();
    ucs_status_t s = ucp_ep_create(worker_, &ep, &e->ep);
    if (s != UCS_OK) return FromUcs(s, absl::StrCat("connecting to peer \"", peer_id, "\""));
    Endpoint* raw = e.get();
    endpoints_.emplace(raw, std::move(e));
    return raw;
  }

  static void OnEpError(void* arg, ucp_ep_h ep, ucs_status_t status) {
    auto* e = static_cast<Endpoint*>(arg);
    (void)ep;
    // UCX fails the sends on the endpoint itself.
    e->failed = true;
    e->error = ucs_status_string(status);
    if (e->accepted) {
      // The peer closed or lost its endpoint to us. Our receives are not
      // failed: the peer's death fails our own endpoint to it, and a peer
      // that gave up on one endpoint (CancelTags' last resort) may still be
      // sending to us over a new one.
      e->retired = true;
      e->owner->retired_left_ = true;
      return;
    }
    if (e->retired) return;  // its peer has a newer endpoint
    // A receive is not bound to a peer, so fail the receives too: their data
    // may have been coming from this peer, and a task fails as a whole anyway.
    e->owner->FailReceives(absl::StrCat("peer connection failed: ", e->error));
  }

  // Takes `e` from its peer (new sends get a new endpoint); CloseRetired
  // force-closes it.
  void Retire(Endpoint* e) {
    if (e->retired) return;
    e->retired = true;
    auto it = peers_.find(e->peer);
    if (it != peers_.end() && it->second->current == e) it->second->current = nullptr;
  }

  // Force-closes every retired endpoint of `peer_id` at once and progresses
  // the worker a little; whether there was one.
  bool CloseRetiredOf(const std::string& peer_id) {
    bool any = false;
    for (auto& [e, owned] : endpoints_) {
      if (e->retired && e->peer == peer_id && e->ep != nullptr) {
        ForceClose(e);
        any = true;
      }
    }
    for (int i = 0; any && i < 1000; ++i) ucp_worker_progress(worker_);
    retired_left_ = true;  // CloseRetired frees them once their sends are done
    return any;
  }

  // Force-closes the retired endpoints; frees closed ones that have nothing
  // pending. UCX completes their sends (UCS_ERR_CANCELED) as the worker
  // progresses.
  void CloseRetired() {
    retired_left_ = false;
    for (auto it = endpoints_.begin(); it != endpoints_.end();) {
      Endpoint* e = it->first;
      if (e->retired && e->ep != nullptr) ForceClose(e);
      if (e->retired && e->ep == nullptr && e->sends == 0) {
        it = endpoints_.erase(it);
        continue;
      }
      retired_left_ = retired_left_ || e->retired;
      ++it;
    }
  }

  void ForceClose(Endpoint* e) {
    if (e->ep == nullptr) return;
    ucp_request_param_t p{};
    p.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
    p.flags = UCP_EP_CLOSE_FLAG_FORCE;
    // FORCE completes in place (UCX 1.13 returns no request for it); the
    // endpoint's requests are purged once its lanes are discarded.
    void* req = ucp_ep_close_nbx(e->ep, &p);
    e->ep = nullptr;
    if (UCS_PTR_IS_PTR(req)) {
      while (ucp_request_check_status(req) == UCS_INPROGRESS) ucp_worker_progress(worker_);
      ucp_request_free(req);
    }
  }

  // Tells the peer of `e` to drop what we sent it under (tag, mask).
  void SendDiscardNotice(Endpoint* e, uint64_t tag, uint64_t mask) {
    if (e->ep == nullptr || e->failed) return;
    auto* r = NewRequest(kDiscardNoticeTag, sizeof(Request::notice), nullptr);
    r->is_send = true;
    r->peer = e->peer;
    r->ep = e;
    r->notice[0] = tag;
    r->notice[1] = mask;
    ucp_request_param_t p{};
    p.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
    p.cb.send = &OnSend;
    p.user_data = r;
    r->submitting = true;
    Track(r, ucp_tag_send_nbx(e->ep, r->notice, sizeof(r->notice), r->tag, &p));
  }

  // One receive of discard notices is always posted.
  void PostNoticeReceive() {
    ucp_request_param_t p{};
    p.op_attr_mask =
        UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FLAG_NO_IMM_CMPL;
    p.cb.recv = &OnNotice;
    p.user_data = this;
    notice_done_ = false;
    void* req =
        ucp_tag_recv_nbx(worker_, notice_in_, sizeof(notice_in_), kDiscardNoticeTag, kFullMask, &p);
    notice_req_ = UCS_PTR_IS_PTR(req) ? req : nullptr;
  }

  static void OnNotice(void* /*req*/, ucs_status_t status, const ucp_tag_recv_info_t* info,
                       void* user_data) {
    auto* t = static_cast<UcxTransportImpl*>(user_data);
    t->notice_done_ = true;
    t->notice_ok_ = status == UCS_OK && info->length == sizeof(t->notice_in_);
  }

  // A notice arrived: start draining, and listen for the next one.
  void TakeNotice() {
    if (notice_ok_) discards_->Add(notice_in_[0], notice_in_[1], Clock::now());
    ucp_request_free(notice_req_);
    notice_req_ = nullptr;
    PostNoticeReceive();
  }

  // Last resort for cancelled sends their receiver has not drained in time
  // (it is stuck, or runs without discard notices): force-close the
  // endpoint, which fails them.
  void CheckCancelled() {
    const auto now = Clock::now();
    cancel_watch_ = false;
    for (auto& [e, owned] : endpoints_) {
      if (!e->cancelled_by) continue;
      if (e->sends == e->live_sends) {  // all drained
        e->cancelled_by.reset();
        continue;
      }
      if (now < *e->cancelled_by || e->retired) {
        cancel_watch_ = true;
        continue;
      }
      RESHARD_LOG(WARNING)
          << "UCX: " << e->sends - e->live_sends << " cancelled sends to \"" << e->peer
          << "\" were not drained by the peer within "
          << std::chrono::duration_cast<std::chrono::seconds>(kCancelFallback).count()
          << " s; closing the endpoint";
      Retire(e);
      cancel_watch_ = true;  // until freed
    }
    CloseRetired();
  }

  void FailReceives(const std::string& why) {
    std::vector<Request*> victims;
    for (Request* r : pending_) {
      if (!r->is_send) victims.push_back(r);
    }
    for (Request* r : victims) {
      receive_error_[r] = why;
      ucp_request_cancel(worker_, r->ucx);
    }
  }

  void DoSend(Request* r, const void* data) {
    auto it = peers_.find(r->peer);
    if (it == peers_.end()) {
      return Fail(r, absl::FailedPreconditionError(
                         absl::StrCat("send to unknown peer \"", r->peer, "\"; Connect first")));
    }
    Peer* peer = it->second.get();
    if (peer->current == nullptr) {  // retired by CancelTags
      absl::StatusOr<Endpoint*> e = CreateEndpoint(r->peer, peer->address);
      if (!e.ok()) return Fail(r, absl::UnavailableError(e.status().message()));
      peer->current = *e;
    }
    Endpoint* e = peer->current;
    if (e->failed) {
      return Fail(
          r, absl::UnavailableError(absl::StrCat("peer \"", r->peer, "\" failed: ", e->error)));
    }
    r->ep = e;
    ucp_request_param_t p{};
    p.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
    p.cb.send = &OnSend;
    p.user_data = r;
    r->submitting = true;
    void* req = ucp_tag_send_nbx(e->ep, data, r->bytes, r->tag, &p);
    Track(r, req);
  }

  void DoReceive(Request* r, void* data) {
    ucp_request_param_t p{};
    // No immediate completion: the callback always reports the length (UCX
    // 1.13 leaves recv_info unset on some immediate paths).
    p.op_attr_mask =
        UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FLAG_NO_IMM_CMPL;
    p.cb.recv = &OnReceive;
    p.user_data = r;
    r->submitting = true;
    void* req = ucp_tag_recv_nbx(worker_, data, r->bytes, r->tag, kFullMask, &p);
    Track(r, req);
  }

  void Track(Request* r, void* req) {
    r->submitting = false;
    if (r->completed_early) {
      if (UCS_PTR_IS_PTR(req)) ucp_request_free(req);
      return Complete(r, std::move(r->early_status));
    }
    if (req == nullptr) return Complete(r, absl::OkStatus());
    if (UCS_PTR_IS_ERR(req)) {
      return Complete(r, FromUcs(UCS_PTR_STATUS(req), Describe(r)));
    }
    r->ucx = req;
    pending_.insert(r);
    pending_count_.fetch_add(1);
    if (r->ep != nullptr) {
      ++r->ep->sends;
      ++r->ep->live_sends;
    }
  }

  static std::string Describe(const Request* r) {
    if (r->is_send)
      return absl::StrCat("send of tag ", r->tag, " (", r->bytes, " bytes) to \"", r->peer, "\"");
    return absl::StrCat("receive of tag ", r->tag, " (", r->bytes, " bytes)");
  }

  void Complete(Request* r, absl::Status s) {
    if (r->submitting) {  // called back from inside the nbx call; Track finishes
      r->completed_early = true;
      r->early_status = std::move(s);
      return;
    }
    if (r->abandoned) {
      abandoned_.erase(r);
      ucp_request_free(r->ucx);
      delete r;
      return;
    }
    if (r->ucx != nullptr) {
      pending_.erase(r);
      pending_count_.fetch_sub(1);
      ucp_request_free(r->ucx);
      r->ucx = nullptr;
      if (r->ep != nullptr) {
        --r->ep->sends;
        if (!r->cancelled) --r->ep->live_sends;
      }
    }
    if (r->cancelled && s.ok()) {
      s = absl::CancelledError(absl::StrCat(Describe(r), ": cancelled; the receiver dropped it"));
    }
    auto err = receive_error_.find(r);
    if (err != receive_error_.end()) {
      if (!s.ok()) s = absl::UnavailableError(absl::StrCat(Describe(r), ": ", err->second));
      receive_error_.erase(err);
    }
    Fail(r, std::move(s));
  }

  static void OnSend(void* /*req*/, ucs_status_t status, void* user_data) {
    // Never called from inside ucp_tag_send_nbx, so Track has run.
    auto* r = static_cast<Request*>(user_data);
    r->transport->Complete(r, FromUcs(status, Describe(r)));
  }

  static void OnReceive(void* /*req*/, ucs_status_t status, const ucp_tag_recv_info_t* info,
                        void* user_data) {
    auto* r = static_cast<Request*>(user_data);
    absl::Status s = FromUcs(status, Describe(r));
    if (s.ok() && info->length != r->bytes) {
      s = absl::InvalidArgumentError(absl::StrCat(Describe(r), ": got ", info->length, " bytes"));
    }
    r->transport->Complete(r, std::move(s));
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
      if (retired_left_) CloseRetired();
      if (cancel_watch_) CheckCancelled();
      bool busy = ucp_worker_progress(worker_) != 0;
      if (notice_done_) {
        TakeNotice();
        busy = true;
      }
      if (discards_->active() && discards_->Progress(Clock::now())) busy = true;
      if (busy || !work.empty()) {
        idle = 0;
        continue;
      }
      if (++idle < IdleSpins()) continue;
      // Nothing happening: sleep until UCX or Post wakes the worker.
      ucs_status_t s = ucp_worker_arm(worker_);
      if (s == UCS_ERR_BUSY) continue;
      epoll_event ev;
      epoll_wait(epfd_, &ev, 1, 100);
      idle = 0;
    }
    // Stopping: cancel the receives, force-close every endpoint (which fails
    // its sends: UCX cannot cancel them, and a flush would wait for
    // receivers that may never match), and progress until UCX has completed
    // them, so no request is left on an endpoint the worker destroys.
    std::vector<Request*> victims(pending_.begin(), pending_.end());
    for (Request* r : victims) {
      if (!r->is_send) ucp_request_cancel(worker_, r->ucx);
    }
    if (notice_req_ != nullptr) ucp_request_cancel(worker_, notice_req_);
    // The listener stays until Shutdown destroys the worker: connection
    // requests that arrive meanwhile are rejected (Accept).
    for (auto& [e, owned] : endpoints_) ForceClose(e);
    peers_.clear();
    // Progress until every request has completed and no connection request
    // has come for kConnectQuiet (each is rejected as it comes): a peer that
    // connected just before the stop gets its answer now, while the listener
    // lives (see Shutdown on why that matters with UCX 1.13).
    const auto deadline = Clock::now() + kShutdownGrace;
    last_conn_request_ = Clock::now();
    while ((!pending_.empty() || Clock::now() - last_conn_request_ < kConnectQuiet) &&
           Clock::now() < deadline) {
      ucp_worker_progress(worker_);
    }
    if (!pending_.empty()) {
      RESHARD_LOG(WARNING) << "UCX transport: " << pending_.size()
                           << " transfers still pending at shutdown";
    }
    // Anything still pending fails here; its UCX request is left to the
    // worker's destruction.
    victims.assign(pending_.begin(), pending_.end());
    for (Request* r : victims) {
      pending_.erase(r);
      pending_count_.fetch_sub(1);
      auto done = std::move(r->done);
      r->abandoned = true;
      abandoned_.insert(r);
      if (done) done(absl::CancelledError(absl::StrCat(Describe(r), ": transport shut down")));
    }
  }

  ucp_context_h context_ = nullptr;
  ucp_worker_h worker_ = nullptr;
  ucp_listener_h listener_ = nullptr;  // null: peers connect by worker address
  int efd_ = -1;
  int epfd_ = -1;
  std::string address_;
  std::thread thread_;

  std::mutex mu_;
  bool stopping_ = false;
  std::deque<std::function<void()>> queue_;

  // Progress thread only.
  std::unordered_map<std::string, std::unique_ptr<Peer>> peers_;
  std::unordered_map<Endpoint*, std::unique_ptr<Endpoint>> endpoints_;
  bool retired_left_ = false;  // some endpoint is retired but not yet freed
  Clock::time_point last_conn_request_{};  // the last one rejected while stopping
  bool cancel_watch_ = false;  // some endpoint has cancelled sends pending
  std::unique_ptr<UcxDiscards> discards_;
  uint64_t notice_in_[2] = {0, 0};  // the discard notice being received
  void* notice_req_ = nullptr;
  bool notice_done_ = false;
  bool notice_ok_ = false;
  std::unordered_set<Request*> pending_;
  std::unordered_map<Request*, std::string> receive_error_;
  std::unordered_set<Request*> abandoned_;
  std::atomic<size_t> pending_count_{0};
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
