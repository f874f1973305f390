// MakeDeviceApi: which device API this process uses ($RESHARD_DEVICE).
#include "agent/device/device_api.h"

#include <cstdlib>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "agent/device/fake_device.h"

#ifdef RESHARD_HAVE_CUDA
#include "agent/device/cuda_device.h"
#endif

namespace reshard::agent {
namespace {

absl::StatusOr<std::unique_ptr<DeviceApi>> MakeCuda(bool required) {
#ifdef RESHARD_HAVE_CUDA
  absl::StatusOr<std::unique_ptr<DeviceApi>> cuda = CudaDeviceApi::Create();
  if (cuda.ok() || required) return cuda;
  return std::unique_ptr<DeviceApi>();
#else
  if (!required) return std::unique_ptr<DeviceApi>();
  return absl::FailedPreconditionError(
      "RESHARD_DEVICE=cuda: this build has no CUDA support (configured with RESHARD_CUDA=OFF)");
#endif
}

}  // namespace

absl::StatusOr<std::unique_ptr<DeviceApi>> MakeDeviceApi(const std::string& spec) {
  if (spec.empty()) return MakeCuda(/*required=*/false);
  if (spec == "none") return std::unique_ptr<DeviceApi>();
  if (spec == "cuda") return MakeCuda(/*required=*/true);
  std::vector<std::string> f = absl::StrSplit(spec, ':');
  FakeDeviceApi::Options o;
  if (f[0] == "fake" && f.size() <= 3 &&
      (f.size() < 2 || (absl::SimpleAtoi(f[1], &o.devices) && o.devices > 0)) &&
      (f.size() < 3 || (absl::SimpleAtoi(f[2], &o.capacity_bytes) && o.capacity_bytes > 0))) {
    return std::make_unique<FakeDeviceApi>(o);
  }
  return absl::InvalidArgumentError(
      absl::StrCat("RESHARD_DEVICE \"", spec,
                   "\" is none of fake, fake:N, fake:N:BYTES (N >= 1), cuda, none"));
}

absl::StatusOr<std::unique_ptr<DeviceApi>> MakeDeviceApiFromEnvironment() {
  const char* env = std::getenv("RESHARD_DEVICE");
  return MakeDeviceApi(env != nullptr ? env : "");
}

}  // namespace reshard::agent
