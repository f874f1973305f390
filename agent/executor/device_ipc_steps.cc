#include "agent/executor/device_ipc_steps.h"

#include <openssl/rand.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <utility>

#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "agent/executor/device_comm_steps.h"
#include "agent/executor/device_cross_host.h"
#include "agent/executor/host_steps.h"
#include "agent/executor/peer_proof.h"
#include "agent/executor/step_chunks.h"
#include "agent/executor/transfer_tags.h"
#include "agent/shard_store/device_staging.h"

namespace reshard::agent {
namespace {

constexpr size_t kMacBytes = 32;
constexpr int kIpcDevice = 0;  // handles are opened, and copies queued, here
constexpr size_t kMaxHandleBytes = 256;
constexpr char kDone[] = "done";
constexpr char kNonce[] = "nonce";
constexpr size_t kNonceBytes = 16;
// The nonce line of a handles message ("nonce <hex>\n"), or the nonce of a
// "done" ("done <hex>"), with room to spare.
constexpr size_t kNonceFieldBytes = 48;

// kNonceBytes random bytes (a handles message's, echoed in its "done").
std::string RandomNonce() {
  std::string nonce(kNonceBytes, '\0');
  if (RAND_bytes(reinterpret_cast<unsigned char*>(nonce.data()), kNonceBytes) != 1) {
    // No entropy source: a nonce that no earlier attempt used still.
    const auto now = std::chrono::steady_clock::now().time_since_epoch().count();
    nonce = HmacSha256Of(std::to_string(now), "reshard-device-ipc-nonce").substr(0, kNonceBytes);
  }
  return nonce;
}

std::string IpcMac(const std::string& secret, const std::string& operation_id,
                   const std::string& sender, const std::string& receiver,
                   const std::string& payload) {
  std::string data;
  AppendMacField(data, "reshard-device-ipc");
  AppendMacField(data, operation_id);
  AppendMacField(data, sender);
  AppendMacField(data, receiver);
  AppendMacField(data, payload);
  return HmacSha256Of(secret, data);
}

// One old rank a sender lists.
struct Entry {
  int rank = 0;
  int device = 0;
  int64_t size = 0;
  std::string handle;
  std::vector<int64_t> offsets;  // per item
};

std::string EntryLine(const Entry& e) {
  return absl::StrCat(e.rank, " ", e.device, " ", e.size, " ", absl::BytesToHexString(e.handle),
                      " ", absl::StrJoin(e.offsets, ","), "\n");
}

std::optional<Entry> ParseEntry(absl::string_view line, size_t items) {
  std::vector<absl::string_view> f = absl::StrSplit(line, ' ');
  Entry e;
  if (f.size() != 5 || !absl::SimpleAtoi(f[0], &e.rank) || !absl::SimpleAtoi(f[1], &e.device) ||
      !absl::SimpleAtoi(f[2], &e.size)) {
    return std::nullopt;
  }
  e.handle = absl::HexStringToBytes(f[3]);
  for (absl::string_view o : absl::StrSplit(f[4], ',', absl::SkipEmpty())) {
    int64_t v = 0;
    if (!absl::SimpleAtoi(o, &v)) return std::nullopt;
    e.offsets.push_back(v);
  }
  if (e.offsets.size() != items) return std::nullopt;
  return e;
}

// The state the transport's callbacks touch: it outlives a failed run.
struct Pending {
  std::mutex mu;
  std::condition_variable cv;
  std::map<std::string, std::string> messages;  // peer -> bytes (sent or received)
  std::set<std::string> done;                   // peers whose transfer completed
  absl::Status error;
};

class IpcSteps : public DeviceCrossHostSteps {
 public:
  IpcSteps(ShardStore& store, DeviceBufferStore& devices, Transport* transport,
           const TaskExecutor::Options& options, const std::string& host_id,
           const v1::HostTask& task, const std::function<bool()>& cancelled,
           const std::function<void(const std::string& what)>& waiting)
      : DeviceCrossHostSteps(devices, transport, options, host_id, task, cancelled, waiting),
        store_(store) {}

  ~IpcSteps() {
    for (auto& [ptr, device] : opened_) (void)api_->IpcClose(device, ptr);
    if (stream_.has_value()) (void)api_->DestroyStream(*stream_);
    for (const RankBufferKey& k : staged_) devices_.Drop(k);
  }

