// The change feed in a logic test: a ChangeFeed on the test's store, fed by
// a real PgListener on its database, and a subscriber that records what a
// watch stream would have written (change_feed_test, stop-free watches).
#pragma once

#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include <pqxx/pqxx>

#include "gtest/gtest.h"
#include "services/coordinator/logic/change_feed.h"
#include "services/coordinator/store/pg_listener.h"
#include "services/coordinator/store/pg_store.h"
#include "tests/coordinator/harness/eventually.h"

namespace reshard::coordinator::testing {

/// What a watch stream would have written.
template <typename Msg>
class Recorder : public FeedSubscriber<Msg> {
 public:
  void OnState(std::shared_ptr<const Msg> state) override {
    std::lock_guard<std::mutex> l(mu_);
    states_.push_back(*state);
  }
  void OnEnd(const absl::Status& status) override {
    std::lock_guard<std::mutex> l(mu_);
    end_ = status;
    ended_ = true;
  }
  std::vector<Msg> states() const {
    std::lock_guard<std::mutex> l(mu_);
    return states_;
  }
  size_t count() const { return states().size(); }
  /// The newest state handed (a default message before the first).
  Msg last() const {
    std::lock_guard<std::mutex> l(mu_);
    return states_.empty() ? Msg() : states_.back();
  }
  bool ended() const {
    std::lock_guard<std::mutex> l(mu_);
    return ended_;
  }
  absl::Status end() const {
    std::lock_guard<std::mutex> l(mu_);
    return end_;
  }

 private:
  mutable std::mutex mu_;
  std::vector<Msg> states_;
  absl::Status end_;
  bool ended_ = false;
};

/// Kills (pg_terminate_backend) every LISTEN connection to this test's
/// database, as a network fault would; returns how many it killed.
inline size_t TerminateListeners(const std::string& dsn) {
  pqxx::connection admin(dsn);
  pqxx::work tx(admin);
  const pqxx::result killed = tx.exec(
      "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = "
      "current_database() AND query LIKE 'LISTEN %' AND pid <> pg_backend_pid()");
  tx.commit();
  return killed.size();
}

/// A feed without its own safety poll (a test calls Resync), fed by a real
/// listener unless `listen` is false (every notification lost).
struct TestFeed {
  void Start(const std::string& dsn, std::shared_ptr<Store> store, bool listen = true) {
    ChangeFeed::Options options;
    options.resync_ms = 0;
    options.on_operation_created = [this](const std::string& id) {
      std::lock_guard<std::mutex> l(mu);
      created.push_back(id);
    };
    feed = std::make_unique<ChangeFeed>(std::move(store), options);
    if (!listen) return;
    PgListenerOptions listener_options;
    listener_options.dsn = dsn;
    listener_options.channels = {kChangesChannel};
    listener_options.min_backoff_ms = 10;
    ChangeFeed* f = feed.get();
    listener = std::make_unique<PgListener>(
        listener_options,
        [f](const std::string&, const std::string& payload) { f->Announced(payload); },
        [f] { f->Reconnected(); });
    listener->Start();
    ASSERT_TRUE(Eventually([&] { return listener->connections() == 1; }));
  }
  void Stop() {
    if (listener != nullptr) listener->Stop();
    if (feed != nullptr) feed->Shutdown();
  }
  ~TestFeed() { Stop(); }

  /// Operations announced as new (on_operation_created), in order.
  std::vector<std::string> Created() {
    std::lock_guard<std::mutex> l(mu);
    return created;
  }

  std::unique_ptr<ChangeFeed> feed;
  std::unique_ptr<PgListener> listener;
  std::mutex mu;
  std::vector<std::string> created;
};

}  // namespace reshard::coordinator::testing
