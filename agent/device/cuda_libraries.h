// The CUDA runtime and NCCL, loaded at run time (dlopen), never linked: the
// agent and its tools start on hosts with no GPU driver, no CUDA runtime and
// no NCCL, and "NCCL not loaded" is a state they can report. Built only with
// RESHARD_HAVE_CUDA (AUTO: the build found the libraries, in a CUDA toolkit or
// in the wheels torch brings into the project's venv: cmake/ReshardCuda.cmake).
// The C entry points used are declared in cuda_api.h (internal).
// Thread-safe: CudaLibraries::Get() loads once; the result is immutable.
#pragma once

#include <string>
#include <vector>

namespace reshard::agent {

/// What CudaLibraries::Get() found. Versions are the libraries' own
/// encodings (cudaRuntimeGetVersion: 13000 for 13.0; ncclGetVersion: 22809
/// for 2.28.9); 0 when not loaded.
struct CudaLibraryState {
  bool cudart_loaded = false;
  bool nccl_loaded = false;
  int runtime_version = 0;
  int driver_version = 0;  // 0: no driver (cudaDriverGetVersion)
  int nccl_version = 0;
  int device_count = 0;    // 0 without a driver or device
  std::string cudart_path;  // the file dlopen took, or ""
  std::string nccl_path;
  std::string error;        // why something is not loaded; "" when both are
};

/// Loads libcudart (.so.13, .so.12, .so) and libnccl (.so.2) once, from the
/// directories in $RESHARD_CUDA_LIBRARY_PATH (colon-separated), then those
/// the build found them in (the venv's nvidia/*/lib), then the dynamic
/// linker's own search. Never fails: what is missing is in state().error.
class CudaLibraries {
 public:
  static const CudaLibraries& Get();
  const CudaLibraryState& state() const { return state_; }
  /// The directories tried before the dynamic linker's search, in order.
  static std::vector<std::string> SearchDirectories();
  /// One line for logs and status pages: "cudart 13.0 (driver 13.0, 1 device),
  /// nccl 2.28.9" or what is missing.
  std::string Describe() const;

 private:
  CudaLibraries();
  CudaLibraryState state_;
};

}  // namespace reshard::agent
