#include "agent/executor/device_comm_steps.h"

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "agent/executor/device_comm_bootstrap.h"
#include "agent/executor/device_cross_host.h"
#include "agent/executor/peer_proof.h"
#include "agent/executor/step_chunks.h"
#include "agent/executor/step_seal.h"
#include "agent/executor/task_phase.h"
#include "agent/executor/task_run.h"
#include "agent/executor/transfer_tags.h"
#include "agent/transfer/backend.h"
#include "common/log.h"
#include "planner/layout.h"

namespace reshard::agent {
namespace {

constexpr int kCommDevice = 0;
constexpr auto kCancelPoll = std::chrono::milliseconds(50);

// Runs `fn`, a call that may wait on a peer. A transfer whose peer stalls or
// died without closing its end (NCCL: a peer process hung, or a host gone)
// never completes, and NCCL may also block in GroupEnd (it connects lazily
// there); nothing on this thread would poll cancelled() again. So while `fn`
// runs, a watchdog polls cancelled() (the coordinator aborts an operation
// that makes no progress) and aborts the communicator, which fails the
// transfers in flight and ends the wait.
absl::Status WatchingCancel(DeviceComm& comm, const std::function<bool()>& cancelled,
                            const std::function<absl::Status()>& fn) {
  if (!cancelled) return fn();
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  std::thread watchdog([&] {
    std::unique_lock<std::mutex> l(mu);
    while (!cv.wait_for(l, kCancelPoll, [&] { return done; })) {
      if (cancelled()) {
        comm.Abort();  // thread-safe (device_comm.h)
        return;
      }
    }
  });
  absl::Status s = fn();
  {
    std::lock_guard<std::mutex> l(mu);
    done = true;
  }
  cv.notify_all();
  watchdog.join();
  return s;
}

std::vector<int64_t> RowMajorStrides(const std::vector<int64_t>& shape) {
  std::vector<int64_t> s(shape.size(), 1);
  for (int k = static_cast<int>(shape.size()) - 2; k >= 0; --k) s[k] = s[k + 1] * shape[k + 1];
  return s;
}

// One chunk of a cross-host step, seen from this host.
struct Chunk {
  size_t remote = 0;  // index into hs.remotes
  int64_t chunk = 0;
  int64_t bytes = 0;
};

// Device memory owned for a run.
class Owned {
 public:
  explicit Owned(DeviceApi* api) : api_(api) {}
  Owned(const Owned&) = delete;
  ~Owned() {
    if (p_ != nullptr) (void)api_->Free(kCommDevice, p_);
  }
  absl::Status Allocate(int64_t bytes) {
    if (bytes <= 0) return absl::OkStatus();
    absl::StatusOr<void*> p = api_->Malloc(kCommDevice, static_cast<size_t>(bytes));
    if (!p.ok()) return p.status();
    p_ = *p;
    return absl::OkStatus();
  }
  uint8_t* data() const { return static_cast<uint8_t*>(p_); }

 private:
  DeviceApi* api_;
  void* p_ = nullptr;
};

// Windows of `chunks`: consecutive chunks of at most `window` bytes, at least one.
std::vector<std::vector<Chunk>> Windows(const std::vector<Chunk>& chunks, int64_t window) {
  std::vector<std::vector<Chunk>> out;
  int64_t bytes = 0;
  for (const Chunk& c : chunks) {
    if (out.empty() || bytes + c.bytes > window) {
      out.emplace_back();
      bytes = 0;
    }
    out.back().push_back(c);
    bytes += c.bytes;
  }
  return out;
}

int64_t WindowBytes(const std::vector<Chunk>& w) {
  int64_t n = 0;
  for (const Chunk& c : w) n += c.bytes;
  return n;
}

class CommSteps : public DeviceCrossHostSteps {
 public:
  CommSteps(DeviceBufferStore& devices, DeviceCommFactory& factory, Transport* transport,
            const TaskExecutor::Options& options, const std::string& host_id,
            const v1::HostTask& task, const std::function<bool()>& cancelled,
            const std::function<void(const std::string& what)>& waiting)
      : DeviceCrossHostSteps(devices, transport, options, host_id, task, cancelled, waiting),
        factory_(factory),
        context_(TransferContext(task)) {}

  ~CommSteps() {
    ReleaseStaging();
    if (stream_.has_value()) (void)api_->DestroyStream(*stream_);
  }

