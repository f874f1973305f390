// One WatchJob or WatchOperation stream on gRPC's callback API: a
// subscriber of the change feed (logic/change_feed.h) that holds no thread.
// The feed hands it states; it writes the latest one as soon as the write
// before it is done (a slow reader sees fewer, later states, never a stale
// one after a newer). It ends with OK after writing a final state (`Final`),
// with the feed's status when the key goes (NotFound) or the replica shuts
// down, and with CANCELLED when the client goes. Its watch slot
// (stream_limits.h) is held until gRPC is done with it.
// Lifetime: created by the handler, deletes itself in OnDone (gRPC's rule).
#pragma once

#include <memory>
#include <mutex>
#include <string>
#include <utility>

#include "grpcpp/grpcpp.h"
#include "services/coordinator/logic/change_feed.h"
#include "services/coordinator/server/rpc_status.h"
#include "services/coordinator/server/stream_limits.h"

namespace reshard::coordinator {

template <typename Msg>
class WatchReactor final : public grpc::ServerWriteReactor<Msg>, public FeedSubscriber<Msg> {
 public:
  using Final = bool (*)(const Msg&);

  /// A stream refused before it starts (its status).
  static WatchReactor* Refused(const absl::Status& status) {
    auto* reactor = new WatchReactor(nullptr, "", WatchSlot(), nullptr);
    reactor->Finish(ToGrpcStatus(status));
    return reactor;
  }

  /// Subscribes to `key` of `feed` from `from_version` on.
  static WatchReactor* Start(KeyFeed<Msg>* feed, std::string key, int64_t from_version,
                             WatchSlot slot, Final final) {
    auto* reactor = new WatchReactor(feed, std::move(key), std::move(slot), final);
    feed->Subscribe(reactor->key_, from_version, reactor);
    return reactor;
  }

  // FeedSubscriber (feed's lock held: quick, no feed calls).
  void OnState(std::shared_ptr<const Msg> state) override {
    std::lock_guard<std::mutex> l(mu_);
    if (finished_) return;
    pending_ = std::move(state);
    if (!writing_) WriteLocked();
  }
  void OnEnd(const absl::Status& status) override {
    std::lock_guard<std::mutex> l(mu_);
    subscribed_ = false;  // the feed dropped us already
    end_ = ToGrpcStatus(status);
    if (!writing_) FinishLocked(end_);
  }

  // ServerWriteReactor.
  void OnWriteDone(bool ok) override {
    std::lock_guard<std::mutex> l(mu_);
    writing_ = false;
    if (!ok) {
      FinishLocked(grpc::Status(grpc::StatusCode::CANCELLED, "the watch stream closed"));
      return;
    }
    if (final_ != nullptr && final_(*in_flight_)) {
      FinishLocked(grpc::Status::OK);
      return;
    }
    if (pending_ != nullptr) {
      WriteLocked();
    } else if (!end_.ok()) {
      FinishLocked(end_);
    }
  }
  void OnCancel() override {
    std::lock_guard<std::mutex> l(mu_);
    FinishLocked(grpc::Status(grpc::StatusCode::CANCELLED, "the client cancelled the watch"));
  }
  void OnDone() override {
    bool subscribed;
    {
      std::lock_guard<std::mutex> l(mu_);
      subscribed = subscribed_;
    }
    // Without our lock: the feed calls us under its own.
    if (subscribed && feed_ != nullptr) feed_->Unsubscribe(key_, this);
    delete this;
  }

 private:
  WatchReactor(KeyFeed<Msg>* feed, std::string key, WatchSlot slot, Final final)
      : feed_(feed), key_(std::move(key)), slot_(std::move(slot)), final_(final),
        subscribed_(feed != nullptr) {}

  void WriteLocked() {
    in_flight_ = std::move(pending_);
    pending_ = nullptr;
    writing_ = true;
    this->StartWrite(in_flight_.get());
  }
  void FinishLocked(const grpc::Status& status) {
    if (finished_) return;
    finished_ = true;
    this->Finish(status);
  }

  KeyFeed<Msg>* const feed_;
  const std::string key_;
  WatchSlot slot_;
  const Final final_;
  std::mutex mu_;
  bool subscribed_;
  bool writing_ = false;
  bool finished_ = false;
  grpc::Status end_ = grpc::Status::OK;  // not OK once the feed ended the key
  std::shared_ptr<const Msg> in_flight_;  // what StartWrite was given
  std::shared_ptr<const Msg> pending_;    // the newest state not yet written
};

}  // namespace reshard::coordinator
