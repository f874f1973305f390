// The change feed (docs/coordinator.md, "Change feed"): one replica's
// in-memory fan-out of job and operation changes to its watch streams.
//
// Every committed change to a job or an operation takes a new version and is
// announced to every replica (migrations/0016: triggers, NOTIFY
// reshard_changes; PgListener). The feed keeps, for each watched key, the
// state last read and the streams that watch it. An announcement re-reads
// that key ONCE, however many streams watch it, and hands the new state to
// each of them; nothing is read while nothing changes. A stream that
// subscribes with `from_version` gets the first state whose version exceeds
// it (a reconnect to any replica misses nothing: versions of one key grow in
// commit order). A lost announcement is caught by Resync (the safety poll:
// one version query for all watched keys).
//
// States, not diffs: a stream is handed each state the feed reads; changes
// committed closer together than a read are seen as one (the later state),
// as a Kubernetes informer sees them.
//
// Thread-safe. Reads run on the feed's own worker threads, never on the
// caller's; subscribers are called on those threads (or in Subscribe) with
// the feed's lock held.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "reshard/v1/coordinator.pb.h"

namespace reshard::coordinator {

class Store;

/// A watch stream as the feed sees it.
template <typename Msg>
class FeedSubscriber {
 public:
  virtual ~FeedSubscriber() = default;
  /// A state of the key newer than any handed before (and than the
  /// subscription's from_version). Called with the feed's lock held: must
  /// be quick, must not block and must not call the feed.
  virtual void OnState(std::shared_ptr<const Msg> state) = 0;
  /// The last call: the key is gone (NotFound) or the feed shuts down
  /// (Unavailable). The subscription is removed already. Same rules.
  virtual void OnEnd(const absl::Status& status) = 0;
};

/// Runs closures on a few threads, in order of arrival. Shutdown() runs
/// what is queued and joins; a closure posted after it runs at once, on the
/// caller's thread.
class FeedWorkers {
 public:
  explicit FeedWorkers(int threads);
  ~FeedWorkers();  // Shutdown()
  void Post(std::function<void()> work);
  void Shutdown();

 private:
  void Run();
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> queue_;
  bool stopping_ = false;
  std::vector<std::thread> threads_;
};

/// The feed of one kind of key (jobs, or operations).
template <typename Msg>
class KeyFeed {
 public:
  using Reader = std::function<absl::StatusOr<Msg>(const std::string& key)>;

  KeyFeed(Reader reader, FeedWorkers* workers) : reader_(std::move(reader)), workers_(workers) {}

  /// `subscriber` watches `key` from `from_version` on: it is handed the
  /// key's state at once if one newer than that is known, else when read.
  void Subscribe(const std::string& key, int64_t from_version, FeedSubscriber<Msg>* subscriber);
  /// After it returns `subscriber` is called no more. Idempotent.
  void Unsubscribe(const std::string& key, FeedSubscriber<Msg>* subscriber);
  /// `key` may have changed: re-read it once if anybody watches it (a read
  /// under way is followed by one more).
  void Changed(const std::string& key);
  /// Every watched key may have changed (the listener reconnected).
  void ChangedAll();
  /// The watched keys with the version last read (0: not read yet).
  std::map<std::string, int64_t> Watched() const;
  /// Ends every subscription with `status` (OnEnd); later subscriptions too.
  void EndAll(const absl::Status& status);

  int64_t subscribers() const;
  /// Store reads done so far (each served every subscriber of its key).
  int64_t reads() const;

 private:
  struct Entry {
    std::shared_ptr<const Msg> state;                       // null until read
    std::map<FeedSubscriber<Msg>*, int64_t> subscribers;   // -> version last handed
    bool reading = false;
    bool again = false;
  };
  void ReadLocked(const std::string& key, Entry& entry);
  void Read(const std::string& key);
  static void Hand(Entry& entry);

  const Reader reader_;
  FeedWorkers* const workers_;
  mutable std::mutex mu_;
  std::map<std::string, Entry> entries_;  // only watched keys
  absl::Status ended_;                    // not OK after EndAll
  int64_t subscribers_ = 0;
  int64_t reads_ = 0;
};

/// One replica's feed of jobs and operations, fed by PgListener's
/// notifications on kChangesChannel.
class ChangeFeed {
 public:
  struct Options {
    /// Called (on the listener's thread; quick) for each new operation
    /// announced (`n:<id>`, migrations/0017): the leader plans it at once.
    std::function<void(const std::string& operation_id)> on_operation_created;
    int workers = 2;  // threads reading changed keys
    /// The safety poll's period (Resync on a thread of its own); 0: none
    /// (a caller runs Resync itself).
    int resync_ms = 1000;
  };
  explicit ChangeFeed(std::shared_ptr<Store> store) : ChangeFeed(std::move(store), Options{}) {}
  ChangeFeed(std::shared_ptr<Store> store, Options options);
  ~ChangeFeed();  // Shutdown()

  KeyFeed<v1::Job>& jobs() { return jobs_; }
  KeyFeed<v1::Operation>& operations() { return operations_; }

  /// A notification's payload: `j:<job id>`, `o:<operation id>` or
  /// `n:<operation id>` (a new one); any other is ignored (and logged).
  void Announced(const std::string& payload);
  /// The listener (re)connected: what was announced meanwhile is lost, so
  /// every watched key is re-read.
  void Reconnected();
  /// The safety poll: asks the store for the versions of every watched key
  /// and re-reads those that moved or vanished. One query per kind.
  absl::Status Resync();
  /// Ends every stream (Unavailable) and stops the workers and the safety
  /// poll. Idempotent.
  void Shutdown();
  /// Runs `work` on the feed's workers (a watch stream's admission, which
  /// may read the store, must not hold one of gRPC's threads).
  void Post(std::function<void()> work) { workers_.Post(std::move(work)); }

  int64_t announcements() const { return announcements_.load(); }

 private:
  void ResyncLoop(int period_ms);

  std::shared_ptr<Store> store_;
  const std::function<void(const std::string&)> on_operation_created_;
  FeedWorkers workers_;
  KeyFeed<v1::Job> jobs_;
  KeyFeed<v1::Operation> operations_;
  std::atomic<int64_t> announcements_{0};
  std::mutex stop_mu_;
  std::condition_variable stop_cv_;
  bool stopping_ = false;
  std::thread resync_thread_;
};

}  // namespace reshard::coordinator
