// WorkerService's CUDA IPC calls (worker_service.h): PublishDeviceShard
// copies the worker's device items into an agent-owned device buffer and
// seals it; OpenDeviceGeneration hands back a sealed device buffer's IPC
// handle (a host-resident rank is staged to device first).
#include <map>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "agent/process/coordinator_session.h"
#include "agent/process/worker_service.h"
#include "agent/shard_store/device_staging.h"
#include "common/log.h"
#include "common/rpc/status.h"

namespace reshard::agent {
namespace {

std::string KeyText(const RankBufferKey& key) {
  return absl::StrCat("job \"", key.job_id, "\" generation ", key.generation, " rank ", key.rank);
}

// "tensor \"w\"" / "blob \"step\"" / "item 7" for messages.
std::string ItemText(const v1::Ptc& ptc, int i) {
  if (i < ptc.tensors_size()) {
    return absl::StrCat("item ", i, " (tensor \"", ptc.tensors(i).name(), "\")");
  }
  if (i - ptc.tensors_size() < ptc.blobs_size()) {
    return absl::StrCat("item ", i, " (blob \"", ptc.blobs(i - ptc.tensors_size()).name(), "\")");
  }
  return absl::StrCat("item ", i);
}

}  // namespace

absl::Status WorkerServiceImpl::RequireDevices(const char* method) const {
  if (devices_ != nullptr && device_api_ != nullptr) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrCat(
      method,
      ": this agent has no device API (start reshard-agent with --device cuda, or "
      "RESHARD_DEVICE=cuda; fake[:N] for tests), so it holds no device buffers: publish and load "
      "through host memory instead (via=\"pinned\")"));
}

absl::Status WorkerServiceImpl::CopyDeviceItems(const v1::PublishDeviceShardRequest& req,
                                                const DeviceRankBuffer& buffer, int64_t peer_pid) {
  const int device = buffer.device();
  absl::StatusOr<DeviceStream> stream = device_api_->CreateStream(device);
  if (!stream.ok()) return stream.status();
  // One IpcOpen per allocation: a worker's items often share one block of
  // its caching allocator.
  std::map<std::string, void*> opened;
  absl::Status status;
  for (int i = 0; i < req.items_size() && status.ok(); ++i) {
    const v1::DeviceItem& item = req.items(i);
    if (item.bytes() == 0) continue;
    auto it = opened.find(item.ipc_handle());
    if (it == opened.end()) {
      absl::StatusOr<void*> base = device_api_->IpcOpenFrom(device, item.ipc_handle(), peer_pid);
      if (!base.ok()) {
        status = absl::Status(base.status().code(),
                              absl::StrCat("item ", i, ": ", base.status().message()));
        break;
      }
      it = opened.emplace(item.ipc_handle(), *base).first;
    }
    // The worker names the offset: bounded by the allocation it exported,
    // or the agent would read another allocation's (another job's) bytes.
    absl::StatusOr<size_t> size = device_api_->AllocationSize(device, it->second);
    if (!size.ok()) {
      status = absl::Status(size.status().code(),
                            absl::StrCat("item ", i, ": ", size.status().message()));
      break;
    }
    const auto offset = static_cast<uint64_t>(item.offset());
    const auto bytes = static_cast<uint64_t>(item.bytes());
    if (offset > *size || bytes > *size - offset) {
      status =
          absl::InvalidArgumentError(absl::StrCat("item ", i, ": offset ", offset, " + ", bytes,
                                                  " bytes passes the end of its IPC "
                                                  "handle's allocation (",
                                                  *size, " bytes)"));
      break;
    }
    void* dst = static_cast<char*>(buffer.data()) + buffer.items()[i].offset;
    const void* src = static_cast<const char*>(it->second) + item.offset();
    status = device_api_->MemcpyAsync(dst, src, static_cast<size_t>(item.bytes()),
                                      CopyKind::kDeviceToDevice, *stream);
    if (!status.ok()) {
      status = absl::Status(status.code(), absl::StrCat("item ", i, ": ", status.message()));
    }
  }
  if (absl::Status s = device_api_->StreamSynchronize(*stream); status.ok()) status = s;
  for (const auto& [handle, base] : opened) {
    if (absl::Status s = device_api_->IpcClose(device, base); status.ok()) status = s;
  }
  if (absl::Status s = device_api_->DestroyStream(*stream); status.ok()) status = s;
  return status;
}