  absl::Status Move(const HostSteps& hs, const std::vector<DeviceRankBufferPtr>& made,
                    const std::function<void(int64_t bytes)>& moved) override {
    std::map<std::string, std::set<int>> send_ranks, receive_ranks;
    for (const RemoteStep& r : hs.remotes) {
      (r.is_send ? send_ranks : receive_ranks)[r.peer].insert(r.step->src_rank());
    }
    absl::Status s = Send(hs, send_ranks);
    if (s.ok()) s = Receive(hs, made, receive_ranks, moved);
    std::set<std::string> receivers;
    for (const auto& [peer, rs] : send_ranks) receivers.insert(peer);
    if (s.ok() && !receivers.empty()) {
      s = Await(*sent_, receivers, "the IPC handles did not reach",
                std::chrono::milliseconds(options_.proof_timeout_ms));
      if (s.ok()) s = AwaitDone(receivers, std::chrono::milliseconds(options_.seal_timeout_ms));
      done_awaited_ = true;
    }
    if (s.ok()) return s;
    if (!done_awaited_) {
      // A receiver that got handles may be copying from the staged buffers
      // (dropped when this run ends): its "done" first, bounded (and
      // cancel-aware); its failure is not this run's error.
      (void)AwaitDone(HandedTo(), std::chrono::milliseconds(options_.proof_timeout_ms));
    }
    return CrossHostDeviceStepsFailed(transport_, task_, cancelled_, std::move(s));
  }

 private:
  absl::StatusOr<uint64_t> Tag(const std::string& host, bool done) const {
    auto it = host_index_.find(host);
    if (it == host_index_.end()) {
      return absl::InvalidArgumentError(absl::StrCat("operation ", task_.operation_id(),
                                                     ": host \"", host,
                                                     "\" is not among the task's peers"));
    }
    absl::StatusOr<int64_t> chunk = DeviceIpcChunk(it->second, done);
    if (!chunk.ok()) return chunk.status();
    return TransferTag(tag_key_, kProofStepIndex, *chunk);
  }

  size_t Items() const { return static_cast<size_t>(task_.plan().items_size()); }

  // Old rank `rank`'s buffer under the plan's source layout (what its
  // sender holds): LayoutItems of RankItemBytes.
  struct SourceLayout {
    std::vector<ItemSlot> slots;
    int64_t size = 0;
  };
  const SourceLayout& Source(int rank) {
    auto it = sources_.find(rank);
    if (it == sources_.end()) {
      SourceLayout l;
      l.slots =
          LayoutItems(RankItemBytes(task_.ptc(), task_.plan().source_layout(), rank), &l.size);
      it = sources_.emplace(rank, std::move(l)).first;
    }
    return it->second;
  }

  // The device buffer of old rank `rank` (a host one staged to a device).
  absl::StatusOr<const DeviceRankBuffer*> DeviceSource(const HostSteps& hs, int rank) {
    const RankBuffer& src = *hs.old_bufs.at(rank);
    if (const DeviceRankBuffer* d = DeviceSourceOf(src); d != nullptr) return d;
    const RankBufferKey key{task_.job_id(), task_.from_generation(), rank};
    const bool had_copy = devices_.Get(key).ok();  // kept: not this run's to drop
    absl::StatusOr<DeviceRankBufferPtr> staged = StageToDevice(store_, devices_, key, kIpcDevice);
    if (!staged.ok()) return staged.status();
    if (!had_copy) staged_.push_back(key);
    keep_.push_back(*staged);
    return staged->get();
  }

