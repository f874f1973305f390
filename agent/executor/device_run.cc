#include "agent/executor/device_run.h"

#include <algorithm>
#include <chrono>
#include <deque>
#include <set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "agent/executor/host_steps.h"
#include "agent/executor/run_resources.h"
#include "agent/executor/step_chunks.h"
#include "agent/executor/task_phase.h"
#include "agent/executor/transfer_tags.h"
#include "agent/shard_store/device_staging.h"
#include "common/log.h"
#include "planner/layout.h"

namespace reshard::agent {
namespace {

using Clock = std::chrono::steady_clock;
constexpr auto kReportEvery = std::chrono::milliseconds(200);

// A sealed device buffer seen as a source rank buffer by PrepareHostSteps,
// which checks regions against its items only: data() is a device pointer,
// never dereferenced (the device path copies through the device API).
class DeviceSource : public RankBuffer {
 public:
  explicit DeviceSource(DeviceRankBufferPtr b) : b_(std::move(b)) {}
  const RankBufferKey& key() const override { return b_->key(); }
  const std::string& path() const override { return path_; }
  uint8_t* data() override { return static_cast<uint8_t*>(b_->data()); }
  int64_t size() const override { return b_->size(); }
  const std::vector<ItemSlot>& items() const override { return b_->items(); }
  bool sealed() const override { return b_->sealed(); }
  std::vector<uint64_t> checksums() const override { return b_->checksums(); }
  bool published() const override { return false; }
  absl::Status CheckFile() const override { return absl::OkStatus(); }
  absl::StatusOr<std::unique_ptr<ReadLease>> LeaseForReading() const override {
    return absl::UnimplementedError("a device buffer has no file to lease");
  }
  const DeviceRankBuffer& device_buffer() const { return *b_; }

 private:
  DeviceRankBufferPtr b_;
  std::string path_;
};

// The host store with the device buffers behind it, for PrepareHostSteps:
// Get finds a key in host memory first, then in device memory. Nothing else
// is used (every other call goes to the host store).
class SourcesOfBothKinds : public ShardStore {
 public:
  SourcesOfBothKinds(ShardStore& host, DeviceBufferStore& devices)
      : host_(host), devices_(devices) {}
  absl::StatusOr<RankBufferPtr> Get(const RankBufferKey& key) override {
    absl::StatusOr<RankBufferPtr> h = host_.Get(key);
    if (h.ok() || !absl::IsNotFound(h.status())) return h;
    absl::StatusOr<DeviceRankBufferPtr> d = devices_.Get(key);
    if (!d.ok()) return h.status();
    return RankBufferPtr(std::make_shared<DeviceSource>(*std::move(d)));
  }
  absl::StatusOr<std::vector<RankBufferPtr>> CreateAll(
      const std::vector<RankBufferKey>& keys, const std::vector<std::vector<int64_t>>& item_bytes,
      Backing backing, Writer writer) override {
    return host_.CreateAll(keys, item_bytes, backing, writer);
  }
  absl::StatusOr<std::vector<uint64_t>> Seal(const RankBufferKey& key,
                                             const std::vector<uint64_t>& expected) override {
    return host_.Seal(key, expected);
  }
  absl::StatusOr<std::vector<uint64_t>> SealWritten(const RankBufferKey& key,
                                                    std::vector<uint64_t> sums) override {
    return host_.SealWritten(key, std::move(sums));
  }
  absl::StatusOr<std::vector<uint64_t>> SealForWorker(
      const RankBufferKey& key, const std::vector<uint64_t>& expected) override {
    return host_.SealForWorker(key, expected);
  }
  absl::Status MarkRegenerated(const RankBufferKey& key, std::vector<int32_t> items) override {
    return host_.MarkRegenerated(key, std::move(items));
  }
  void DropGeneration(const std::string& job_id, int64_t generation) override {
    host_.DropGeneration(job_id, generation);
  }
  void Drop(const RankBufferKey& key) override { host_.Drop(key); }
  void SetDropListener(DropListener listener) override {
    host_.SetDropListener(std::move(listener));
  }
  std::vector<RankBufferKey> List() const override { return host_.List(); }
  int64_t used_bytes() const override { return host_.used_bytes(); }
  int64_t limit_bytes() const override { return host_.limit_bytes(); }
  int64_t spare_bytes() const override { return host_.spare_bytes(); }
  std::shared_ptr<void> PauseSpareRefill() override { return host_.PauseSpareRefill(); }
  bool WaitForSpares(double timeout_s) override { return host_.WaitForSpares(timeout_s); }

