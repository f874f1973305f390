#include "agent/device/cuda_libraries.h"

#include <dlfcn.h>

#include <cstdlib>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "agent/device/cuda_api.h"

#ifndef RESHARD_CUDA_LIBRARY_DIRS
#define RESHARD_CUDA_LIBRARY_DIRS ""
#endif

namespace reshard::agent {
namespace {

struct Loaded {
  CudartApi cudart{};
  NcclApi nccl{};
  CuDriverApi driver{};
  bool have_driver = false;
  bool have_cudart = false;
  bool have_nccl = false;
};

Loaded& Tables() {
  static Loaded loaded;
  return loaded;
}

// dlopen of the first soname found in a search directory, then by the
// dynamic linker's own search. Returns the handle and the path taken.
std::pair<void*, std::string> Open(const std::vector<std::string>& dirs,
                                   std::initializer_list<const char*> sonames,
                                   std::string* error) {
  for (const std::string& dir : dirs) {
    for (const char* soname : sonames) {
      std::string path = absl::StrCat(dir, "/", soname);
      if (void* h = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL)) return {h, path};
    }
  }
  for (const char* soname : sonames) {
    if (void* h = dlopen(soname, RTLD_NOW | RTLD_LOCAL)) return {h, soname};
  }
  const char* e = dlerror();
  *error = absl::StrCat(absl::StrJoin(sonames, ", "), " not found in [",
                        absl::StrJoin(dirs, ":"), "] or the linker's path",
                        e != nullptr ? absl::StrCat(" (", e, ")") : "");
  return {nullptr, ""};
}

// *out = the symbol `name` of `lib`; false (naming the first missing symbol
// in *error) when it is missing.
template <typename Fn>
bool Resolve(void* lib, const char* name, Fn* out, std::string* error) {
  *out = reinterpret_cast<Fn>(dlsym(lib, name));
  if (*out == nullptr && error->empty()) *error = absl::StrCat(name, " missing");
  return *out != nullptr;
}

// 13000 -> "13.0" (cudaRuntimeGetVersion, cudaDriverGetVersion).
std::string CudaVersion(int v) { return absl::StrCat(v / 1000, ".", (v % 1000) / 10); }

// 22809 -> "2.28.9" (ncclGetVersion since NCCL 2.9).
std::string NcclVersion(int v) {
  return absl::StrCat(v / 10000, ".", (v % 10000) / 100, ".", v % 100);
}

}  // namespace

const CudartApi* Cudart() {
  CudaLibraries::Get();
  return Tables().have_cudart ? &Tables().cudart : nullptr;
}

const CuDriverApi* CuDriver() {
  CudaLibraries::Get();
  return Tables().have_driver ? &Tables().driver : nullptr;
}

const NcclApi* Nccl() {
  CudaLibraries::Get();
  return Tables().have_nccl ? &Tables().nccl : nullptr;
}

std::vector<std::string> CudaLibraries::SearchDirectories() {
  std::vector<std::string> dirs;
  if (const char* env = std::getenv("RESHARD_CUDA_LIBRARY_PATH")) {
    for (absl::string_view d : absl::StrSplit(env, ':', absl::SkipEmpty())) {
      dirs.emplace_back(d);
    }
  }
  for (absl::string_view d : absl::StrSplit(RESHARD_CUDA_LIBRARY_DIRS, ':', absl::SkipEmpty())) {
    dirs.emplace_back(d);
  }
  return dirs;
}

const CudaLibraries& CudaLibraries::Get() {
  static const CudaLibraries* libs = new CudaLibraries();  // never unloaded
  return *libs;
}