  // One handles message to every receiver.
  absl::Status Send(const HostSteps& hs, const std::map<std::string, std::set<int>>& ranks) {
    if (ranks.empty()) return absl::OkStatus();
    if (waiting_) waiting_("device IPC handles");
    std::map<int, Entry> entries;
    for (const auto& [peer, rs] : ranks) {
      for (int r : rs) {
        if (entries.count(r) > 0) continue;
        absl::StatusOr<const DeviceRankBuffer*> d = DeviceSource(hs, r);
        if (!d.ok()) return d.status();
        absl::StatusOr<std::string> handle = api_->IpcExport((*d)->device(), (*d)->data());
        if (!handle.ok()) return handle.status();
        if (handle->size() > kMaxHandleBytes) {
          return absl::InvalidArgumentError(absl::StrCat("IPC handle of old rank ", r, " has ",
                                                         handle->size(), " bytes, more than ",
                                                         kMaxHandleBytes));
        }
        Entry e{r, (*d)->device(), (*d)->size(), *std::move(handle), {}};
        for (const ItemSlot& item : (*d)->items()) e.offsets.push_back(item.offset);
        entries[r] = std::move(e);
      }
    }
    for (const auto& [peer, rs] : ranks) {
      // A nonce of this message: its "done" echoes it, so that a "done" of
      // an earlier attempt (same operation, same MAC) releases nothing.
      nonces_[peer] = RandomNonce();
      std::string payload = absl::StrCat(kNonce, " ", absl::BytesToHexString(nonces_[peer]), "\n");
      for (int r : rs) payload += EntryLine(entries.at(r));
      if (absl::Status s =
              SendMessage(sent_, peer, payload, rs.size(), false, [&] { return PostDone(peer); });
          !s.ok()) {
        return s;
      }
    }
    return absl::OkStatus();
  }

  // Sends `peer` this host's handles message (listing `ranks` old ranks) or,
  // `done`, its "done" (0 ranks), with `payload`, kept in `p` until sent;
  // `before` (optional) runs just before the send.
  absl::Status SendMessage(const std::shared_ptr<Pending>& p, const std::string& peer,
                           const std::string& payload, size_t ranks, bool done,
                           const std::function<absl::Status()>& before = nullptr) {
    absl::StatusOr<std::string> m =
        MakeDeviceIpcMessage(task_.transfer_secret(), task_.operation_id(), host_id_, peer, payload,
                             DeviceIpcMessageBytes(ranks, Items()));
    if (!m.ok()) return m.status();
    absl::StatusOr<uint64_t> tag = Tag(host_id_, done);
    if (!tag.ok()) return tag.status();
    std::string* out;
    {
      std::lock_guard<std::mutex> l(p->mu);
      out = &p->messages[peer];
      *out = *std::move(m);
    }
    if (before) {
      if (absl::Status s = before(); !s.ok()) return s;
    }
    transport_->Send(peer, *tag, out->data(), out->size(), Completion(p, peer));
    return absl::OkStatus();
  }

  // (Re)posts the receive of `peer`'s "done" (under its tag).
  absl::Status PostDone(const std::string& peer) {
    absl::StatusOr<uint64_t> tag = Tag(peer, true);
    if (!tag.ok()) return tag.status();
    std::string* in;
    {
      std::lock_guard<std::mutex> l(done_->mu);
      done_->done.erase(peer);
      in = &done_->messages[peer];
      in->assign(DeviceIpcMessageBytes(0, Items()), '\0');
    }
    transport_->Receive(*tag, in->data(), in->size(), Completion(done_, peer));
    return absl::OkStatus();
  }

  static TransferDone Completion(const std::shared_ptr<Pending>& p, const std::string& peer) {
    return [p, peer](absl::Status s) {
      std::lock_guard<std::mutex> l(p->mu);
      if (!s.ok() && p->error.ok()) {
        p->error = absl::Status(s.code(), absl::StrCat("host \"", peer, "\": ", s.message()));
      }
      p->done.insert(peer);
      p->cv.notify_all();
    };
  }

  // Waits until every peer of `peers` completed in `p`. `what` names the
  // wait, before the peers, in errors ("no IPC handles came from").
  absl::Status Await(Pending& p, const std::set<std::string>& peers, const std::string& what,
                     std::chrono::milliseconds timeout) {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    std::unique_lock<std::mutex> l(p.mu);
    while (true) {
      if (!p.error.ok()) {
        return absl::Status(
            p.error.code(),
            absl::StrCat("operation ", task_.operation_id(), " on host \"", host_id_,
                         "\": device IPC message of ", p.error.message()));
      }
      std::vector<std::string> missing;
      for (const std::string& peer : peers) {
        if (p.done.count(peer) == 0) missing.push_back(absl::StrCat("\"", peer, "\""));
      }
      if (missing.empty()) return absl::OkStatus();
      if (cancelled_ && cancelled_()) {
        return absl::CancelledError(absl::StrCat("task cancelled (", what, " host ",
                                                 absl::StrJoin(missing, ", host "), ")"));
      }
      if (std::chrono::steady_clock::now() >= deadline) {
        return absl::UnavailableError(absl::StrCat(
            "operation ", task_.operation_id(), " on host \"", host_id_, "\": ", what, " host ",
            absl::StrJoin(missing, ", host "), " within ", timeout.count() / 1000.0, " s"));
      }
      p.cv.wait_for(l, std::chrono::milliseconds(50));
    }
  }