  absl::Status Move(const HostSteps& hs, const std::vector<DeviceRankBufferPtr>& made,
                    const std::function<void(int64_t bytes)>& moved) override {
    hs_ = &hs;
    made_ = &made;
    if (absl::Status s = Bootstrap(); !s.ok()) return s;
    Plan();
    if (absl::Status s = MoveRounds(moved); !s.ok()) return Failed(s);
    if (seals_) {
      if (absl::Status s = FinishStepSeals(*seals_, options_, cancelled_, waiting_); !s.ok()) {
        return Failed(s);
      }
    }
    return absl::OkStatus();
  }

  void Abort() override {
    if (comm_) comm_->Abort();  // thread-safe (device_comm.h)
  }

 private:
  absl::Status Failed(absl::Status s) {
    ReleaseStaging();
    if (comm_) comm_->Abort();
    return CrossHostDeviceStepsFailed(transport_, task_, cancelled_, std::move(s));
  }

  // Frees the staging, first (when work queued on stream_ may still use it:
  // a failure between the first enqueue of a round and its sync) aborting
  // the communicator and waiting for the stream, so that nothing in flight
  // writes freed memory and, on CUDA, no free waits behind a transfer on a
  // dead peer.
  void ReleaseStaging() {
    if (queued_ && stream_.has_value()) {
      if (comm_) comm_->Abort();
      (void)api_->StreamSynchronize(*stream_);  // its error is the transfer's, reported already
    }
    queued_ = false;
    staging_.clear();
    staging_reservation_ = DeviceReservation();
  }

  absl::Status Bootstrap() {
    if (waiting_) waiting_("device communicator");
    std::vector<std::string> hosts;  // in rank order
    for (const auto& [host, rank] : host_index_) hosts.push_back(host);
    absl::StatusOr<std::unique_ptr<DeviceComm>> comm = BootstrapDeviceComm(
        transport_, &factory_, task_.transfer_secret(), context_, host_id_, hosts, kCommDevice,
        DeviceCommTag(tag_key_), cancelled_, std::chrono::milliseconds(options_.proof_timeout_ms));
    if (!comm.ok()) return comm.status();
    comm_ = *std::move(comm);
    absl::StatusOr<DeviceStream> stream = api_->CreateStream(kCommDevice);
    if (!stream.ok()) return stream.status();
    stream_ = *stream;
    return absl::OkStatus();
  }

  // Each pair's chunks, its windows, and the seals.
  void Plan() {
    std::map<std::string, std::vector<Chunk>> sends, receives;
    std::vector<int64_t> chunk_counts;
    for (size_t i = 0; i < hs_->remotes.size(); ++i) {
      const RemoteStep& r = hs_->remotes[i];
      const int item = r.step->item();
      chunks_.emplace_back(ToVector(r.step->shape()), task_.plan().items(item).element_bytes(),
                           options_.chunk_bytes);
      const StepChunks& sc = chunks_.back();
      auto& list = (r.is_send ? sends : receives)[r.peer];
      for (int64_t c = 0; c < sc.count(); ++c) list.push_back(Chunk{i, c, sc.Bytes(c)});
      chunk_counts.push_back(sc.count());
    }
    for (auto& [peer, list] : sends) {
      send_windows_[peer] = Windows(list, options_.peer_window_bytes);
    }
    for (auto& [peer, list] : receives) {
      receive_windows_[peer] = Windows(list, options_.peer_window_bytes);
    }
    seals_ = PlanStepSeals(transport_, task_, host_id_, hs_->remotes, chunk_counts);
  }

  // Queues the copies of chunk `c` between its step's buffers here and
  // `staging` (row-major), run by run: a send gathers its source region into
  // the staging, a receive scatters the staging into each destination.
  absl::Status CopyChunk(const Chunk& c, uint8_t* staging) {
    const RemoteStep& r = hs_->remotes[c.remote];
    const v1::CopyStep& step = *r.step;
    std::vector<int64_t> start, shape;
    chunks_[c.remote].Get(c.chunk, &start, &shape);
    const std::vector<int64_t> packed = RowMajorStrides(shape);
    const int item = step.item();
    const int eb = ElementBytes(c);
    absl::Status st;
    auto copy = [&](uint8_t* to, int to_device, const uint8_t* from, int from_device) {
      return [&, to, to_device, from, from_device](int64_t s, int64_t d, int64_t n) {
        if (st.ok()) {
          st =
              Copy(to + d * eb, to_device, from + s * eb, from_device, static_cast<size_t>(n * eb));
        }
      };
    };
    if (r.is_send) {
      const RankBuffer& src = *hs_->old_bufs.at(step.src_rank());
      const DeviceRankBuffer* dev = DeviceSourceOf(src);
      const uint8_t* base = (dev != nullptr ? static_cast<const uint8_t*>(dev->data())
                                            : const_cast<RankBuffer&>(src).data()) +
                            src.items()[item].offset;
      const std::vector<int64_t> strides = ToVector(step.src().strides());
      ForEachRun(shape, ChunkOffset(step.src().offset(), strides, start), strides, 0, packed,
                 copy(staging, kCommDevice, base, dev != nullptr ? dev->device() : -1));
      return st;
    }
    for (const v1::Destination& dst : step.dsts()) {
      const DeviceRankBuffer& b = *(*made_)[hs_->new_index.at(dst.rank())];
      uint8_t* base = static_cast<uint8_t*>(b.data()) + b.items()[item].offset;
      const std::vector<int64_t> strides = ToVector(dst.region().strides());
      ForEachRun(shape, 0, packed, ChunkOffset(dst.region().offset(), strides, start), strides,
                 copy(base, b.device(), staging, kCommDevice));
    }
    return st;
  }

