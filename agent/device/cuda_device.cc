#include "agent/device/cuda_device.h"

#include <cstring>

#include "absl/strings/str_cat.h"
#include "agent/device/cuda_api.h"
#include "agent/device/cuda_libraries.h"

namespace reshard::agent {
namespace {

cudaMemcpyKind ToCuda(CopyKind kind) {
  switch (kind) {
    case CopyKind::kHostToDevice:
      return cudaMemcpyHostToDevice;
    case CopyKind::kDeviceToHost:
      return cudaMemcpyDeviceToHost;
    case CopyKind::kDeviceToDevice:
      return cudaMemcpyDeviceToDevice;
  }
  return cudaMemcpyDeviceToDevice;
}

cudaStream_t Raw(DeviceStream s) { return static_cast<cudaStream_t>(s.impl); }

}  // namespace

absl::StatusOr<std::unique_ptr<DeviceApi>> CudaDeviceApi::Create() {
  const CudaLibraryState& s = CudaLibraries::Get().state();
  if (!s.cudart_loaded) {
    return absl::FailedPreconditionError(absl::StrCat("CUDA device API: ", s.error));
  }
  if (s.device_count <= 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("CUDA device API: no CUDA device (", CudaLibraries::Get().Describe(), ")"));
  }
  return std::unique_ptr<DeviceApi>(new CudaDeviceApi(s.device_count));
}

DeviceApiCapabilities CudaDeviceApi::capabilities() const {
  DeviceApiCapabilities c;
  c.name = "cuda";
  c.device_count = devices_;
  c.ipc = true;
  c.peer_copy = devices_ > 1;
  return c;
}

absl::Status CudaDeviceApi::Check(int rc, const char* call, int device, size_t bytes) const {
  if (rc == cudaSuccess) return absl::OkStatus();
  Cudart()->GetLastError();  // reset the last error: a later call must not report this one
  std::string msg = absl::StrCat(call, " (CUDA device ", device, ", ", bytes,
                                 " bytes): ", Cudart()->GetErrorString(rc), " (", rc, ")");
  if (rc == cudaErrorMemoryAllocation) return absl::ResourceExhaustedError(msg);
  return absl::UnavailableError(msg);
}

absl::Status CudaDeviceApi::Use(const char* call, int device) const {
  if (device < 0 || device >= devices_) {
    return absl::InvalidArgumentError(
        absl::StrCat(call, ": CUDA device ", device, " out of range [0, ", devices_, ")"));
  }
  return Check(Cudart()->SetDevice(device), "cudaSetDevice", device, 0);
}

absl::StatusOr<void*> CudaDeviceApi::Malloc(int device, size_t bytes) {
  if (absl::Status s = Use("cudaMalloc", device); !s.ok()) return s;
  void* p = nullptr;
  if (bytes == 0) return p;
  if (absl::Status s = Check(Cudart()->Malloc(&p, bytes), "cudaMalloc", device, bytes); !s.ok()) {
    return s;
  }
  return p;
}

absl::Status CudaDeviceApi::Free(int device, void* ptr) {
  if (absl::Status s = Use("cudaFree", device); !s.ok()) return s;
  return Check(Cudart()->Free(ptr), "cudaFree", device, 0);
}

absl::StatusOr<DeviceMemoryInfo> CudaDeviceApi::MemoryInfo(int device) {
  if (absl::Status s = Use("cudaMemGetInfo", device); !s.ok()) return s;
  size_t free_bytes = 0, total = 0;
  if (absl::Status s = Check(Cudart()->MemGetInfo(&free_bytes, &total), "cudaMemGetInfo", device,
                             0);
      !s.ok()) {
    return s;
  }
  return DeviceMemoryInfo{static_cast<int64_t>(free_bytes), static_cast<int64_t>(total)};
}

absl::StatusOr<DeviceStream> CudaDeviceApi::CreateStream(int device) {
  if (absl::Status s = Use("cudaStreamCreate", device); !s.ok()) return s;
  cudaStream_t raw = nullptr;
  if (absl::Status s = Check(Cudart()->StreamCreate(&raw), "cudaStreamCreate", device, 0);
      !s.ok()) {
    return s;
  }
  return DeviceStream{raw, device};
}

absl::Status CudaDeviceApi::DestroyStream(DeviceStream stream) {
  if (absl::Status s = StreamSynchronize(stream); !s.ok()) return s;
  return Check(Cudart()->StreamDestroy(Raw(stream)), "cudaStreamDestroy", stream.device, 0);
}

absl::Status CudaDeviceApi::MemcpyAsync(void* dst, const void* src, size_t bytes, CopyKind kind,
                                        DeviceStream stream) {
  if (absl::Status s = Use("cudaMemcpyAsync", stream.device); !s.ok()) return s;
  return Check(Cudart()->MemcpyAsync(dst, src, bytes, ToCuda(kind), Raw(stream)),
               "cudaMemcpyAsync", stream.device, bytes);
}