  absl::StatusOr<DeviceIpcMessage> Checked(const std::string& peer, const std::string& message,
                                           const std::string& payload_kind) {
    absl::StatusOr<DeviceIpcMessage> m =
        CheckDeviceIpcMessage(task_.transfer_secret(), task_.operation_id(), message);
    if (!m.ok()) return m.status();
    if (m->sender != peer || m->receiver != host_id_) {
      return absl::PermissionDeniedError(absl::StrCat(
          "operation ", task_.operation_id(), ": host \"", m->sender, "\" sent device IPC ",
          payload_kind, " for host \"", m->receiver, "\" where host \"", peer, "\" was to send ",
          "them to host \"", host_id_, "\""));
    }
    return m;
  }

  // (peer, old rank) -> the opened allocation and its item offsets.
  using OpenedSources = std::map<std::pair<std::string, int>, std::pair<uint8_t*, Entry>>;

  absl::Status Receive(const HostSteps& hs, const std::vector<DeviceRankBufferPtr>& made,
                       const std::map<std::string, std::set<int>>& ranks,
                       const std::function<void(int64_t bytes)>& moved) {
    if (ranks.empty()) return absl::OkStatus();
    auto received = std::make_shared<Pending>();
    std::set<std::string> senders;
    if (absl::Status s = ReceiveHandles(ranks, received, &senders); !s.ok()) return s;
    OpenedSources sources;
    for (const auto& [peer, rs] : ranks) {
      std::string message;
      {
        std::lock_guard<std::mutex> l(received->mu);
        message = received->messages[peer];
      }
      if (absl::Status s = OpenHandles(peer, rs, message, &sources); !s.ok()) return s;
    }
    if (absl::Status s = CopyFromSources(hs, made, sources, moved); !s.ok()) return s;
    // "done" to every sender.
    auto sent = std::make_shared<Pending>();
    for (const std::string& peer : senders) {
      if (absl::Status s =
              SendMessage(sent, peer, DeviceIpcDonePayload(received_nonces_[peer]), 0, true);
          !s.ok()) {
        return s;
      }
    }
    return Await(*sent, senders, "\"done\" did not reach",
                 std::chrono::milliseconds(options_.proof_timeout_ms));
  }

  // Posts the receive of every sender's handles (`ranks`: sender -> the old
  // ranks read from it) and waits for them all; `senders` gets their names.
  absl::Status ReceiveHandles(const std::map<std::string, std::set<int>>& ranks,
                              const std::shared_ptr<Pending>& received,
                              std::set<std::string>* senders) {
    for (const auto& [peer, rs] : ranks) {
      absl::StatusOr<uint64_t> tag = Tag(peer, false);
      if (!tag.ok()) return tag.status();
      std::string* in;
      {
        std::lock_guard<std::mutex> l(received->mu);
        in = &received->messages[peer];
        in->assign(DeviceIpcMessageBytes(rs.size(), Items()), '\0');
      }
      transport_->Receive(*tag, in->data(), in->size(), Completion(received, peer));
      senders->insert(peer);
    }
    if (waiting_) waiting_("device IPC handles");
    return Await(*received, *senders, "no IPC handles came from",
                 std::chrono::milliseconds(options_.proof_timeout_ms));
  }