 private:
  ShardStore& host_;
  DeviceBufferStore& devices_;
};

// One stream per device used, destroyed (after its work) with this.
class Streams {
 public:
  explicit Streams(DeviceApi* api) : api_(api) {}
  Streams(const Streams&) = delete;
  ~Streams() {
    for (const auto& [d, s] : streams_) (void)api_->DestroyStream(s);
  }
  absl::StatusOr<DeviceStream> Of(int device) {
    auto it = streams_.find(device);
    if (it != streams_.end()) return it->second;
    absl::StatusOr<DeviceStream> s = api_->CreateStream(device);
    if (!s.ok()) return s.status();
    streams_.emplace(device, *s);
    return *s;
  }
  absl::Status SynchronizeAll() {
    for (const auto& [d, s] : streams_) {
      if (absl::Status st = api_->StreamSynchronize(s); !st.ok()) return st;
    }
    return absl::OkStatus();
  }

 private:
  DeviceApi* api_;
  std::map<int, DeviceStream> streams_;
};

}  // namespace

const DeviceRankBuffer* DeviceSourceOf(const RankBuffer& source) {
  const auto* d = dynamic_cast<const DeviceSource*>(&source);
  return d != nullptr ? &d->device_buffer() : nullptr;
}

void ForEachRun(const std::vector<int64_t>& shape, int64_t src_offset,
                const std::vector<int64_t>& src_strides, int64_t dst_offset,
                const std::vector<int64_t>& dst_strides,
                const std::function<void(int64_t src, int64_t dst, int64_t elements)>& fn) {
  // Dimensions of size 1 move nothing; any of size 0 makes the region empty.
  std::vector<int64_t> n, ss, ds;
  for (size_t k = 0; k < shape.size(); ++k) {
    if (shape[k] <= 0) return;
    if (shape[k] == 1) continue;
    n.push_back(shape[k]);
    ss.push_back(src_strides[k]);
    ds.push_back(dst_strides[k]);
  }
  // The innermost dimensions that are contiguous in both regions form one run.
  int64_t run = 1;
  int outer = static_cast<int>(n.size());
  while (outer > 0 && ss[outer - 1] == run && ds[outer - 1] == run) run *= n[--outer];
  int64_t ps = 0, pd = 0, pn = 0;  // the pending (coalesced) run
  auto emit = [&](int64_t s, int64_t d) {
    if (pn > 0 && s == ps + pn && d == pd + pn) {
      pn += run;
      return;
    }
    if (pn > 0) fn(ps, pd, pn);
    ps = s, pd = d, pn = run;
  };
  std::vector<int64_t> idx(outer, 0);
  for (;;) {
    int64_t s = src_offset, d = dst_offset;
    for (int k = 0; k < outer; ++k) s += idx[k] * ss[k], d += idx[k] * ds[k];
    emit(s, d);
    int k = outer - 1;
    while (k >= 0 && ++idx[k] == n[k]) idx[k--] = 0;
    if (k < 0) break;
  }
  if (pn > 0) fn(ps, pd, pn);
}

std::string RouteName(DeviceRoute::Kind kind, const std::string& comm) {
  switch (kind) {
    case DeviceRoute::Kind::kHost:
      return "host";
    case DeviceRoute::Kind::kDevice:
      return "device-direct";
    case DeviceRoute::Kind::kDeviceComm:
      return comm.empty() ? "device-comm" : absl::StrCat("device-comm ", comm);
    case DeviceRoute::Kind::kDeviceIpc:
      return "device-ipc";
    case DeviceRoute::Kind::kHostStaged:
      return "host-staged";
  }
  return "host";
}

DeviceRoute RouteTask(ShardStore& store, const DeviceBufferStore& devices,
                      const std::string& host_id, const v1::HostTask& task) {
  DeviceRoute route;
  const v1::TransferPlan& plan = task.plan();
  const std::vector<v1::DeviceSlot> old_slots =
      planner::ExpandPlacement(plan.source_layout().placement());
  const std::vector<v1::DeviceSlot> new_slots =
      planner::ExpandPlacement(plan.target_layout().placement());
  // This host's sources: which are held here, in which memory.
  std::map<int, int> source_device;  // old rank here -> its device (device buffers)
  bool holds_source = false;
  for (int r = 0; r < static_cast<int>(old_slots.size()); ++r) {
    if (old_slots[r].host() != host_id) continue;
    const RankBufferKey key{task.job_id(), task.from_generation(), r};
    if (store.Get(key).ok()) {
      holds_source = true;
    } else if (absl::StatusOr<DeviceRankBufferPtr> d = devices.Get(key); d.ok()) {
      holds_source = true;
      source_device[r] = (*d)->device();
    }
  }
  route.on_device = devices.device_count() > 0 && (!source_device.empty() || !holds_source);
  if (!route.on_device) return route;  // kHost
  int index = 0;
  for (int r = 0; r < static_cast<int>(new_slots.size()); ++r) {
    if (new_slots[r].host() != host_id) continue;
    auto it = source_device.find(r);
    route.device_of[r] = it != source_device.end() ? it->second : index % devices.device_count();
    ++index;
  }
  // What this host's part needs.
  bool cross_host = false;
  std::set<int> read;
  for (const v1::CopyStep& s : plan.steps()) {
    if (s.src_rank() < 0 || s.src_rank() >= static_cast<int>(old_slots.size()) ||
        s.dsts_size() == 0 || s.dsts(0).rank() < 0 ||
        s.dsts(0).rank() >= static_cast<int>(new_slots.size())) {
      return DeviceRoute();  // TaskRun's checks say what is wrong
    }
    const bool src_here = old_slots[s.src_rank()].host() == host_id;
    const bool dst_here = new_slots[s.dsts(0).rank()].host() == host_id;
    if (src_here != dst_here) cross_host = true;
    if (src_here && source_device.count(s.src_rank())) read.insert(s.src_rank());
  }
  route.device_sources.assign(read.begin(), read.end());
  absl::StatusOr<TaskPhase> phase = PhaseOf(task);
  if (!phase.ok()) return DeviceRoute();
  bool regenerated = false;
  for (const v1::Regenerate& g : plan.regenerate()) {
    regenerated |= route.device_of.count(g.rank()) > 0;
  }
  route.kind = DeviceRoute::Kind::kHostStaged;
  if (*phase != TaskPhase::kTransfer) {
    route.why = "a two-phase (prepare / prepared) task runs in host memory";
    route.on_device = false;
  } else if (regenerated) {
    route.why = "regenerated items are recorded by the host store only";
    route.on_device = false;
  } else if (cross_host) {
    route.why = "cross-host steps move host memory (no device transport loaded)";
  } else {
    route.kind = DeviceRoute::Kind::kDevice;
  }
  if (!route.on_device) route.device_of.clear();
  return route;
}

namespace {

// The new buffers of this host's new ranks on their devices (route.device_of),
// all or none, their keys in `keys` (hs.new_ranks order); those of an
// earlier attempt, in either memory, go first.
absl::StatusOr<std::vector<DeviceRankBufferPtr>> MakeNewDeviceBuffers(
    ShardStore& store, DeviceBufferStore& devices, const v1::HostTask& task, const HostSteps& hs,
    const DeviceRoute& route, std::vector<RankBufferKey>* keys) {
  std::vector<int> on;
  for (int r : hs.new_ranks) {
    keys->push_back(RankBufferKey{task.job_id(), task.to_generation(), r});
    on.push_back(route.device_of.at(r));
  }
  for (const RankBufferKey& k : *keys) {
    if (devices.Get(k).ok() || store.Get(k).ok()) {
      RESHARD_LOG(INFO) << "operation " << task.operation_id() << " job " << task.job_id()
                        << ": discarding generation " << k.generation << " rank " << k.rank
                        << " left by an earlier attempt";
      devices.Drop(k);
      store.Drop(k);
    }
  }
  return devices.CreateAll(*keys, on, hs.new_item_bytes);
}

// Copies the local steps `hs.locals` into `made` through the device API, run
// by run (ForEachRun) in pieces of `piece_bytes`, on one stream per
// destination device: host to device from host sources, device to device on
// one device, peer copies across devices. Every `piece_bytes` queued it waits
// for the streams, tells `landed` the bytes and polls `cancelled`.
absl::Status CopyLocalsOnDevices(DeviceApi* api, const v1::HostTask& task, const HostSteps& hs,
                                 const std::vector<DeviceRankBufferPtr>& made, int64_t piece_bytes,
                                 const std::function<bool()>& cancelled,
                                 const std::function<void(int64_t bytes)>& landed) {
  Streams streams(api);
  int64_t queued = 0;
  // Waits for what is queued, then reports and polls `cancelled`.
  auto drain = [&]() -> absl::Status {
    if (absl::Status s = streams.SynchronizeAll(); !s.ok()) return s;
    landed(queued);
    queued = 0;
    if (cancelled && cancelled()) return absl::CancelledError("task cancelled");
    return absl::OkStatus();
  };
  for (const v1::CopyStep* step : hs.locals) {
    const int eb = task.plan().items(step->item()).element_bytes();
    const std::vector<int64_t> shape = ToVector(step->shape());
    const RankBuffer& src_buf = *hs.old_bufs.at(step->src_rank());
    const DeviceRankBuffer* src_dev = DeviceSourceOf(src_buf);
    const uint8_t* src_base = (src_dev != nullptr ? static_cast<const uint8_t*>(src_dev->data())
                                                  : const_cast<RankBuffer&>(src_buf).data()) +
                              src_buf.items()[step->item()].offset;
    for (const v1::Destination& d : step->dsts()) {
      const DeviceRankBuffer& dst = *made[hs.new_index.at(d.rank())];
      uint8_t* dst_base = static_cast<uint8_t*>(dst.data()) + dst.items()[step->item()].offset;
      absl::StatusOr<DeviceStream> stream = streams.Of(dst.device());
      if (!stream.ok()) return stream.status();
      absl::Status st;
      ForEachRun(shape, step->src().offset(), ToVector(step->src().strides()), d.region().offset(),
                 ToVector(d.region().strides()), [&](int64_t s, int64_t t, int64_t n) {
                   for (int64_t off = 0; off < n * eb && st.ok(); off += piece_bytes) {
                     const size_t bytes = static_cast<size_t>(std::min(piece_bytes, n * eb - off));
                     const uint8_t* from = src_base + s * eb + off;
                     uint8_t* to = dst_base + t * eb + off;
                     if (src_dev == nullptr) {
                       st = api->MemcpyAsync(to, from, bytes, CopyKind::kHostToDevice, *stream);
                     } else if (src_dev->device() == dst.device()) {
                       st = api->MemcpyAsync(to, from, bytes, CopyKind::kDeviceToDevice, *stream);
                     } else {
                       st = api->MemcpyPeerAsync(to, dst.device(), from, src_dev->device(), bytes,
                                                 *stream);
                     }
                     queued += static_cast<int64_t>(bytes);
                     if (st.ok() && queued >= piece_bytes) st = drain();
                   }
                 });
      if (!st.ok()) return st;
    }
  }
  return drain();
}

// Seals every new buffer (`keys`, `made`); the checksums of its non-empty
// items, as TaskExecutor::Execute returns them.
absl::StatusOr<std::vector<v1::ShardChecksum>> SealNewDeviceBuffers(
    DeviceBufferStore& devices, const std::vector<RankBufferKey>& keys,
    const std::vector<DeviceRankBufferPtr>& made, const std::function<bool()>& cancelled) {
  std::vector<v1::ShardChecksum> out;
  for (size_t k = 0; k < keys.size(); ++k) {
    if (cancelled && cancelled()) return absl::CancelledError("task cancelled");
    absl::StatusOr<std::vector<uint64_t>> sums = devices.Seal(keys[k], {});
    if (!sums.ok()) return sums.status();
    const auto& items = made[k]->items();
    for (size_t item = 0; item < items.size() && item < sums->size(); ++item) {
      if (items[item].bytes == 0) continue;
      v1::ShardChecksum c;
      c.set_item(static_cast<int>(item));
      c.set_rank(keys[k].rank);
      c.set_checksum((*sums)[item]);
      c.set_bytes(items[item].bytes);
      out.push_back(std::move(c));
    }
  }
  return out;
}

// Stages the sealed new buffers `keys` to host memory, where the placement
// keeps them, and drops their device copies; on failure none is left in
// host memory (the caller drops the device copies).
absl::Status StageNewBuffersToHost(ShardStore& store, DeviceBufferStore& devices,
                                   const std::vector<RankBufferKey>& keys) {
  for (const RankBufferKey& k : keys) {
    absl::StatusOr<RankBufferPtr> h = StageToHost(devices, store, k);
    if (!h.ok()) {
      for (const RankBufferKey& j : keys) store.Drop(j);
      return absl::Status(h.status().code(),
                          absl::StrCat("staging the new shard of rank ", k.rank,
                                       " to host memory: ", h.status().message()));
    }
  }
  for (const RankBufferKey& k : keys) devices.Drop(k);
  return absl::OkStatus();
}

// Prove and Move of the cross-host steps `hs.remotes` through `mover`
// once the new buffers `made` exist: the peers reached and proven
// (PreparePeersAndProve, as TaskRun::Prove), then the run's one transfer
// posted and polled to its completion, cancelled once `cancelled()` says so;
// `landed(bytes)` counts the bytes written here.
absl::Status ProveAndMoveCrossHost(Mover* mover, Transport* transport,
                                   const TaskExecutor::Options& options, const std::string& host_id,
                                   const v1::HostTask& task, const HostSteps& hs,
                                   const std::vector<DeviceRankBufferPtr>& made,
                                   const std::function<bool()>& cancelled,
                                   const std::function<void(const std::string& what)>& waiting,
                                   const std::function<void(int64_t bytes)>& landed) {
  if (absl::Status s = PreparePeersAndProve(mover, transport, options, host_id, task, hs.remotes,
                                            cancelled, waiting);
      !s.ok()) {
    return s;
  }
  MoverTransfer t;
  t.tag = TagBase(TaskTagKey(task));
  t.steps = &hs;
  t.made = &made;
  t.landed = landed;
  mover->Post(0, std::move(t));
  std::deque<MoverCompletion> done;
  bool cancel_sent = false;
  while (done.empty()) {
    if (!cancel_sent && cancelled && cancelled()) {
      mover->Cancel(TagBase(TaskTagKey(task)), kTagKeyMask);
      cancel_sent = true;
    }
    mover->Poll(kReportEvery, &done);
  }
  return done.front().second;
}

}  // namespace

absl::StatusOr<std::vector<v1::ShardChecksum>> RunOnDevices(
    ShardStore& store, DeviceBufferStore& devices, const TaskExecutor::Options& options,
    const std::string& host_id, const v1::HostTask& task, const DeviceRoute& route,
    const std::function<void(int64_t done, int64_t total)>& progress,
    const std::function<bool()>& cancelled, const std::vector<Mover*>& movers, Transport* transport,
    const std::function<void(const std::string& what)>& waiting) {
  const std::string& job = task.job_id();
  if (cancelled && cancelled()) return absl::CancelledError("task cancelled before it started");
  SourcesOfBothKinds sources(store, devices);
  absl::StatusOr<HostSteps> prepared = PrepareHostSteps(&sources, host_id, task);
  if (!prepared.ok()) {
    RESHARD_LOG(WARNING) << "operation " << task.operation_id() << " job " << job << " host "
                         << host_id << " rejected: " << prepared.status();
    return prepared.status();
  }
  const HostSteps& hs = *prepared;
  // Cross-host steps move device memory at both ends: the route's mover.
  Mover* mover = MoverFor(movers, MemoryKind::kCuda, MemoryKind::kCuda);
  if (!hs.remotes.empty() && mover == nullptr) {
    return absl::InternalError(
        absl::StrCat("operation ", task.operation_id(), ": the device path got cross-host steps"));
  }
  // Host sources are leased as in TaskRun; device sources are sealed and
  // never written again.
  HostSteps host_sources;
  for (const auto& [rank, b] : hs.old_bufs) {
    if (DeviceSourceOf(*b) == nullptr) host_sources.old_bufs.emplace(rank, b);
  }
  absl::StatusOr<std::vector<SourceLease>> leases = LeaseSources(host_sources);
  if (!leases.ok()) return leases.status();

  std::vector<RankBufferKey> keys;
  absl::StatusOr<std::vector<DeviceRankBufferPtr>> made =
      MakeNewDeviceBuffers(store, devices, task, hs, route, &keys);
  if (!made.ok()) return made.status();
  auto fail = [&](absl::Status s) {
    for (const RankBufferKey& k : keys) devices.Drop(k);
    RESHARD_LOG(WARNING) << "operation " << task.operation_id() << " job " << job << " host "
                         << host_id << " failed on the device path: " << s;
    return s;
  };

  int64_t done = 0;
  auto last_report = Clock::now();
  auto report = [&](bool force) {
    if (!progress) return;
    const auto now = Clock::now();
    if (force || now - last_report >= kReportEvery) {
      progress(done, hs.total_bytes);
      last_report = now;
    }
  };
  auto landed = [&](int64_t bytes) {
    done += bytes;
    report(false);
  };
  if (absl::Status s =
          CopyLocalsOnDevices(devices.api(), task, hs, *made,
                              std::max<int64_t>(options.local_chunk_bytes, 1), cancelled, landed);
      !s.ok()) {
    return fail(s);
  }
  // Zero fills: the new buffers were made zeroed.
  for (const v1::ZeroFill* f : hs.fills) {
    done += f->count() * task.plan().items(f->item()).element_bytes();
  }
  report(true);
  if (absl::Status s = CheckLeases(*leases, task); !s.ok()) return fail(s);
  if (mover != nullptr && !hs.remotes.empty()) {
    if (absl::Status s = ProveAndMoveCrossHost(mover, transport, options, host_id, task, hs, *made,
                                               cancelled, waiting, landed);
        !s.ok()) {
      return fail(s);
    }
    report(true);
  }

  absl::StatusOr<std::vector<v1::ShardChecksum>> out =
      SealNewDeviceBuffers(devices, keys, *made, cancelled);
  if (!out.ok()) return fail(out.status());
  if (!route.on_device) {
    // The placement keeps this host's new buffers in host memory.
    if (absl::Status s = StageNewBuffersToHost(store, devices, keys); !s.ok()) return fail(s);
  }
  RESHARD_LOG(INFO) << "operation " << task.operation_id() << " job " << job << " host " << host_id
                    << ": wrote " << keys.size() << " device rank buffers of generation "
                    << task.to_generation() << " (" << done << " bytes, " << RouteName(route.kind)
                    << ")";
  return out;
}

absl::StatusOr<std::vector<v1::ShardChecksum>> RunHostStaged(
    ShardStore& store, DeviceBufferStore& devices, const std::string& host_id,
    const v1::HostTask& task, const DeviceRoute& route,
    const std::function<void(const std::string& what)>& waiting,
    const std::function<absl::StatusOr<std::vector<v1::ShardChecksum>>()>& run_on_host) {
  const std::string& job = task.job_id();
  RESHARD_LOG(INFO) << "operation " << task.operation_id() << " job " << job << " host " << host_id
                    << ": host-staged: " << route.why;
  if (waiting) waiting(absl::StrCat("host-staged: ", route.why));
  // Device copies of the new generation left by an earlier attempt.
  for (const auto& [rank, device] : route.device_of) {
    devices.Drop(RankBufferKey{job, task.to_generation(), rank});
  }
  // Host copies of the device sources the task reads, for this task only.
  std::vector<RankBufferKey> staged;
  auto drop_staged = [&] {
    for (const RankBufferKey& k : staged) store.Drop(k);
  };
  for (int r : route.device_sources) {
    const RankBufferKey key{job, task.from_generation(), r};
    if (store.Get(key).ok()) continue;  // held in host memory too (not ours to drop)
    absl::StatusOr<RankBufferPtr> h = StageToHost(devices, store, key);
    if (!h.ok()) {
      drop_staged();
      return absl::Status(h.status().code(),
                          absl::StrCat("staging the old shard of rank ", r,
                                       " to host memory: ", h.status().message()));
    }
    staged.push_back(key);
  }
  absl::StatusOr<std::vector<v1::ShardChecksum>> result = run_on_host();
  drop_staged();
  if (!result.ok() || !route.on_device) return result;
  // The new buffers to their devices; their host copies go.
  std::vector<RankBufferKey> keys;
  for (const auto& [rank, device] : route.device_of) {
    keys.push_back(RankBufferKey{job, task.to_generation(), rank});
    absl::StatusOr<DeviceRankBufferPtr> d = StageToDevice(store, devices, keys.back(), device);
    if (!d.ok()) {
      for (const RankBufferKey& k : keys) devices.Drop(k);
      for (const auto& [r, dev] : route.device_of) {
        store.Drop(RankBufferKey{job, task.to_generation(), r});
      }
      RESHARD_LOG(WARNING) << "operation " << task.operation_id() << " job " << job << " host "
                           << host_id << " failed staging rank " << rank << " to device " << device
                           << ": " << d.status();
      return absl::Status(d.status().code(),
                          absl::StrCat("staging the new shard of rank ", rank, " to device ",
                                       device, ": ", d.status().message()));
    }
  }
  for (const RankBufferKey& k : keys) store.Drop(k);
  return result;
}

}  // namespace reshard::agent