  // One copy on the communicator's stream; device -1 is host memory.
  absl::Status Copy(uint8_t* to, int to_device, const uint8_t* from, int from_device,
                    size_t bytes) {
    if (from_device < 0) {
      return api_->MemcpyAsync(to, from, bytes, CopyKind::kHostToDevice, *stream_);
    }
    if (from_device == to_device) {
      return api_->MemcpyAsync(to, from, bytes, CopyKind::kDeviceToDevice, *stream_);
    }
    return api_->MemcpyPeerAsync(to, to_device, from, from_device, bytes, *stream_);
  }

  static const std::vector<Chunk>* Window(
      const std::map<std::string, std::vector<std::vector<Chunk>>>& ws, const std::string& p,
      size_t k) {
    auto it = ws.find(p);
    return it == ws.end() || k >= it->second.size() ? nullptr : &it->second[k];
  }

  absl::Status MoveRounds(const std::function<void(int64_t bytes)>& moved) {
    // Staging per peer and direction, as large as its largest window.
    std::map<std::string, std::pair<int64_t, int64_t>> need;  // peer -> (send, receive)
    size_t rounds = 0;
    for (const auto& [p, ws] : send_windows_) {
      for (const auto& w : ws) need[p].first = std::max(need[p].first, WindowBytes(w));
      rounds = std::max(rounds, ws.size());
    }
    for (const auto& [p, ws] : receive_windows_) {
      for (const auto& w : ws) need[p].second = std::max(need[p].second, WindowBytes(w));
      rounds = std::max(rounds, ws.size());
    }
    std::map<std::string, Staging>& staging = staging_;
    const bool sealed = seals_ != nullptr;
    // The device staging counts against the device store's limit.
    int64_t device_staging = 0;
    for (const auto& [p, n] : need) device_staging += n.first + n.second;
    absl::StatusOr<DeviceReservation> reserved =
        devices_.Reserve(kCommDevice, device_staging, "device communicator staging");
    if (!reserved.ok()) return reserved.status();
    staging_reservation_ = *std::move(reserved);
    for (const auto& [p, n] : need) {
      Staging& s = staging[p];
      s.send = std::make_unique<Owned>(api_);
      s.receive = std::make_unique<Owned>(api_);
      auto failed = [&](const absl::Status& st) {
        return absl::Status(st.code(), absl::StrCat("device communicator staging for host \"", p,
                                                    "\": ", st.message()));
      };
      for (auto [o, bytes] : {std::pair{s.send.get(), n.first}, {s.receive.get(), n.second}}) {
        if (absl::Status st = o->Allocate(bytes); !st.ok()) return failed(st);
      }
      // The host copies come from the store's pinned pool: registered once
      // for the agent's life, not per run.
      for (auto [lease, bytes] : {std::pair{&s.send_host, n.first}, {&s.receive_host, n.second}}) {
        absl::StatusOr<PinnedHostPool::Lease> got = devices_.pinned().Take(sealed ? bytes : 0);
        if (!got.ok()) return failed(got.status());
        *lease = *std::move(got);
      }
    }
    for (size_t k = 0; k < rounds; ++k) {
      if (cancelled_ && cancelled_()) return absl::CancelledError("task cancelled");
      if (waiting_ && k == 0) waiting_("cross-host steps (device communicator)");
      queued_ = true;  // until the round's sync: the staging may be in use
      // Pack every send window of the round (and its host copy to tag).
      for (const auto& [p, s] : staging) {
        const std::vector<Chunk>* w = Window(send_windows_, p, k);
        if (w == nullptr) continue;
        int64_t at = 0;
        for (const Chunk& c : *w) {
          if (absl::Status st = CopyChunk(c, s.send->data() + at); !st.ok()) return st;
          at += c.bytes;
        }
        if (sealed && at > 0) {
          if (absl::Status st =
                  api_->MemcpyAsync(s.send_host.data(), s.send->data(), static_cast<size_t>(at),
                                    CopyKind::kDeviceToHost, *stream_);
              !st.ok()) {
            return st;
          }
        }
      }
      // Every pair's window k, both ways, in one group (watched: GroupEnd
      // may block on a peer).
      if (absl::Status st = WatchingCancel(*comm_, cancelled_, [&] { return Issue(k); });
          !st.ok()) {
        return st;
      }
      // Received windows: their host copies to tag, then scattered.
      int64_t received = 0;
      for (const auto& [p, s] : staging) {
        const std::vector<Chunk>* w = Window(receive_windows_, p, k);
        if (w == nullptr) continue;
        const int64_t bytes = WindowBytes(*w);
        if (sealed && bytes > 0) {
          if (absl::Status st =
                  api_->MemcpyAsync(s.receive_host.data(), s.receive->data(),
                                    static_cast<size_t>(bytes), CopyKind::kDeviceToHost, *stream_);
              !st.ok()) {
            return st;
          }
        }
        int64_t at = 0;
        for (const Chunk& c : *w) {
          if (absl::Status st = CopyChunk(c, s.receive->data() + at); !st.ok()) return st;
          at += c.bytes;
          received += c.bytes * hs_->remotes[c.remote].step->dsts_size();
        }
      }
      if (absl::Status st =
              WatchingCancel(*comm_, cancelled_, [&] { return api_->StreamSynchronize(*stream_); });
          !st.ok()) {
        return st;
      }
      queued_ = false;
      if (sealed) {
        for (const auto& [p, s] : staging) {
          for (const auto& [ws, host] :
               {std::pair{&send_windows_, &s.send_host}, {&receive_windows_, &s.receive_host}}) {
            const std::vector<Chunk>* w = Window(*ws, p, k);
            if (w == nullptr) continue;
            int64_t at = 0;
            for (const Chunk& c : *w) {
              seals_->AddChunk(c.remote, c.chunk, host->data() + at, static_cast<size_t>(c.bytes));
              at += c.bytes;
            }
          }
        }
      }
      moved(received);
    }
    return absl::OkStatus();
  }