  // Checks `peer`'s handles `message` (its nonce, then one entry per old rank
  // of `rs`, each in the source layout) and opens each into `sources`.
  absl::Status OpenHandles(const std::string& peer, const std::set<int>& rs,
                           const std::string& message, OpenedSources* sources) {
    absl::StatusOr<DeviceIpcMessage> m = Checked(peer, message, "handles");
    if (!m.ok()) return m.status();
    std::vector<absl::string_view> lines = absl::StrSplit(m->payload, '\n', absl::SkipEmpty());
    const std::string nonce_prefix = absl::StrCat(kNonce, " ");
    if (lines.empty() || !absl::ConsumePrefix(&lines[0], nonce_prefix) ||
        lines[0].size() != 2 * kNonceBytes) {
      return absl::InvalidArgumentError(absl::StrCat("operation ", task_.operation_id(),
                                                     ": host \"", peer,
                                                     "\" sent device IPC handles without a nonce"));
    }
    received_nonces_[peer] = absl::HexStringToBytes(lines[0]);
    lines.erase(lines.begin());
    for (absl::string_view line : lines) {
      std::optional<Entry> e = ParseEntry(line, Items());
      if (!e.has_value() || rs.count(e->rank) == 0) {
        return absl::InvalidArgumentError(
            absl::StrCat("operation ", task_.operation_id(), ": host \"", peer,
                         "\" listed a device IPC handle that is not what host \"", host_id_,
                         "\" reads: \"", line, "\""));
      }
      // The layout is the receiver's to derive: the sender's size and
      // offsets only say where the sender put what both know.
      const std::vector<ItemSlot>& slots = Source(e->rank).slots;
      const int64_t size = Source(e->rank).size;
      bool same = e->size == size;
      for (size_t i = 0; i < slots.size() && same; ++i) same = e->offsets[i] == slots[i].offset;
      if (!same) {
        return absl::InvalidArgumentError(absl::StrCat(
            "operation ", task_.operation_id(), ": host \"", peer, "\" listed old rank ", e->rank,
            " as ", e->size, " bytes with item offsets [", absl::StrJoin(e->offsets, ", "),
            "], the source layout gives ", size, " bytes at [",
            absl::StrJoin(
                slots, ", ",
                [](std::string* out, const ItemSlot& s) { absl::StrAppend(out, s.offset); }),
            "]"));
      }
      absl::StatusOr<void*> p = api_->IpcOpen(kIpcDevice, e->handle);
      if (!p.ok()) return p.status();
      opened_.emplace_back(*p, kIpcDevice);
      absl::StatusOr<size_t> allocation = api_->AllocationSize(kIpcDevice, *p);
      if (!allocation.ok()) return allocation.status();
      if (*allocation < static_cast<size_t>(size)) {
        return absl::InvalidArgumentError(absl::StrCat(
            "operation ", task_.operation_id(), ": host \"", peer, "\" listed old rank ", e->rank,
            " (", size, " bytes) with an IPC handle of a ", *allocation, "-byte allocation"));
      }
      (*sources)[{peer, e->rank}] = {static_cast<uint8_t*>(*p), *std::move(e)};
    }
    return absl::OkStatus();
  }

  // Copies every received step from the opened `sources` into `made` on one
  // stream (device to device, or peer copies), tells `moved` the bytes once
  // they landed and closes the handles.
  absl::Status CopyFromSources(const HostSteps& hs, const std::vector<DeviceRankBufferPtr>& made,
                               const OpenedSources& sources,
                               const std::function<void(int64_t bytes)>& moved) {
    absl::StatusOr<DeviceStream> stream = api_->CreateStream(kIpcDevice);
    if (!stream.ok()) return stream.status();
    stream_ = *stream;
    if (waiting_) waiting_("cross-host steps (device IPC)");
    int64_t bytes_moved = 0;
    for (const RemoteStep& r : hs.remotes) {
      if (r.is_send) continue;
      if (cancelled_ && cancelled_()) return absl::CancelledError("task cancelled");
      const v1::CopyStep& step = *r.step;
      auto it = sources.find({r.peer, step.src_rank()});
      if (it == sources.end()) {
        return absl::InvalidArgumentError(
            absl::StrCat("operation ", task_.operation_id(), ": host \"", r.peer,
                         "\" listed no device IPC handle of old rank ", step.src_rank()));
      }
      const int item = step.item();
      const int eb = task_.plan().items(item).element_bytes();
      if (absl::Status s =
              CheckRegion(step.src(), step, Source(step.src_rank()).slots[item].bytes / eb,
                          "source", step.src_rank());
          !s.ok()) {
        return s;
      }
      const uint8_t* src = it->second.first + it->second.second.offsets[item];
      const std::vector<int64_t> shape = ToVector(step.shape());
      const std::vector<int64_t> src_strides = ToVector(step.src().strides());
      for (const v1::Destination& dst : step.dsts()) {
        const DeviceRankBuffer& b = *made[hs.new_index.at(dst.rank())];
        uint8_t* base = static_cast<uint8_t*>(b.data()) + b.items()[item].offset;
        absl::Status st;
        ForEachRun(shape, step.src().offset(), src_strides, dst.region().offset(),
                   ToVector(dst.region().strides()), [&](int64_t s, int64_t d, int64_t n) {
                     if (!st.ok()) return;
                     const size_t bytes = static_cast<size_t>(n * eb);
                     st = b.device() == kIpcDevice
                              ? api_->MemcpyAsync(base + d * eb, src + s * eb, bytes,
                                                  CopyKind::kDeviceToDevice, *stream_)
                              : api_->MemcpyPeerAsync(base + d * eb, b.device(), src + s * eb,
                                                      kIpcDevice, bytes, *stream_);
                     bytes_moved += static_cast<int64_t>(bytes);
                   });
        if (!st.ok()) return st;
      }
    }
    if (absl::Status s = api_->StreamSynchronize(*stream_); !s.ok()) return s;
    moved(bytes_moved);
    for (auto& [ptr, device] : opened_) {
      if (absl::Status s = api_->IpcClose(device, ptr); !s.ok()) return s;
    }
    opened_.clear();
    return absl::OkStatus();
  }

