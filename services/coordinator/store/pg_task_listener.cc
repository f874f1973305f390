#include "services/coordinator/store/pg_task_listener.h"

#include <algorithm>
#include <chrono>
#include <exception>
#include <memory>
#include <pqxx/pqxx>
#include <utility>

#include "common/log.h"
#include "services/coordinator/store/pg_pool.h"
#include "services/coordinator/store/pg_store.h"

namespace reshard::coordinator {
namespace {

class Receiver : public pqxx::notification_receiver {
 public:
  Receiver(pqxx::connection_base& conn, const std::function<void(const std::string&)>& on_host)
      : pqxx::notification_receiver(conn, kTasksChannel), on_host_(on_host) {}
  void operator()(const std::string& payload, int /*backend_pid*/) override {
    if (on_host_) on_host_(payload);
  }

 private:
  const std::function<void(const std::string&)>& on_host_;
};

}  // namespace

PgTaskListener::PgTaskListener(PgTaskListenerOptions options,
                               std::function<void(const std::string&)> on_host,
                               std::function<void()> on_connected)
    : options_(std::move(options)),
      on_host_(std::move(on_host)),
      on_connected_(std::move(on_connected)) {}

PgTaskListener::~PgTaskListener() { Stop(); }

void PgTaskListener::Start() { thread_ = std::thread([this] { Loop(); }); }

void PgTaskListener::Stop() {
  {
    std::lock_guard<std::mutex> l(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

bool PgTaskListener::Backoff(int ms) {
  std::unique_lock<std::mutex> l(mu_);
  return !cv_.wait_for(l, std::chrono::milliseconds(ms), [this] { return stopping_.load(); });
}

void PgTaskListener::Loop() {
  const std::string dsn = pg::WithConnectTimeout(options_.dsn, options_.connect_timeout_s);
  int backoff_ms = options_.min_backoff_ms;
  const long stop_check_us = static_cast<long>(options_.stop_check_ms) * 1000;
  while (!stopping_.load()) {
    try {
      pqxx::connection conn(dsn);
      Receiver receiver(conn, on_host_);  // LISTEN, on the server by now
      conn.get_notifs();                  // the LISTEN's round trip is done
      ++connections_;
      if (on_connected_) on_connected_();
      backoff_ms = options_.min_backoff_ms;
      while (!stopping_.load()) {
        conn.await_notification(stop_check_us / 1000000, stop_check_us % 1000000);
      }
      return;
    } catch (const std::exception& e) {
      RESHARD_LOG(WARNING) << "task listener on channel " << kTasksChannel << ": " << e.what()
                           << "; reconnecting in " << backoff_ms << " ms";
    }
    if (!Backoff(backoff_ms)) return;
    backoff_ms = std::min(backoff_ms * 2, options_.max_backoff_ms);
  }
}

}  // namespace reshard::coordinator