  // Round k's group: window k of every pair, both ways.
  absl::Status Issue(size_t k) {
    if (absl::Status st = comm_->GroupStart(); !st.ok()) return st;
    absl::Status issued;
    for (const auto& [p, s] : staging_) {
      const int peer = host_index_.at(p);
      if (const auto* w = Window(send_windows_, p, k); w != nullptr && issued.ok()) {
        issued = comm_->Send(s.send->data(), static_cast<size_t>(WindowBytes(*w)), peer, *stream_);
      }
      if (const auto* w = Window(receive_windows_, p, k); w != nullptr && issued.ok()) {
        issued =
            comm_->Recv(s.receive->data(), static_cast<size_t>(WindowBytes(*w)), peer, *stream_);
      }
    }
    absl::Status ended = comm_->GroupEnd();
    return issued.ok() ? ended : issued;
  }

  int ElementBytes(const Chunk& c) const {
    return task_.plan().items(hs_->remotes[c.remote].step->item()).element_bytes();
  }

  DeviceCommFactory& factory_;
  const std::string context_;
  const HostSteps* hs_ = nullptr;
  const std::vector<DeviceRankBufferPtr>* made_ = nullptr;
  std::unique_ptr<DeviceComm> comm_;
  std::optional<DeviceStream> stream_;
  std::vector<StepChunks> chunks_;  // per remote
  std::map<std::string, std::vector<std::vector<Chunk>>> send_windows_, receive_windows_;
  std::unique_ptr<StepSeals> seals_;
  // Per peer: staging as large as its largest window, each direction (and
  // its pinned host copy with seals). Released by ReleaseStaging.
  struct Staging {
    std::unique_ptr<Owned> send, receive;
    PinnedHostPool::Lease send_host, receive_host;
  };
  std::map<std::string, Staging> staging_;
  bool queued_ = false;  // work that may use staging_ is queued on stream_, not yet synced
  DeviceReservation staging_reservation_;  // staging_'s device bytes, charged to devices_
};

}  // namespace

absl::Status CrossHostDeviceStepsFailed(Transport* transport, const v1::HostTask& task,
                                        const std::function<bool()>& cancelled, absl::Status s) {
  // A peer that was cancelled too aborts its end: say what happened here.
  if (cancelled && cancelled() && !absl::IsCancelled(s)) {
    s = absl::CancelledError(absl::StrCat("task cancelled (", s.message(), ")"));
  }
  UcxHostMover(transport).Cancel(TagBase(TaskTagKey(task)), kTagKeyMask);
  return s;
}

std::string AdvertisedCommName(const DeviceCommFactory& factory) {
  return DeviceCommBackendCapabilities(factory).name;  // the rule lives in backend.cc
}

namespace {

// Every new rank of this host gets a device, host-resident ones too (they
// are staged to host memory at the end).
void GiveEveryNewRankADevice(const DeviceBufferStore& devices, const std::string& host_id,
                             const v1::HostTask& task, DeviceRoute* route) {
  if (route->on_device) return;
  route->device_of.clear();
  int index = 0;
  const auto slots = planner::ExpandPlacement(task.plan().target_layout().placement());
  for (int r = 0; r < static_cast<int>(slots.size()); ++r) {
    if (slots[r].host() != host_id) continue;
    route->device_of[r] = index++ % devices.device_count();
  }
}

// Whether `entry` is non-empty and in every other host's transports.
bool EveryHostAdvertises(const v1::HostTask& task, const std::string& host_id,
                         const std::string& entry) {
  if (entry.empty()) return false;
  for (const v1::PeerHost& p : task.peers()) {
    if (p.host_id() == host_id) continue;
    if (std::find(p.transports().begin(), p.transports().end(), entry) == p.transports().end()) {
      return false;
    }
  }
  return true;
}

}  // namespace

void RouteOverDeviceComm(const DeviceBufferStore& devices, const DeviceCommFactory* comm,
                         const std::string& comm_why_not, const std::string& host_id,
                         const v1::HostTask& task, DeviceRoute* route, bool device_ipc) {
  bool others = false;
  for (const v1::PeerHost& p : task.peers()) others |= p.host_id() != host_id;
  absl::StatusOr<TaskPhase> phase = PhaseOf(task);
  // Only what every host of the operation sees alike decides.
  if (!others || devices.device_count() == 0 || !phase.ok() || *phase != TaskPhase::kTransfer ||
      task.plan().regenerate_size() > 0) {
    return;
  }
  // A job whose state lives in host memory keeps it there between agents,
  // whatever they offer: the device routes would spend GPU memory beside the
  // training processes' for no gain.
  if (!task.device_resident()) {
    if (route->kind == DeviceRoute::Kind::kHostStaged && route->on_device) {
      route->why = "cross-host steps move host memory (the job's state_memory is not DEVICE)";
    }
    return;
  }
  if (device_ipc && EveryHostAdvertises(task, host_id, DeviceIpcEntry(*devices.api()))) {
    GiveEveryNewRankADevice(devices, host_id, task, route);
    route->kind = DeviceRoute::Kind::kDeviceIpc;
    route->why.clear();
    return;
  }
  std::string missing;
  if (comm == nullptr) {
    missing = absl::StrCat("no device communicator",
                           comm_why_not.empty() ? "" : absl::StrCat(": ", comm_why_not));
  } else {
    const std::string name = AdvertisedCommName(*comm);
    for (const v1::PeerHost& p : task.peers()) {
      if (p.host_id() == host_id) continue;
      if (std::find(p.transports().begin(), p.transports().end(), name) == p.transports().end()) {
        missing = absl::StrCat("host \"", p.host_id(), "\" does not advertise ", name);
        break;
      }
    }
  }
  if (!missing.empty()) {
    if (route->kind == DeviceRoute::Kind::kHostStaged && route->on_device) {
      route->why = absl::StrCat("cross-host steps move host memory (", missing, ")");
    }
    return;
  }
  GiveEveryNewRankADevice(devices, host_id, task, route);
  route->kind = DeviceRoute::Kind::kDeviceComm;
  route->why.clear();
}

DeviceCommMover::DeviceCommMover(DeviceBufferStore& devices, DeviceCommFactory& comm,
                                 Transport* transport, const TaskExecutor::Options& options,
                                 const std::string& host_id, const v1::HostTask& task,
                                 const std::function<bool()>& cancelled,
                                 const std::function<void(const std::string& what)>& waiting)
    : DeviceStepsMover(transport, cancelled), comm_(comm) {
  SetSteps(std::make_unique<CommSteps>(devices, comm, transport, options, host_id, task,
                                       this->cancelled(), waiting));
}

MoverCapabilities DeviceCommMover::capabilities() const {
  MoverCapabilities c;
  c.name = AdvertisedCommName(comm_);
  c.memory_kinds = {MemoryKind::kCuda};
  c.remote = true;
  c.notifications = false;  // a round completes when its stream is synchronized
  return c;
}

}  // namespace reshard::agent