CudaLibraries::CudaLibraries() {
  const std::vector<std::string> dirs = SearchDirectories();
  Loaded& t = Tables();
  std::string cudart_error, nccl_error;
  auto [cudart, cudart_path] =
      Open(dirs, {"libcudart.so.13", "libcudart.so.12", "libcudart.so"}, &cudart_error);
  if (cudart != nullptr) {
    CudartApi& a = t.cudart;
    bool ok = Resolve(cudart, "cudaGetDeviceCount", &a.GetDeviceCount, &cudart_error) &
              Resolve(cudart, "cudaSetDevice", &a.SetDevice, &cudart_error) &
              Resolve(cudart, "cudaMalloc", &a.Malloc, &cudart_error) &
              Resolve(cudart, "cudaFree", &a.Free, &cudart_error) &
              Resolve(cudart, "cudaMemcpy", &a.Memcpy, &cudart_error) &
              Resolve(cudart, "cudaStreamCreate", &a.StreamCreate, &cudart_error) &
              Resolve(cudart, "cudaStreamSynchronize", &a.StreamSynchronize, &cudart_error) &
              Resolve(cudart, "cudaStreamDestroy", &a.StreamDestroy, &cudart_error) &
              Resolve(cudart, "cudaGetErrorString", &a.GetErrorString, &cudart_error) &
              Resolve(cudart, "cudaGetLastError", &a.GetLastError, &cudart_error) &
              Resolve(cudart, "cudaRuntimeGetVersion", &a.RuntimeGetVersion, &cudart_error) &
              Resolve(cudart, "cudaDriverGetVersion", &a.DriverGetVersion, &cudart_error) &
              Resolve(cudart, "cudaMemcpyAsync", &a.MemcpyAsync, &cudart_error) &
              Resolve(cudart, "cudaMemcpyPeerAsync", &a.MemcpyPeerAsync, &cudart_error) &
              Resolve(cudart, "cudaMemsetAsync", &a.MemsetAsync, &cudart_error) &
              Resolve(cudart, "cudaMemGetInfo", &a.MemGetInfo, &cudart_error) &
              Resolve(cudart, "cudaMallocHost", &a.MallocHost, &cudart_error) &
              Resolve(cudart, "cudaFreeHost", &a.FreeHost, &cudart_error) &
              Resolve(cudart, "cudaIpcGetMemHandle", &a.IpcGetMemHandle, &cudart_error) &
              Resolve(cudart, "cudaIpcOpenMemHandle", &a.IpcOpenMemHandle, &cudart_error) &
              Resolve(cudart, "cudaIpcCloseMemHandle", &a.IpcCloseMemHandle, &cudart_error);
    if (ok) {
      t.have_cudart = true;
      state_.cudart_loaded = true;
      state_.cudart_path = cudart_path;
      a.RuntimeGetVersion(&state_.runtime_version);
      if (a.DriverGetVersion(&state_.driver_version) != cudaSuccess) state_.driver_version = 0;
      if (a.GetDeviceCount(&state_.device_count) != cudaSuccess) {
        a.GetLastError();  // clear the error of a host without driver or device
        state_.device_count = 0;
      }
    } else {
      cudart_error = absl::StrCat(cudart_path, ": ", cudart_error);
    }
  }
  // The driver comes with the GPU driver, not the toolkit: the linker's path.
  std::string driver_error;
  if (void* driver = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL)) {
    CuDriverApi& d = t.driver;
    t.have_driver =
        Resolve(driver, "cuMemGetAddressRange_v2", &d.MemGetAddressRange, &driver_error) &
        Resolve(driver, "cuGetErrorString", &d.GetErrorString, &driver_error);
  }
  auto [nccl, nccl_path] = Open(dirs, {"libnccl.so.2", "libnccl.so"}, &nccl_error);
  if (nccl != nullptr) {
    NcclApi& n = t.nccl;
    bool ok = Resolve(nccl, "ncclGetVersion", &n.GetVersion, &nccl_error) &
              Resolve(nccl, "ncclGetErrorString", &n.GetErrorString, &nccl_error) &
              Resolve(nccl, "ncclCommInitAll", &n.CommInitAll, &nccl_error) &
              Resolve(nccl, "ncclCommDestroy", &n.CommDestroy, &nccl_error) &
              Resolve(nccl, "ncclGroupStart", &n.GroupStart, &nccl_error) &
              Resolve(nccl, "ncclGroupEnd", &n.GroupEnd, &nccl_error) &
              Resolve(nccl, "ncclSend", &n.Send, &nccl_error) &
              Resolve(nccl, "ncclRecv", &n.Recv, &nccl_error) &
              Resolve(nccl, "ncclGetUniqueId", &n.GetUniqueId, &nccl_error) &
              Resolve(nccl, "ncclCommInitRank", &n.CommInitRank, &nccl_error) &
              Resolve(nccl, "ncclCommAbort", &n.CommAbort, &nccl_error) &
              Resolve(nccl, "ncclCommGetAsyncError", &n.CommGetAsyncError, &nccl_error);
    // Optional (NCCL >= 2.14): not resolving it leaves the blocking init.
    n.CommInitRankConfig =
        reinterpret_cast<decltype(n.CommInitRankConfig)>(dlsym(nccl, "ncclCommInitRankConfig"));
    if (ok && n.GetVersion(&state_.nccl_version) == ncclSuccess) {
      t.have_nccl = true;
      state_.nccl_loaded = true;
      state_.nccl_path = nccl_path;
    } else {
      nccl_error = absl::StrCat(nccl_path, ": ",
                                nccl_error.empty() ? "ncclGetVersion failed" : nccl_error);
    }
  }
  std::vector<std::string> errors;
  if (!state_.cudart_loaded)
    errors.push_back(absl::StrCat("CUDA runtime not loaded: ", cudart_error));
  if (!state_.nccl_loaded) errors.push_back(absl::StrCat("NCCL not loaded: ", nccl_error));
  state_.error = absl::StrJoin(errors, "; ");
}

std::string CudaLibraries::Describe() const {
  const CudaLibraryState& s = state_;
  std::string cudart =
      s.cudart_loaded
          ? absl::StrCat("cudart ", CudaVersion(s.runtime_version), " (",
                         s.driver_version > 0
                             ? absl::StrCat("driver ", CudaVersion(s.driver_version))
                             : std::string("no driver"),
                         ", ", s.device_count, s.device_count == 1 ? " device)" : " devices)")
          : std::string("CUDA runtime not loaded");
  std::string nccl = s.nccl_loaded
                         ? absl::StrCat("nccl ", NcclVersion(s.nccl_version))
                         : std::string("NCCL not loaded");
  return absl::StrCat(cudart, ", ", nccl);
}

}  // namespace reshard::agent