absl::Status CudaDeviceApi::MemcpyPeerAsync(void* dst, int dst_device, const void* src,
                                            int src_device, size_t bytes, DeviceStream stream) {
  if (absl::Status s = Use("cudaMemcpyPeerAsync", stream.device); !s.ok()) return s;
  return Check(Cudart()->MemcpyPeerAsync(dst, dst_device, src, src_device, bytes, Raw(stream)),
               "cudaMemcpyPeerAsync", stream.device, bytes);
}

absl::Status CudaDeviceApi::MemsetAsync(void* dst, int value, size_t bytes, DeviceStream stream) {
  if (absl::Status s = Use("cudaMemsetAsync", stream.device); !s.ok()) return s;
  return Check(Cudart()->MemsetAsync(dst, value, bytes, Raw(stream)), "cudaMemsetAsync",
               stream.device, bytes);
}

absl::Status CudaDeviceApi::StreamSynchronize(DeviceStream stream) {
  if (absl::Status s = Use("cudaStreamSynchronize", stream.device); !s.ok()) return s;
  return Check(Cudart()->StreamSynchronize(Raw(stream)), "cudaStreamSynchronize", stream.device,
               0);
}

absl::StatusOr<void*> CudaDeviceApi::MallocHost(size_t bytes) {
  void* p = nullptr;
  if (absl::Status s = Check(Cudart()->MallocHost(&p, bytes), "cudaMallocHost", -1, bytes);
      !s.ok()) {
    return s;
  }
  return p;
}

absl::Status CudaDeviceApi::FreeHost(void* ptr) {
  return Check(Cudart()->FreeHost(ptr), "cudaFreeHost", -1, 0);
}

absl::StatusOr<std::string> CudaDeviceApi::IpcExport(int device, void* ptr) {
  if (absl::Status s = Use("cudaIpcGetMemHandle", device); !s.ok()) return s;
  cudaIpcMemHandle_t h{};
  if (absl::Status s = Check(Cudart()->IpcGetMemHandle(&h, ptr), "cudaIpcGetMemHandle", device, 0);
      !s.ok()) {
    return s;
  }
  return std::string(h.reserved, sizeof(h.reserved));
}

absl::StatusOr<void*> CudaDeviceApi::IpcOpen(int device, const std::string& handle) {
  if (absl::Status s = Use("cudaIpcOpenMemHandle", device); !s.ok()) return s;
  cudaIpcMemHandle_t h{};
  if (handle.size() != sizeof(h.reserved)) {
    return absl::InvalidArgumentError(absl::StrCat("cudaIpcOpenMemHandle (CUDA device ", device,
                                                   "): a handle has 64 bytes, not ",
                                                   handle.size()));
  }
  std::memcpy(h.reserved, handle.data(), sizeof(h.reserved));
  void* p = nullptr;
  if (absl::Status s = Check(Cudart()->IpcOpenMemHandle(&p, h, cudaIpcMemLazyEnablePeerAccess),
                             "cudaIpcOpenMemHandle", device, 0);
      !s.ok()) {
    return s;
  }
  return p;
}

absl::Status CudaDeviceApi::IpcClose(int device, void* ptr) {
  if (absl::Status s = Use("cudaIpcCloseMemHandle", device); !s.ok()) return s;
  return Check(Cudart()->IpcCloseMemHandle(ptr), "cudaIpcCloseMemHandle", device, 0);
}

absl::StatusOr<size_t> CudaDeviceApi::AllocationSize(int device, const void* ptr) {
  if (absl::Status s = Use("cuMemGetAddressRange", device); !s.ok()) return s;
  const CuDriverApi* driver = CuDriver();
  if (driver == nullptr) {
    return absl::FailedPreconditionError(absl::StrCat(
        "cuMemGetAddressRange (CUDA device ", device,
        "): the CUDA driver (libcuda.so.1) is not loaded, so an allocation's size is unknown"));
  }
  CUdeviceptr base = 0;
  size_t size = 0;
  const auto p = reinterpret_cast<CUdeviceptr>(ptr);
  if (CUresult rc = driver->MemGetAddressRange(&base, &size, p); rc != CUDA_SUCCESS) {
    const char* text = nullptr;
    if (driver->GetErrorString(rc, &text) != CUDA_SUCCESS || text == nullptr) text = "unknown";
    return absl::InvalidArgumentError(absl::StrCat("cuMemGetAddressRange (CUDA device ", device,
                                                   "): 0x", absl::Hex(p),
                                                   " is in no allocation: ", text, " (", rc, ")"));
  }
  if (p < base || p - base > size) {
    return absl::InvalidArgumentError(absl::StrCat("cuMemGetAddressRange (CUDA device ", device,
                                                   "): 0x", absl::Hex(p), " is outside [0x",
                                                   absl::Hex(base), ", +", size, ")"));
  }
  return static_cast<size_t>(base + size - p);
}

}  // namespace reshard::agent
