#include "agent/transfer/ucx_worker.h"

#include <sys/epoll.h>
#include <unistd.h>

#include <cstdlib>

#include "absl/strings/str_cat.h"

namespace reshard::agent {

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

// Each idle progress call is a syscall (UCX's TCP progress polls its
// sockets); spinning 1000 of them kept the thread busy through a whole
// transfer on a shaped link, where a socket takes a little more every few
// microseconds, and made the agents CPU-bound (about 5 CPU-s per GB written
// at 1 Gbit/s); 8 halved that. With 8 the fault soak used to fail (receives
// "canceled", endpoints timing out after agent restarts); the cause was
// force-closing endpoints that UCX shares with the peer's transfers to us, now
// gone (ucx_discard.h), and the soak and the fault suite pass with 8
// (docs/agent.md).
int ParseIdleSpins(const char* value) {
  return value != nullptr && std::atoi(value) >= 0 ? std::atoi(value) : 8;
}

int IdleSpins() {
  static const int spins = ParseIdleSpins(std::getenv("RESHARD_UCX_IDLE_SPINS"));
  return spins;
}

UcxWorker::~UcxWorker() {
  CloseSleep();
  DestroyWorker();
  Cleanup();
}

absl::Status UcxWorker::Init(const UcxOptions& options) {
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
  return absl::OkStatus();
}

absl::Status UcxWorker::EnableSleep() {
  ucs_status_t s = ucp_worker_get_efd(worker_, &efd_);
  if (s != UCS_OK) return FromUcs(s, "ucp_worker_get_efd");
  epfd_ = epoll_create1(EPOLL_CLOEXEC);
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.fd = efd_;
  epoll_ctl(epfd_, EPOLL_CTL_ADD, efd_, &ev);
  return absl::OkStatus();
}

bool UcxWorker::Sleep(int timeout_ms) {
  if (ucp_worker_arm(worker_) == UCS_ERR_BUSY) return false;
  epoll_event ev;
  epoll_wait(epfd_, &ev, 1, timeout_ms);
  return true;
}

void UcxWorker::CloseSleep() {
  if (epfd_ >= 0) close(epfd_);
  epfd_ = -1;
}

void UcxWorker::DestroyWorker() {
  if (worker_ != nullptr) ucp_worker_destroy(worker_);
  worker_ = nullptr;
}

void UcxWorker::Cleanup() {
  if (context_ != nullptr) ucp_cleanup(context_);
  context_ = nullptr;
}

}  // namespace reshard::agent
