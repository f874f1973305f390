#include "services/coordinator/logic/change_feed.h"

#include <chrono>

#include "absl/strings/match.h"
#include "common/log.h"
#include "services/coordinator/store/store.h"

namespace reshard::coordinator {

FeedWorkers::FeedWorkers(int threads) {
  for (int i = 0; i < std::max(threads, 1); ++i) threads_.emplace_back([this] { Run(); });
}

FeedWorkers::~FeedWorkers() { Shutdown(); }

void FeedWorkers::Post(std::function<void()> work) {
  {
    std::lock_guard<std::mutex> l(mu_);
    if (!stopping_) {
      queue_.push_back(std::move(work));
      cv_.notify_one();
      return;
    }
  }
  work();
}

void FeedWorkers::Shutdown() {
  {
    std::lock_guard<std::mutex> l(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  for (std::thread& t : threads_) {
    if (t.joinable()) t.join();
  }
}

void FeedWorkers::Run() {
  for (;;) {
    std::function<void()> work;
    {
      std::unique_lock<std::mutex> l(mu_);
      cv_.wait(l, [this] { return stopping_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stopping, and everything queued has run
      work = std::move(queue_.front());
      queue_.pop_front();
    }
    work();
  }
}

template <typename Msg>
void KeyFeed<Msg>::Subscribe(const std::string& key, int64_t from_version,
                             FeedSubscriber<Msg>* subscriber) {
  std::lock_guard<std::mutex> l(mu_);
  if (!ended_.ok()) {
    subscriber->OnEnd(ended_);
    return;
  }
  Entry& entry = entries_[key];
  if (entry.subscribers.emplace(subscriber, from_version).second) ++subscribers_;
  if (entry.state != nullptr) {
    Hand(entry);
  } else if (!entry.reading) {
    ReadLocked(key, entry);  // the first subscriber; later ones join its read
  }
}

template <typename Msg>
void KeyFeed<Msg>::Unsubscribe(const std::string& key, FeedSubscriber<Msg>* subscriber) {
  std::lock_guard<std::mutex> l(mu_);
  auto it = entries_.find(key);
  if (it == entries_.end()) return;
  if (it->second.subscribers.erase(subscriber) > 0) --subscribers_;
  // An unwatched key's state would go stale (nothing re-reads it): drop it,
  // unless a read is under way (Read drops it then).
  if (it->second.subscribers.empty() && !it->second.reading) entries_.erase(it);
}

template <typename Msg>
void KeyFeed<Msg>::Changed(const std::string& key) {
  std::lock_guard<std::mutex> l(mu_);
  auto it = entries_.find(key);
  if (it != entries_.end()) ReadLocked(key, it->second);
}

template <typename Msg>
void KeyFeed<Msg>::ChangedAll() {
  std::lock_guard<std::mutex> l(mu_);
  for (auto& [key, entry] : entries_) ReadLocked(key, entry);
}

template <typename Msg>
std::map<std::string, int64_t> KeyFeed<Msg>::Watched() const {
  std::lock_guard<std::mutex> l(mu_);
  std::map<std::string, int64_t> watched;
  for (const auto& [key, entry] : entries_) {
    watched.emplace(key, entry.state == nullptr ? 0 : entry.state->version());
  }
  return watched;
}

template <typename Msg>
void KeyFeed<Msg>::EndAll(const absl::Status& status) {
  std::lock_guard<std::mutex> l(mu_);
  ended_ = status;
  for (auto& [key, entry] : entries_) {
    for (auto& [subscriber, version] : entry.subscribers) subscriber->OnEnd(status);
  }
  entries_.clear();
  subscribers_ = 0;
}

template <typename Msg>
int64_t KeyFeed<Msg>::subscribers() const {
  std::lock_guard<std::mutex> l(mu_);
  return subscribers_;
}

template <typename Msg>
int64_t KeyFeed<Msg>::reads() const {
  std::lock_guard<std::mutex> l(mu_);
  return reads_;
}

template <typename Msg>
void KeyFeed<Msg>::ReadLocked(const std::string& key, Entry& entry) {
  if (entry.reading) {
    entry.again = true;  // what changed during the read may be missing from it
    return;
  }
  entry.reading = true;
  workers_->Post([this, key] { Read(key); });
}

template <typename Msg>
void KeyFeed<Msg>::Read(const std::string& key) {
  absl::StatusOr<Msg> read = reader_(key);  // without the lock: the store is slow
  std::lock_guard<std::mutex> l(mu_);
  ++reads_;
  auto it = entries_.find(key);
  if (it == entries_.end()) return;  // ended meanwhile
  Entry& entry = it->second;
  entry.reading = false;
  if (absl::IsNotFound(read.status())) {
    // Deleted: its streams end with the store's own NotFound.
    for (auto& [subscriber, version] : entry.subscribers) subscriber->OnEnd(read.status());
    subscribers_ -= static_cast<int64_t>(entry.subscribers.size());
    entries_.erase(it);
    return;
  }
  if (!read.ok()) {
    // PostgreSQL is away: the streams wait; the next announcement or
    // safety poll reads again.
    RESHARD_LOG(WARNING) << "change feed: reading \"" << key << "\": " << read.status();
  } else if (entry.state == nullptr || read->version() > entry.state->version()) {
    entry.state = std::make_shared<const Msg>(*std::move(read));
    Hand(entry);
  }
  if (entry.subscribers.empty()) {
    entries_.erase(it);
  } else if (entry.again) {
    entry.again = false;
    ReadLocked(key, entry);
  }
}

template <typename Msg>
void KeyFeed<Msg>::Hand(Entry& entry) {
  const int64_t version = entry.state->version();
  for (auto& [subscriber, last] : entry.subscribers) {
    if (version <= last) continue;
    last = version;
    subscriber->OnState(entry.state);
  }
}

template class KeyFeed<v1::Job>;
template class KeyFeed<v1::Operation>;

ChangeFeed::ChangeFeed(std::shared_ptr<Store> store, Options options)
    : store_(std::move(store)),
      on_operation_created_(std::move(options.on_operation_created)),
      workers_(options.workers),
      jobs_(
          [this](const std::string& id) {
            return store_->GetJob(id, /*include_ptc=*/false);
          },
          &workers_),
      operations_(
          [this](const std::string& id) -> absl::StatusOr<v1::Operation> {
            absl::StatusOr<OperationRecord> record = store_->GetOperation(id, /*include_plan=*/false);
            if (!record.ok()) return record.status();
            return std::move(record->op);
          },
          &workers_) {
  if (options.resync_ms > 0) {
    resync_thread_ = std::thread([this, period = options.resync_ms] { ResyncLoop(period); });
  }
}

ChangeFeed::~ChangeFeed() { Shutdown(); }

void ChangeFeed::ResyncLoop(int period_ms) {
  std::unique_lock<std::mutex> l(stop_mu_);
  while (!stop_cv_.wait_for(l, std::chrono::milliseconds(period_ms), [this] { return stopping_; })) {
    l.unlock();
    if (absl::Status s = Resync(); !s.ok()) {
      RESHARD_LOG(WARNING) << "change feed: safety poll: " << s;
    }
    l.lock();
  }
}

void ChangeFeed::Announced(const std::string& payload) {
  ++announcements_;
  if (absl::StartsWith(payload, "j:")) {
    jobs_.Changed(payload.substr(2));
  } else if (absl::StartsWith(payload, "o:")) {
    operations_.Changed(payload.substr(2));
  } else if (absl::StartsWith(payload, "n:")) {
    if (on_operation_created_) on_operation_created_(payload.substr(2));
  } else {
    RESHARD_LOG(WARNING) << "change feed: ignoring announcement \"" << payload << "\"";
  }
}

void ChangeFeed::Reconnected() {
  jobs_.ChangedAll();
  operations_.ChangedAll();
}

namespace {

// The keys of `feed` whose stored version differs from the one last read
// (or that are gone): re-read them.
template <typename Msg, typename VersionsFn>
absl::Status ResyncKind(KeyFeed<Msg>& feed, const VersionsFn& versions_of) {
  const std::map<std::string, int64_t> watched = feed.Watched();
  if (watched.empty()) return absl::OkStatus();
  std::vector<std::string> keys;
  keys.reserve(watched.size());
  for (const auto& [key, version] : watched) keys.push_back(key);
  absl::StatusOr<std::map<std::string, int64_t>> stored = versions_of(keys);
  if (!stored.ok()) return stored.status();
  for (const auto& [key, version] : watched) {
    auto it = stored->find(key);
    if (it == stored->end() || it->second != version) feed.Changed(key);
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status ChangeFeed::Resync() {
  if (absl::Status s = ResyncKind(jobs_, [&](const std::vector<std::string>& ids) {
        return store_->JobVersions(ids);
      });
      !s.ok()) {
    return s;
  }
  return ResyncKind(operations_, [&](const std::vector<std::string>& ids) {
    return store_->OperationVersions(ids);
  });
}

void ChangeFeed::Shutdown() {
  {
    std::lock_guard<std::mutex> l(stop_mu_);
    stopping_ = true;
  }
  stop_cv_.notify_all();
  if (resync_thread_.joinable()) resync_thread_.join();
  const absl::Status ending = absl::UnavailableError("the coordinator replica is shutting down");
  jobs_.EndAll(ending);
  operations_.EndAll(ending);
  workers_.Shutdown();
}

}  // namespace reshard::coordinator
