// The transfer-backend seam, in NIXL's shape: each backend states what it
// moves (memory kinds, within a host and/or between hosts, whether the
// receiver is told when data arrived), and one registry lists the backends
// that this build compiled and this process loaded. The agent advertises in
// Host.transports only loaded backends that an execution path uses. Backend
// headers (ucp, cuda, nccl) never appear here. Thread-safe: the functions
// keep no state.
#pragma once

#include <string>
#include <vector>

#include "agent/device/memory_kind.h"

namespace reshard::agent {

class DeviceApi;
class DeviceCommFactory;
class Transport;

/// What one backend supports (NIXL: getSupportedMems, supportsLocal,
/// supportsRemote, supportsNotif).
struct BackendCapabilities {
  std::string name;                      // as advertised: "local", "ucx", "nccl"
  std::vector<MemoryKind> memory_kinds;  // what it moves
  bool local = false;                    // between buffers of this host
  bool remote = false;                   // between hosts
  bool notifications = false;            // the receiver learns when data arrived
  /// An execution path (TaskExecutor) moves bytes with it. Only such backends
  /// are advertised: a peer must not plan on a backend nothing here runs.
  bool used_by_executor = false;
  /// Device backends (DeviceBackendCapabilities): the devices the device
  /// API sees, and whether its allocations open in other processes (IPC)
  /// and copy between devices (peer copies). 0 / false for the others.
  int devices = 0;
  bool ipc = false;
  bool peer_copy = false;
};

/// The strided copier (local_copy.h): host memory within one host.
BackendCapabilities LocalCopyCapabilities();
/// UCX tag send/receive (ucx_transport.h): host memory between hosts.
BackendCapabilities UcxCapabilities();
/// NCCL between this host's GPUs (built only with CUDA): listed as loaded
/// when a CUDA device is visible. No execution path moves bytes under this
/// entry (the executor's NCCL is the device communicator's,
/// DeviceCommBackendCapabilities), so it is never advertised.
BackendCapabilities NcclCapabilities();

/// A device API (device_api.h: "fake" or "cuda", as its capabilities name
/// it): host and CUDA memory within this host (H2D, D2H, D2D, peer copies),
/// not between hosts. Used (and advertised) by the executor's device routes
/// (device_route.h).
BackendCapabilities DeviceBackendCapabilities(const DeviceApi& device);

/// A device communicator backend (device_comm.h): CUDA memory between hosts
/// (send/receive between the agents of an operation), used by the
/// executor's cross-host device steps (device_comm_steps.h). Its name is the
/// one the agent advertises and the route looks for in every peer's
/// transports: "nccl", or "fake-nccl" for the fake (never taken for NCCL).
BackendCapabilities DeviceCommBackendCapabilities(const DeviceCommFactory& comm);

/// The IPC entry of a device API whose capabilities have `ipc`:
/// "<api name>-ipc:<boot id>:<pid ns>:<ipc ns>" ("cuda-ipc:3f2a...:4026531836:
/// 4026531839", at most 63 bytes): this kernel's boot id without its dashes
/// (/proc/sys/kernel/random/boot_id) and
/// the inodes of this process's pid and ipc namespaces (/proc/self/ns/pid,
/// /proc/self/ns/ipc): agents that share all three can open each other's IPC
/// handles (containers of one node share the boot id only). "" without IPC
/// (or when one of them is unreadable). Agents advertise it (LoadedBackends), and the
/// executor's device IPC route (device_ipc_steps.h) looks for this host's
/// exact entry in every peer's transports.
std::string DeviceIpcEntry(const DeviceApi& device);

/// The device IPC backend of `device` (named DeviceIpcEntry): CUDA memory
/// between the agents of one machine, used by the executor's device IPC route.
BackendCapabilities DeviceIpcBackendCapabilities(const DeviceApi& device);

/// The number of CUDA devices (cudaGetDeviceCount through a dlopen'ed
/// libcudart, so that the agent does not link CUDA), 0 when there is no
/// runtime or no device.
int CudaDeviceCount();

/// Names of the backends compiled into this build: "local", "ucx", and
/// "nccl" only when configured with CUDA (RESHARD_CUDA; reshard_transfer is
/// then compiled with RESHARD_HAVE_CUDA).
std::vector<std::string> CompiledBackends();

/// The backends loaded in this process: the local copier always, UCX when
/// `ucx` is non-null (its context and worker came up), NCCL when compiled and
/// CudaDeviceCount() > 0, the device API when `device` is non-null
/// (MakeDeviceApi: $RESHARD_DEVICE), and the device communicator when `comm`
/// is non-null and `device` too (MakeDeviceCommFactory), the device IPC
/// backend when `device` has IPC and `device_ipc` (--device-ipc auto).
std::vector<BackendCapabilities> LoadedBackends(const Transport* ucx,
                                                const DeviceApi* device = nullptr,
                                                const DeviceCommFactory* comm = nullptr,
                                                bool device_ipc = true);

/// What the agent advertises in Host.transports: the names of `loaded`
/// backends that an execution path uses, in order.
std::vector<std::string> AdvertisedTransports(const std::vector<BackendCapabilities>& loaded);

}  // namespace reshard::agent
