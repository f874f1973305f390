#include "agent/executor/device_buffers.h"

#include <algorithm>
#include <map>
#include <utility>

#include "absl/strings/str_cat.h"
#include "agent/executor/step_chunks.h"
#include "agent/shard_store/device_staging.h"
#include "common/log.h"

namespace reshard::agent {
namespace {

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

std::unique_ptr<ShardStore> SourcesOfBothKindsIn(ShardStore& host, DeviceBufferStore& devices) {
  return std::make_unique<SourcesOfBothKinds>(host, devices);
}

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

absl::StatusOr<std::vector<DeviceRankBufferPtr>> MakeNewDeviceBuffers(
    ShardStore& store, DeviceBufferStore& devices, const v1::HostTask& task, const HostSteps& hs,
    const std::map<int, int>& device_of, std::vector<RankBufferKey>* keys) {
  std::vector<int> on;
  for (int r : hs.new_ranks) {
    keys->push_back(RankBufferKey{task.job_id(), task.to_generation(), r});
    on.push_back(device_of.at(r));
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

}  // namespace reshard::agent
