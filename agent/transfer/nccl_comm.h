// The NCCL device communicator (device_comm.h) over the dlopen'ed NCCL and
// CUDA runtime (cuda_libraries.h): ncclGetUniqueId / ncclCommInitRank /
// ncclSend / ncclRecv / ncclGroupStart / ncclGroupEnd / ncclCommAbort. Built
// only with CUDA (RESHARD_HAVE_CUDA; no CUDA header needed: cuda_api.h), runs
// only on a GPU. An id is the 128 bytes of an ncclUniqueId.
// Thread contract as device_comm.h (NCCL's groups are per thread).
#pragma once

#include <memory>
#include <string>

#include "agent/transfer/device_comm.h"

namespace reshard::agent {

/// The NCCL factory when the CUDA runtime and NCCL are loaded and see a
/// device; else nullptr, and `*why_not` says what is missing ("NCCL not
/// loaded: ...").
std::unique_ptr<DeviceCommFactory> MakeNcclCommFactory(std::string* why_not);

}  // namespace reshard::agent
