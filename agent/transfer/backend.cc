#include "agent/transfer/backend.h"

#include <dlfcn.h>
#include <unistd.h>

#include <algorithm>
#include <fstream>

#include "agent/device/device_api.h"
#include "agent/transfer/device_comm.h"
#include "agent/transfer/transport.h"

namespace reshard::agent {

BackendCapabilities LocalCopyCapabilities() {
  BackendCapabilities c;
  c.name = "local";
  c.memory_kinds = {MemoryKind::kHost};
  c.local = true;
  c.used_by_executor = true;
  return c;
}

BackendCapabilities UcxCapabilities() {
  BackendCapabilities c;
  c.name = "ucx";
  c.memory_kinds = {MemoryKind::kHost};
  c.remote = true;
  c.notifications = true;  // a tagged receive completes when its message is in
  c.used_by_executor = true;
  return c;
}

BackendCapabilities NcclCapabilities() {
  BackendCapabilities c;
  c.name = "nccl";
  c.memory_kinds = {MemoryKind::kCuda};
  c.local = true;  // between this host's devices
  c.used_by_executor = false;
  return c;
}

BackendCapabilities DeviceBackendCapabilities(const DeviceApi& device) {
  const DeviceApiCapabilities d = device.capabilities();
  BackendCapabilities c;
  c.name = d.name;
  c.memory_kinds = {MemoryKind::kHost, MemoryKind::kCuda};
  c.local = true;
  c.remote = false;
  c.used_by_executor = true;  // the executor's device routes (device_route.h)
  c.devices = d.device_count;
  c.ipc = d.ipc;
  c.peer_copy = d.peer_copy;
  return c;
}

BackendCapabilities DeviceCommBackendCapabilities(const DeviceCommFactory& comm) {
  const DeviceCommCapabilities d = comm.capabilities();
  BackendCapabilities c;
  // The fake is advertised under a name of its own, so that a fake agent
  // and a real one never pick the communicator route together.
  c.name = d.name == "fake" ? "fake-nccl" : d.name;
  c.memory_kinds = {MemoryKind::kCuda};
  c.local = d.local;
  c.remote = d.remote;
  c.notifications = false;  // a receive completes at its stream's synchronize
  c.used_by_executor = true;  // cross-host device steps (device_comm_steps.h)
  return c;
}

namespace {

// The inode of this process's namespace `kind` ("pid", "ipc"): readlink of
// /proc/self/ns/<kind> is "pid:[4026531836]"; "" when unreadable.
std::string NamespaceInode(const std::string& kind) {
  char link[64];
  const ssize_t n = readlink(("/proc/self/ns/" + kind).c_str(), link, sizeof(link) - 1);
  if (n <= 0) return "";
  const std::string text(link, static_cast<size_t>(n));
  const std::string prefix = kind + ":[";
  if (text.size() <= prefix.size() + 1 || text.compare(0, prefix.size(), prefix) != 0 ||
      text.back() != ']') {
    return "";
  }
  return text.substr(prefix.size(), text.size() - prefix.size() - 1);
}

}  // namespace

std::string DeviceIpcEntry(const DeviceApi& device) {
  const DeviceApiCapabilities d = device.capabilities();
  if (!d.ipc) return "";
  std::ifstream f("/proc/sys/kernel/random/boot_id");
  std::string boot_id;
  if (!std::getline(f, boot_id) || boot_id.empty()) return "";
  // Its 32 hex digits without the dashes: the entry stays within the 64
  // bytes the coordinator allows a transport name (9 + 32 + 2 x 11).
  boot_id.erase(std::remove(boot_id.begin(), boot_id.end(), '-'), boot_id.end());
  // Containers of one node share the boot id but not, unless configured
  // to, the namespaces a handle needs (the exporter's pid for the fake's
  // /proc/<pid>/fd, CUDA IPC's shared memory and process checks).
  const std::string pid_ns = NamespaceInode("pid");
  const std::string ipc_ns = NamespaceInode("ipc");
  if (pid_ns.empty() || ipc_ns.empty()) return "";
  return d.name + "-ipc:" + boot_id + ":" + pid_ns + ":" + ipc_ns;
}

BackendCapabilities DeviceIpcBackendCapabilities(const DeviceApi& device) {
  BackendCapabilities c;
  c.name = DeviceIpcEntry(device);
  c.memory_kinds = {MemoryKind::kCuda};
  c.local = true;  // between the agents of this machine
  c.remote = false;
  c.used_by_executor = true;  // the device IPC route (device_ipc_steps.h)
  c.ipc = true;
  return c;
}

int CudaDeviceCount() {
  void* lib = nullptr;
  for (const char* soname : {"libcudart.so", "libcudart.so.13", "libcudart.so.12"}) {
    if ((lib = dlopen(soname, RTLD_NOW | RTLD_LOCAL)) != nullptr) break;
  }
  if (lib == nullptr) return 0;
  using Fn = int (*)(int*);
  auto fn = reinterpret_cast<Fn>(dlsym(lib, "cudaGetDeviceCount"));
  int n = 0;
  if (fn == nullptr || fn(&n) != 0) n = 0;
  // libcudart stays loaded: unloading a CUDA runtime is not safe.
  return n;
}

std::vector<std::string> CompiledBackends() {
  std::vector<std::string> names = {LocalCopyCapabilities().name, UcxCapabilities().name};
#ifdef RESHARD_HAVE_CUDA
  names.push_back(NcclCapabilities().name);
#endif
  return names;
}

std::vector<BackendCapabilities> LoadedBackends(const Transport* ucx, const DeviceApi* device,
                                                const DeviceCommFactory* comm,
                                                bool device_ipc) {
  std::vector<BackendCapabilities> loaded = {LocalCopyCapabilities()};
  if (ucx != nullptr) loaded.push_back(UcxCapabilities());
#ifdef RESHARD_HAVE_CUDA
  if (CudaDeviceCount() > 0) loaded.push_back(NcclCapabilities());
#endif
  if (device != nullptr) loaded.push_back(DeviceBackendCapabilities(*device));
  // The communicator only with a device store beside it (the route assumes
  // that a host advertising it holds device buffers).
  if (device != nullptr && comm != nullptr) loaded.push_back(DeviceCommBackendCapabilities(*comm));
  if (device != nullptr && device_ipc && !DeviceIpcEntry(*device).empty()) {
    loaded.push_back(DeviceIpcBackendCapabilities(*device));
  }
  return loaded;
}

std::vector<std::string> AdvertisedTransports(const std::vector<BackendCapabilities>& loaded) {
  std::vector<std::string> names;
  for (const BackendCapabilities& c : loaded) {
    if (c.used_by_executor) names.push_back(c.name);
  }
  return names;
}

}  // namespace reshard::agent