grpc::Status WorkerServiceImpl::DoPublishDeviceShard(const v1::PublishDeviceShardRequest* req,
                                                     v1::PublishDeviceShardResponse* resp,
                                                     int64_t peer_pid) {
  if (absl::Status s = RequireDevices("PublishDeviceShard"); !s.ok()) return rpc::ToGrpc(s);
  const RankBufferKey key{req->job_id(), req->generation(), req->rank()};
  const int device_count = device_api_->capabilities().device_count;
  if (req->device() < 0 || req->device() >= device_count) {
    return rpc::ToGrpc(absl::InvalidArgumentError(absl::StrCat(
        KeyText(key), ": device ", req->device(), " out of range: the agent's ",
        device_api_->capabilities().name, " device API has ", device_count, " devices")));
  }
  // As PublishShard: a rank held here already is sealed (immutable) or an
  // operation's; one in the device store unsealed is another publish's.
  if (absl::StatusOr<DeviceRankBufferPtr> existing = devices_->Get(key); existing.ok()) {
    if ((*existing)->sealed()) {
      return rpc::ToGrpc(absl::FailedPreconditionError(
          absl::StrCat(KeyText(key), " is sealed: a sealed generation cannot be published again")));
    }
    return rpc::ToGrpc(absl::AlreadyExistsError(
        absl::StrCat(KeyText(key), " is being written on device ", (*existing)->device(),
                     " (another publish of the rank, or an operation)")));
  }
  if (absl::StatusOr<RankBufferPtr> host = store_->Get(key); host.ok()) {
    return rpc::ToGrpc(absl::FailedPreconditionError(absl::StrCat(
        KeyText(key), (*host)->sealed()
                          ? " is sealed: a sealed generation cannot be published again"
                          : " has a host buffer here (published through PublishShard, or "
                            "written by an operation)")));
  }
  absl::StatusOr<std::shared_ptr<const JobGeneration>> jg =
      PublishLayout(req->job_id(), req->generation(), req->rank());
  if (!jg.ok()) return rpc::ToGrpc(jg.status());
  const std::vector<int64_t> bytes = RankItemBytes((*jg)->ptc, (*jg)->layout, req->rank());
  if (req->items_size() != static_cast<int>(bytes.size())) {
    return rpc::ToGrpc(absl::InvalidArgumentError(
        absl::StrCat(KeyText(key), ": ", req->items_size(), " device items, the layout has ",
                     bytes.size(), " (tensors in order, then blobs)")));
  }
  for (int i = 0; i < req->items_size(); ++i) {
    const v1::DeviceItem& item = req->items(i);
    if (item.bytes() != bytes[i]) {
      return rpc::ToGrpc(absl::InvalidArgumentError(
          absl::StrCat(KeyText(key), ": ", ItemText((*jg)->ptc, i), " has ", item.bytes(),
                       " bytes, the layout gives the rank ", bytes[i])));
    }
    if (item.offset() < 0 || (item.bytes() > 0 && item.ipc_handle().empty())) {
      return rpc::ToGrpc(absl::InvalidArgumentError(
          absl::StrCat(KeyText(key), ": ", ItemText((*jg)->ptc, i), ": offset ", item.offset(),
                       item.ipc_handle().empty() ? " and no IPC handle" : " is negative")));
    }
  }
  absl::StatusOr<std::vector<DeviceRankBufferPtr>> created =
      devices_->CreateAll({key}, {req->device()}, {bytes});
  if (!created.ok()) return rpc::ToGrpc(created.status());
  const DeviceRankBufferPtr buffer = (*created)[0];
  // Copied on seal: the sealed generation is the agent's, whatever the
  // worker does with its tensors next.
  absl::Status copied = CopyDeviceItems(*req, *buffer, peer_pid);
  absl::StatusOr<std::vector<uint64_t>> sums = std::vector<uint64_t>();
  if (!copied.ok()) {
    sums = copied;
  } else {
    sums = devices_->Seal(key, std::vector<uint64_t>(req->expected_checksums().begin(),
                                                     req->expected_checksums().end()));
  }
  if (!sums.ok()) {
    devices_->Drop(key);  // the worker may publish again
    return rpc::ToGrpc(absl::Status(sums.status().code(),
                                    absl::StrCat(KeyText(key), ": ", sums.status().message())));
  }
  for (uint64_t c : *sums) resp->add_checksums(c);
  resp->set_device(buffer->device());
  return grpc::Status::OK;
}

grpc::Status WorkerServiceImpl::DoOpenDeviceGeneration(const v1::OpenDeviceGenerationRequest* req,
                                                       v1::OpenDeviceGenerationResponse* resp) {
  if (absl::Status s = RequireDevices("OpenDeviceGeneration"); !s.ok()) return rpc::ToGrpc(s);
  const RankBufferKey key{req->job_id(), req->generation(), req->rank()};
  absl::StatusOr<DeviceRankBufferPtr> buf = devices_->Get(key);
  if (absl::IsNotFound(buf.status())) {
    // A host-resident rank: staged to a device (rank mod device count),
    // sealed with the host buffer's checksums.
    absl::StatusOr<RankBufferPtr> host = store_->Get(key);
    if (!host.ok()) return rpc::ToGrpc(host.status());
    if (absl::Status s = CheckLoadable(key, **host); !s.ok()) return rpc::ToGrpc(s);
    const int device_count = device_api_->capabilities().device_count;
    buf = StageToDevice(*store_, *devices_, key, req->rank() % device_count);
  }
  if (!buf.ok()) return rpc::ToGrpc(buf.status());
  if (!(*buf)->sealed()) {
    return rpc::ToGrpc(absl::FailedPreconditionError(absl::StrCat(KeyText(key), " is not sealed")));
  }
  absl::StatusOr<std::string> handle = device_api_->IpcExport((*buf)->device(), (*buf)->data());
  if (!handle.ok()) return rpc::ToGrpc(handle.status());
  absl::StatusOr<std::shared_ptr<const JobGeneration>> jg =
      Lookup(req->job_id(), req->generation(), /*require_current=*/false);
  resp->set_device((*buf)->device());
  resp->set_ipc_handle(*handle);
  resp->set_size((*buf)->size());
  DescribeItems(jg.ok() ? jg->get() : nullptr, req->rank(), (*buf)->items(),
                resp->mutable_items());
  for (uint64_t c : (*buf)->checksums()) resp->add_checksums(c);
  return grpc::Status::OK;
}

}  // namespace reshard::agent