  // Every receiver's "done" of this attempt (its nonce), checked; one of an
  // earlier attempt is skipped, its receive posted again.
  absl::Status AwaitDone(const std::set<std::string>& receivers,
                         std::chrono::milliseconds timeout) {
    if (receivers.empty()) return absl::OkStatus();
    if (waiting_) waiting_("device IPC receivers");
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    std::set<std::string> pending = receivers;
    while (!pending.empty()) {
      const auto left = std::max(std::chrono::milliseconds(0),
                                 std::chrono::duration_cast<std::chrono::milliseconds>(
                                     deadline - std::chrono::steady_clock::now()));
      if (absl::Status s = Await(*done_, pending, "no \"done\" came from", left); !s.ok()) {
        return s;
      }
      for (const std::string& peer : std::set<std::string>(pending)) {
        std::string message;
        {
          std::lock_guard<std::mutex> l(done_->mu);
          message = done_->messages[peer];
        }
        absl::StatusOr<DeviceIpcMessage> m = Checked(peer, message, "\"done\"");
        if (!m.ok()) return m.status();
        absl::Status d = CheckDeviceIpcDone(task_.operation_id(), *m, nonces_[peer]);
        if (d.ok()) {
          pending.erase(peer);
        } else if (absl::IsFailedPrecondition(d)) {
          if (absl::Status s = PostDone(peer); !s.ok()) return s;
        } else {
          return d;
        }
      }
    }
    return absl::OkStatus();
  }

  // The receivers that were sent handles (their messages may be delivered
  // still, and a receiver may be copying from this host's buffers).
  std::set<std::string> HandedTo() {
    std::set<std::string> out;
    std::lock_guard<std::mutex> l(sent_->mu);
    for (const auto& [peer, message] : sent_->messages) out.insert(peer);
    return out;
  }

