#include "agent/transfer/nccl_transport.h"

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <utility>

#include "absl/strings/str_cat.h"

namespace reshard::agent {
namespace {

absl::Status FromCuda(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return absl::OkStatus();
  return absl::UnavailableError(absl::StrCat(what, ": ", cudaGetErrorString(e)));
}

absl::Status FromNccl(ncclResult_t r, const char* what) {
  if (r == ncclSuccess) return absl::OkStatus();
  return absl::UnavailableError(absl::StrCat(what, ": ", ncclGetErrorString(r)));
}

}  // namespace

int NcclDeviceCount() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky error
    return 0;
  }
  return n;
}

absl::StatusOr<DeviceBuffer> DeviceBuffer::Allocate(int device, size_t bytes) {
  if (device < 0 || device >= NcclDeviceCount()) {
    return absl::UnavailableError(absl::StrCat("no CUDA device ", device));
  }
  DeviceBuffer b;
  absl::Status s = FromCuda(cudaSetDevice(device), "cudaSetDevice");
  if (!s.ok()) return s;
  s = FromCuda(cudaMalloc(&b.data_, bytes), "cudaMalloc");
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
    cudaSetDevice(device_);
    cudaFree(data_);
  }
}

absl::Status DeviceBuffer::CopyFromHost(const void* src, size_t bytes) {
  if (bytes > bytes_) return absl::InvalidArgumentError("copy larger than the device buffer");
  absl::Status s = FromCuda(cudaSetDevice(device_), "cudaSetDevice");
  if (!s.ok()) return s;
  return FromCuda(cudaMemcpy(data_, src, bytes, cudaMemcpyHostToDevice), "cudaMemcpy");
}

absl::Status DeviceBuffer::CopyToHost(void* dst, size_t bytes) const {
  if (bytes > bytes_) return absl::InvalidArgumentError("copy larger than the device buffer");
  absl::Status s = FromCuda(cudaSetDevice(device_), "cudaSetDevice");
  if (!s.ok()) return s;
  return FromCuda(cudaMemcpy(dst, data_, bytes, cudaMemcpyDeviceToHost), "cudaMemcpy");
}

absl::Status NcclPeerCopy(const DeviceBuffer& src, DeviceBuffer* dst, size_t bytes) {
  if (src.data() == nullptr || dst->data() == nullptr) {
    return absl::UnavailableError("NcclPeerCopy needs two allocated device buffers");
  }
  if (bytes > src.size() || bytes > dst->size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("NcclPeerCopy of ", bytes, " bytes exceeds a buffer"));
  }
  if (src.device() == dst->device()) {
    absl::Status s = FromCuda(cudaSetDevice(src.device()), "cudaSetDevice");
    if (!s.ok()) return s;
    return FromCuda(cudaMemcpy(dst->data(), src.data(), bytes, cudaMemcpyDeviceToDevice),
                    "cudaMemcpy");
  }
  int devs[2] = {src.device(), dst->device()};
  ncclComm_t comms[2] = {nullptr, nullptr};
  absl::Status s = FromNccl(ncclCommInitAll(comms, 2, devs), "ncclCommInitAll");
  if (!s.ok()) return s;
  cudaStream_t streams[2] = {nullptr, nullptr};
  for (int i = 0; i < 2 && s.ok(); ++i) {
    s = FromCuda(cudaSetDevice(devs[i]), "cudaSetDevice");
    if (s.ok()) s = FromCuda(cudaStreamCreate(&streams[i]), "cudaStreamCreate");
  }
  if (s.ok()) {
    s = FromNccl(ncclGroupStart(), "ncclGroupStart");
    if (s.ok()) {
      absl::Status a =
          FromNccl(ncclSend(src.data(), bytes, ncclUint8, 1, comms[0], streams[0]), "ncclSend");
      absl::Status b =
          FromNccl(ncclRecv(dst->data(), bytes, ncclUint8, 0, comms[1], streams[1]), "ncclRecv");
      absl::Status e = FromNccl(ncclGroupEnd(), "ncclGroupEnd");
      s = !a.ok() ? a : !b.ok() ? b : e;
    }
  }
  for (int i = 0; i < 2; ++i) {
    if (streams[i] == nullptr) continue;
    cudaSetDevice(devs[i]);
    absl::Status w = FromCuda(cudaStreamSynchronize(streams[i]), "cudaStreamSynchronize");
    if (s.ok()) s = w;
    cudaStreamDestroy(streams[i]);
  }
  for (ncclComm_t c : comms) {
    if (c != nullptr) ncclCommDestroy(c);
  }
  return s;
}

}  // namespace reshard::agent
