// One WatchJob or WatchOperation stream on gRPC's callback API: a
// subscriber of the change feed (logic/change_feed.h) that holds no thread.
//
// The stream's admission (authentication, the method table, its watch slot,
// and for a tenant-scoped caller a read of the job's tenant) runs on the
// feed's workers, never on gRPC's callback threads, which agents' heartbeats
// and long polls need. Once admitted, the feed hands it states; it writes the
// latest one as soon as the write before it is done (a slow reader sees
// fewer, later states, never a stale one after a newer). It ends with OK
// after writing a final state (`Final`), with the feed's status when the key
// goes (NotFound) or the replica shuts down, with the admission's refusal,
// and with CANCELLED when the client goes. Its watch slot (stream_limits.h)
// is held until it is deleted.
//
// Lifetime: two references, gRPC's (released in OnDone) and the
// admission's (released when it has subscribed or refused); the last one
// unsubscribes from the feed and deletes the reactor.
#pragma once

#include <atomic>
#include <functional>
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

  /// What an admitted stream watches.
  struct Admission {
    std::string key;
    int64_t from_version = 0;
    WatchSlot slot;
  };
  /// Admits the stream (on a feed worker): its Admission, or the status
  /// that refuses it.
  using Admit = std::function<absl::StatusOr<Admission>()>;

  /// A stream of `feed` whose admission runs on `feed_owner`'s workers.
  static WatchReactor* Start(ChangeFeed* feed_owner, KeyFeed<Msg>* feed, Final final,
                             Admit admit) {
    auto* reactor = new WatchReactor(feed, final);
    feed_owner->Post([reactor, admit = std::move(admit)] { reactor->RunAdmission(admit); });
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
    cancelled_ = true;
    // Not while the admission runs: it reads the request and the context,
    // which gRPC frees once the stream is finished and done.
    if (!admitting_) FinishLocked(Cancelled());
  }
  void OnDone() override { Release(); }

 private:
  WatchReactor(KeyFeed<Msg>* feed, Final final) : feed_(feed), final_(final) {}

  void RunAdmission(const Admit& admit) {
    bool cancelled;
    {
      std::lock_guard<std::mutex> l(mu_);
      cancelled = cancelled_;
    }
    absl::StatusOr<Admission> admitted = cancelled ? absl::CancelledError("") : admit();
    bool go = false;
    {
      std::lock_guard<std::mutex> l(mu_);
      admitting_ = false;
      if (cancelled_) {
        FinishLocked(Cancelled());
      } else if (!admitted.ok()) {
        FinishLocked(ToGrpcStatus(admitted.status()));
      } else {
        go = true;
      }
      if (admitted.ok()) {
        key_ = std::move(admitted->key);
        from_version_ = admitted->from_version;
        slot_ = std::move(admitted->slot);
      }
    }
    // Without our lock: the feed calls us under its own (maybe at once).
    if (go) feed_->Subscribe(key_, from_version_, this);
    Release();
  }

  static grpc::Status Cancelled() {
    return grpc::Status(grpc::StatusCode::CANCELLED, "the client cancelled the watch");
  }

  void Release() {
    if (refs_.fetch_sub(1) != 1) return;
    // The last reference: the admission is over (key_ final) and gRPC is
    // done. After Unsubscribe the feed calls us no more.
    if (!key_.empty()) feed_->Unsubscribe(key_, this);
    delete this;
  }

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
  const Final final_;
  std::atomic<int> refs_{2};  // gRPC's (OnDone) and the admission's
  // Set by the admission, before it subscribes; read by the last Release.
  std::string key_;
  int64_t from_version_ = 0;
  WatchSlot slot_;
  std::mutex mu_;
  bool admitting_ = true;  // until RunAdmission is done with the request
  bool cancelled_ = false;
  bool writing_ = false;
  bool finished_ = false;
  grpc::Status end_ = grpc::Status::OK;  // not OK once the feed ended the key
  std::shared_ptr<const Msg> in_flight_;  // what StartWrite was given
  std::shared_ptr<const Msg> pending_;    // the newest state not yet written
};

}  // namespace reshard::coordinator
