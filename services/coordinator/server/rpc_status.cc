#include "services/coordinator/server/rpc_status.h"

#include "common/log.h"

namespace reshard::coordinator {

grpc::Status ToGrpcStatus(const absl::Status& status) {
  if (status.code() == absl::StatusCode::kInternal || status.code() == absl::StatusCode::kUnknown) {
    RESHARD_LOG(ERROR) << "rpc failed: " << status;
  }
  return rpc::ToGrpc(status);
}

}  // namespace reshard::coordinator
