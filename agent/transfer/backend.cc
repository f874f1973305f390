#include "agent/transfer/backend.h"

#include "agent/transfer/transport.h"
#ifdef RESHARD_HAVE_CUDA
#include "agent/transfer/nccl_transport.h"
#endif

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

std::vector<std::string> CompiledBackends() {
  std::vector<std::string> names = {LocalCopyCapabilities().name, UcxCapabilities().name};
#ifdef RESHARD_HAVE_CUDA
  names.push_back(NcclCapabilities().name);
#endif
  return names;
}

std::vector<BackendCapabilities> LoadedBackends(const Transport* ucx) {
  std::vector<BackendCapabilities> loaded = {LocalCopyCapabilities()};
  if (ucx != nullptr) loaded.push_back(UcxCapabilities());
#ifdef RESHARD_HAVE_CUDA
  if (NcclDeviceCount() > 0) loaded.push_back(NcclCapabilities());
#endif
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