  ShardStore& store_;
  std::shared_ptr<Pending> sent_ = std::make_shared<Pending>();  // handles messages
  std::shared_ptr<Pending> done_ = std::make_shared<Pending>();  // receivers' "done"
  std::vector<std::pair<void*, int>> opened_;                    // IPC pointers, device
  std::optional<DeviceStream> stream_;
  std::vector<RankBufferKey> staged_;  // host sources staged to a device for the run
  std::vector<DeviceRankBufferPtr> keep_;
  std::map<int, SourceLayout> sources_;                 // by old rank
  std::map<std::string, std::string> nonces_;           // receiver -> its handles' nonce
  std::map<std::string, std::string> received_nonces_;  // sender -> its handles' nonce
  bool done_awaited_ = false;
};

}  // namespace

absl::StatusOr<int64_t> DeviceIpcChunk(int host_index, bool done) {
  const int64_t chunk = 2 + 2 * int64_t{host_index} + (done ? 1 : 0);
  if (host_index < 0 || chunk >= kMaxChunksPerStep) {
    return absl::InvalidArgumentError(
        absl::StrCat("device IPC: host index ", host_index, " does not fit a transfer tag"));
  }
  return chunk;
}

size_t DeviceIpcMessageBytes(size_t ranks, size_t items) {
  const size_t header = 3 * 4 + 2 * kMaxProofHostBytes + kMacBytes + kNonceFieldBytes;
  // An entry line: three numbers, the hex handle, the item offsets.
  const size_t entry = 3 * 21 + 2 * kMaxHandleBytes + 4 + 21 * items;
  return header + std::max(sizeof(kDone), ranks * entry);
}

std::string DeviceIpcDonePayload(const std::string& nonce) {
  return absl::StrCat(kDone, " ", absl::BytesToHexString(nonce));
}

absl::Status CheckDeviceIpcDone(const std::string& operation_id, const DeviceIpcMessage& done,
                                const std::string& nonce) {
  absl::string_view payload = done.payload;
  if (payload != kDone && !absl::ConsumePrefix(&payload, absl::StrCat(kDone, " "))) {
    return absl::InvalidArgumentError(absl::StrCat("operation ", operation_id, ": host \"",
                                                   done.sender, "\" sent no \"done\" but \"",
                                                   done.payload, "\""));
  }
  if (payload != absl::BytesToHexString(nonce)) {
    return absl::FailedPreconditionError(
        absl::StrCat("operation ", operation_id, ": host \"", done.sender,
                     "\" sent the \"done\" of other IPC handles (an earlier attempt's)"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> MakeDeviceIpcMessage(const std::string& secret,
                                                 const std::string& operation_id,
                                                 const std::string& sender,
                                                 const std::string& receiver,
                                                 const std::string& payload, size_t bytes) {
  std::string m;
  AppendMacField(m, sender);
  AppendMacField(m, receiver);
  AppendMacField(m, payload);
  m += IpcMac(secret, operation_id, sender, receiver, payload);
  if (sender.size() > kMaxProofHostBytes || receiver.size() > kMaxProofHostBytes ||
      m.size() > bytes) {
    return absl::InvalidArgumentError(absl::StrCat("device IPC message from host \"", sender,
                                                   "\" to host \"", receiver, "\": ", m.size(),
                                                   " bytes do not fit ", bytes));
  }
  m.resize(bytes, '\0');
  return m;
}

absl::StatusOr<DeviceIpcMessage> CheckDeviceIpcMessage(const std::string& secret,
                                                       const std::string& operation_id,
                                                       const std::string& message) {
  size_t at = 0;
  auto field = [&](std::string* out) {
    if (at + 4 > message.size()) return false;
    uint32_t n = 0;
    for (int i = 0; i < 4; ++i) {
      n |= static_cast<uint32_t>(static_cast<uint8_t>(message[at + i])) << (8 * i);
    }
    if (at + 4 + n > message.size()) return false;
    *out = message.substr(at + 4, n);
    at += 4 + n;
    return true;
  };
  DeviceIpcMessage out;
  if (!field(&out.sender) || !field(&out.receiver) || !field(&out.payload) ||
      at + kMacBytes > message.size() || out.sender.empty()) {
    return absl::UnauthenticatedError(
        absl::StrCat("operation ", operation_id, ": a malformed device IPC message"));
  }
  const std::string mac = message.substr(at, kMacBytes);
  if (!ConstantTimeEqual(mac,
                         IpcMac(secret, operation_id, out.sender, out.receiver, out.payload))) {
    return absl::PermissionDeniedError(
        absl::StrCat("host \"", out.sender, "\" sent a device IPC message for operation ",
                     operation_id, " that does not check with the operation's transfer secret"));
  }
  return out;
}

DeviceIpcMover::DeviceIpcMover(ShardStore& store, DeviceBufferStore& devices, Transport* transport,
                               const TaskExecutor::Options& options, const std::string& host_id,
                               const v1::HostTask& task, const std::function<bool()>& cancelled,
                               const std::function<void(const std::string& what)>& waiting)
    : DeviceStepsMover(transport, cancelled) {
  SetSteps(std::make_unique<IpcSteps>(store, devices, transport, options, host_id, task,
                                      this->cancelled(), waiting));
}

MoverCapabilities DeviceIpcMover::capabilities() const {
  MoverCapabilities c;
  c.name = "device-ipc";
  c.memory_kinds = {MemoryKind::kCuda};
  c.remote = true;
  c.notifications = true;  // each receiver's "done" says its copies landed
  return c;
}

}  // namespace reshard::agent
