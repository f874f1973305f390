#include "services/coordinator/store/pg_listener.h"

#include <algorithm>
#include <chrono>
#include <exception>
#include <memory>
#include <pqxx/pqxx>
#include <utility>

#include "absl/strings/str_join.h"
#include "common/log.h"
#include "services/coordinator/store/pg_pool.h"
#include "services/coordinator/store/pg_store.h"

namespace reshard::coordinator {
namespace {

class Receiver : public pqxx::notification_receiver {
 public:
  Receiver(pqxx::connection_base& conn, const std::string& channel,
           const PgListener::OnNotification& on_notification)
      : pqxx::notification_receiver(conn, channel), on_notification_(on_notification) {}
  void operator()(const std::string& payload, int /*backend_pid*/) override {
    if (on_notification_) on_notification_(channel(), payload);
  }

 private:
  const PgListener::OnNotification& on_notification_;
};

}  // namespace

PgListener::PgListener(PgListenerOptions options, OnNotification on_notification,
                       std::function<void()> on_connected)
    : options_(std::move(options)),
      on_notification_(std::move(on_notification)),
      on_connected_(std::move(on_connected)) {}

PgListener::~PgListener() { Stop(); }

void PgListener::Start() { thread_ = std::thread([this] { Loop(); }); }

void PgListener::Stop() {
  {
    std::lock_guard<std::mutex> l(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

bool PgListener::Backoff(int ms) {
  std::unique_lock<std::mutex> l(mu_);
  return !cv_.wait_for(l, std::chrono::milliseconds(ms), [this] { return stopping_.load(); });
}

void PgListener::Loop() {
  const std::string dsn = pg::WithConnectTimeout(options_.dsn, options_.connect_timeout_s);
  int backoff_ms = options_.min_backoff_ms;
  const long stop_check_us = static_cast<long>(options_.stop_check_ms) * 1000;
  while (!stopping_.load()) {
    try {
      pqxx::connection conn(dsn);
      std::vector<std::unique_ptr<Receiver>> receivers;  // LISTEN each, on the server by now
      for (const std::string& channel : options_.channels) {
        receivers.push_back(std::make_unique<Receiver>(conn, channel, on_notification_));
      }
      conn.get_notifs();  // the LISTENs' round trips are done
      ++connections_;
      if (on_connected_) on_connected_();
      backoff_ms = options_.min_backoff_ms;
      while (!stopping_.load()) {
        conn.await_notification(stop_check_us / 1000000, stop_check_us % 1000000);
      }
      return;
    } catch (const std::exception& e) {
      RESHARD_LOG(WARNING) << "listener on channels " << absl::StrJoin(options_.channels, ", ")
                           << ": " << e.what()
                           << "; reconnecting in " << backoff_ms << " ms";
    }
    if (!Backoff(backoff_ms)) return;
    backoff_ms = std::min(backoff_ms * 2, options_.max_backoff_ms);
  }
}

}  // namespace reshard::coordinator
