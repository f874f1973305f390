// MakeDeviceCommFactory: which communicator backend a device API gets.
#include "agent/transfer/device_comm.h"

#include "absl/strings/str_cat.h"
#include "agent/transfer/fake_comm.h"

#ifdef RESHARD_HAVE_CUDA
#include "agent/transfer/nccl_comm.h"
#endif

namespace reshard::agent {

std::unique_ptr<DeviceCommFactory> MakeDeviceCommFactory(DeviceApi* device, std::string* why_not) {
  std::string why;
  if (device == nullptr) {
    why = "no device API";
  } else if (const std::string name = device->capabilities().name; name == "fake") {
    return std::make_unique<FakeCommFactory>(static_cast<FakeDeviceApi*>(device));
  } else if (name == "cuda") {
#ifdef RESHARD_HAVE_CUDA
    std::unique_ptr<DeviceCommFactory> nccl = MakeNcclCommFactory(&why);
    if (nccl != nullptr) return nccl;
#else
    why = "NCCL not loaded: this build has no CUDA support (configured with RESHARD_CUDA=OFF)";
#endif
  } else {
    why = absl::StrCat("no communicator for device API \"", name, "\"");
  }
  if (why_not != nullptr) *why_not = why;
  return nullptr;
}

}  // namespace reshard::agent
