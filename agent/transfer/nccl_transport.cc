#include "agent/transfer/nccl_transport.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "agent/device/cuda_api.h"
#include "agent/device/cuda_libraries.h"

namespace reshard::agent {
namespace {

absl::Status FromCuda(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return absl::OkStatus();
  return absl::UnavailableError(absl::StrCat(what, ": ", Cudart()->GetErrorString(e)));
}

absl::Status FromNccl(ncclResult_t r, const char* what) {
  if (r == ncclSuccess) return absl::OkStatus();
  return absl::UnavailableError(absl::StrCat(what, ": ", Nccl()->GetErrorString(r)));
}

// Unavailable, saying why, when the library a call needs is not loaded.
absl::Status NotLoaded(const char* what) {
  return absl::UnavailableError(
      absl::StrCat(what, ": ", CudaLibraries::Get().state().error));
}

}  // namespace

int NcclDeviceCount() { return CudaLibraries::Get().state().device_count; }

absl::StatusOr<DeviceBuffer> DeviceBuffer::Allocate(int device, size_t bytes) {
  if (device < 0 || device >= NcclDeviceCount()) {
    return absl::UnavailableError(absl::StrCat("no CUDA device ", device));
  }
  const CudartApi* cuda = Cudart();
  DeviceBuffer b;
  absl::Status s = FromCuda(cuda->SetDevice(device), "cudaSetDevice");
  if (!s.ok()) return s;
  s = FromCuda(cuda->Malloc(&b.data_, bytes), "cudaMalloc");
  if (!s.ok()) return s;
  b.device_ = device;
  b.bytes_ = bytes;
  return b;
}

DeviceBuffer::DeviceBuffer(DeviceBuffer&& o) noexcept { *this = std::move(o); }

DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& o) noexcept {
  std::swap(device_, o.device_);
  std::swap(data_, o.data_);
  std::swap(bytes_, o.bytes_);
  return *this;
}

DeviceBuffer::~DeviceBuffer() {
  if (data_ != nullptr) {
    Cudart()->SetDevice(device_);
    Cudart()->Free(data_);
  }
}

absl::Status DeviceBuffer::CopyFromHost(const void* src, size_t bytes) {
  if (bytes > bytes_) return absl::InvalidArgumentError("copy larger than the device buffer");
  absl::Status s = FromCuda(Cudart()->SetDevice(device_), "cudaSetDevice");
  if (!s.ok()) return s;
  return FromCuda(Cudart()->Memcpy(data_, src, bytes, cudaMemcpyHostToDevice), "cudaMemcpy");
}

absl::Status DeviceBuffer::CopyToHost(void* dst, size_t bytes) const {
  if (bytes > bytes_) return absl::InvalidArgumentError("copy larger than the device buffer");
  absl::Status s = FromCuda(Cudart()->SetDevice(device_), "cudaSetDevice");
  if (!s.ok()) return s;
  return FromCuda(Cudart()->Memcpy(dst, data_, bytes, cudaMemcpyDeviceToHost), "cudaMemcpy");
}

absl::Status NcclPeerCopy(const DeviceBuffer& src, DeviceBuffer* dst, size_t bytes) {
  if (src.data() == nullptr || dst->data() == nullptr) {
    return absl::UnavailableError("NcclPeerCopy needs two allocated device buffers");
  }
  if (bytes > src.size() || bytes > dst->size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("NcclPeerCopy of ", bytes, " bytes exceeds a buffer"));
  }
  const CudartApi* cuda = Cudart();
  if (src.device() == dst->device()) {
    absl::Status s = FromCuda(cuda->SetDevice(src.device()), "cudaSetDevice");
    if (!s.ok()) return s;
    return FromCuda(cuda->Memcpy(dst->data(), src.data(), bytes, cudaMemcpyDeviceToDevice),
                    "cudaMemcpy");
  }
  const NcclApi* nccl = Nccl();
  if (nccl == nullptr) return NotLoaded("NcclPeerCopy");
  int devs[2] = {src.device(), dst->device()};
  ncclComm_t comms[2] = {nullptr, nullptr};
  absl::Status s = FromNccl(nccl->CommInitAll(comms, 2, devs), "ncclCommInitAll");
  if (!s.ok()) return s;
  cudaStream_t streams[2] = {nullptr, nullptr};
  for (int i = 0; i < 2 && s.ok(); ++i) {
    s = FromCuda(cuda->SetDevice(devs[i]), "cudaSetDevice");
    if (s.ok()) s = FromCuda(cuda->StreamCreate(&streams[i]), "cudaStreamCreate");
  }
  if (s.ok()) {
    s = FromNccl(nccl->GroupStart(), "ncclGroupStart");
    if (s.ok()) {
      absl::Status a =
          FromNccl(nccl->Send(src.data(), bytes, ncclUint8, 1, comms[0], streams[0]), "ncclSend");
      absl::Status b =
          FromNccl(nccl->Recv(dst->data(), bytes, ncclUint8, 0, comms[1], streams[1]), "ncclRecv");
      absl::Status e = FromNccl(nccl->GroupEnd(), "ncclGroupEnd");
      s = !a.ok() ? a : !b.ok() ? b : e;
    }
  }
  for (int i = 0; i < 2; ++i) {
    if (streams[i] == nullptr) continue;
    cuda->SetDevice(devs[i]);
    absl::Status w = FromCuda(cuda->StreamSynchronize(streams[i]), "cudaStreamSynchronize");
    if (s.ok()) s = w;
    cuda->StreamDestroy(streams[i]);
  }
  for (ncclComm_t c : comms) {
    if (c != nullptr) nccl->CommDestroy(c);
  }
  return s;
}

}  // namespace reshard::agent
