// Internal to agent/device and agent/transfer (only their .cc files include it): the part of the
// CUDA runtime's and NCCL's C ABI that reshard calls, and the entry points
// CudaLibraries (cuda_libraries.h) resolved with dlsym. Declared here rather
// than taken from cuda_runtime_api.h / nccl.h: the wheels torch brings hold
// the libraries and nccl.h but not the CUDA headers' crt/ part, and nothing
// else needs a toolkit at build time. Values are those of CUDA 12/13's
// driver_types.h and NCCL 2.x's nccl.h (stable ABI). A null table means the
// library is not loaded.
#pragma once

#include <cstddef>

namespace reshard::agent {

// cuda_runtime_api.h / driver_types.h
using cudaError_t = int;
inline constexpr cudaError_t cudaSuccess = 0;
using cudaStream_t = struct CUstream_st*;
enum cudaMemcpyKind : int {
  cudaMemcpyHostToHost = 0,
  cudaMemcpyHostToDevice = 1,
  cudaMemcpyDeviceToHost = 2,
  cudaMemcpyDeviceToDevice = 3,
};
inline constexpr cudaError_t cudaErrorMemoryAllocation = 2;
/// cudaIpcMemHandle_t: 64 opaque bytes, passed by value.
struct cudaIpcMemHandle_t {
  char reserved[64];
};
inline constexpr unsigned int cudaIpcMemLazyEnablePeerAccess = 1;

// nccl.h
using ncclResult_t = int;
inline constexpr ncclResult_t ncclSuccess = 0;
using ncclComm_t = struct ncclComm*;
enum ncclDataType_t : int { ncclUint8 = 1 };
/// ncclUniqueId: NCCL_UNIQUE_ID_BYTES (128) opaque bytes, passed by value.
struct ncclUniqueId {
  char internal[128];
};
inline constexpr ncclResult_t ncclInProgress = 7;
/// ncclConfig_t as NCCL 2.14 (the first with it) laid it out; later NCCLs
/// read a config up to its `size`/`version`. Set as NCCL_CONFIG_INITIALIZER:
/// size = sizeof, magic = kNcclApiMagic, version = kNcclConfigVersion, every
/// other field kNcclConfigUndefInt / nullptr.
struct ncclConfig_v21400 {
  size_t size;
  unsigned int magic;
  unsigned int version;
  int blocking;
  int cgaClusterSize;
  int minCTAs;
  int maxCTAs;
  const char* netName;
};
inline constexpr unsigned int kNcclApiMagic = 0xcafebeef;
inline constexpr unsigned int kNcclConfigVersion = 21400;    // NCCL_VERSION(2, 14, 0)
inline constexpr int kNcclConfigUndefInt = -2147483647 - 1;  // INT_MIN

struct CudartApi {
  cudaError_t (*GetDeviceCount)(int*);
  cudaError_t (*SetDevice)(int);
  cudaError_t (*Malloc)(void**, size_t);
  cudaError_t (*Free)(void*);
  cudaError_t (*Memcpy)(void*, const void*, size_t, cudaMemcpyKind);
  cudaError_t (*StreamCreate)(cudaStream_t*);
  cudaError_t (*StreamSynchronize)(cudaStream_t);
  cudaError_t (*StreamDestroy)(cudaStream_t);
  const char* (*GetErrorString)(cudaError_t);
  cudaError_t (*GetLastError)();
  cudaError_t (*RuntimeGetVersion)(int*);
  cudaError_t (*DriverGetVersion)(int*);
  // The device API (cuda_device.h).
  cudaError_t (*MemcpyAsync)(void*, const void*, size_t, cudaMemcpyKind, cudaStream_t);
  cudaError_t (*MemcpyPeerAsync)(void*, int, const void*, int, size_t, cudaStream_t);
  cudaError_t (*MemsetAsync)(void*, int, size_t, cudaStream_t);
  cudaError_t (*MemGetInfo)(size_t*, size_t*);
  cudaError_t (*MallocHost)(void**, size_t);
  cudaError_t (*FreeHost)(void*);
  cudaError_t (*IpcGetMemHandle)(cudaIpcMemHandle_t*, void*);
  cudaError_t (*IpcOpenMemHandle)(void**, cudaIpcMemHandle_t, unsigned int);
  cudaError_t (*IpcCloseMemHandle)(void*);
};

struct NcclApi {
  ncclResult_t (*GetVersion)(int*);
  const char* (*GetErrorString)(ncclResult_t);
  ncclResult_t (*CommInitAll)(ncclComm_t*, int, const int*);
  ncclResult_t (*CommDestroy)(ncclComm_t);
  ncclResult_t (*GroupStart)();
  ncclResult_t (*GroupEnd)();
  ncclResult_t (*Send)(const void*, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t);
  ncclResult_t (*Recv)(void*, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t);
  // Communicators between processes (nccl_comm.h).
  ncclResult_t (*GetUniqueId)(ncclUniqueId*);
  ncclResult_t (*CommInitRank)(ncclComm_t*, int, ncclUniqueId, int);
  ncclResult_t (*CommAbort)(ncclComm_t);
  ncclResult_t (*CommGetAsyncError)(ncclComm_t, ncclResult_t*);
  // Optional (NCCL >= 2.14; null when missing): a non-blocking init.
  ncclResult_t (*CommInitRankConfig)(ncclComm_t*, int, ncclUniqueId, int, ncclConfig_v21400*);
};

// cuda.h (the driver, libcuda.so.1): what the runtime does not offer.
using CUresult = int;
inline constexpr CUresult CUDA_SUCCESS = 0;
using CUdeviceptr = unsigned long long;  // NOLINT(runtime/int): cuda.h's type

struct CuDriverApi {
  /// cuMemGetAddressRange_v2(base, size, ptr): the allocation holding ptr
  /// (in the current context: cudaSetDevice makes the device's current).
  CUresult (*MemGetAddressRange)(CUdeviceptr*, size_t*, CUdeviceptr);
  CUresult (*GetErrorString)(CUresult, const char**);
};

/// The loaded runtime's entry points, or nullptr when libcudart is not loaded.
const CudartApi* Cudart();
/// The driver's entry points (libcuda.so.1), or nullptr when not loaded.
const CuDriverApi* CuDriver();
/// The loaded NCCL's entry points, or nullptr when libnccl is not loaded.
const NcclApi* Nccl();

}  // namespace reshard::agent
