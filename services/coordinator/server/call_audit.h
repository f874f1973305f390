// One call's audit record, from the handler's first line to its status
// (docs/security.md, "Audit"): RunAdmitted (rpc_status.h) opens one per
// call. For a method the trail records, it fills the record from the
// request (its job id, operation id, idempotency key, the tenant and name of
// a job spec, a host or token id) and the admitted caller, and keeps it as
// the thread's AuditScope so that the store writes it in the transaction of
// the call's effect; Finish writes it otherwise.
// Not thread-safe: lives on the handler's stack.
#pragma once

#include <optional>

#include "absl/status/status.h"
#include "google/protobuf/message.h"
#include "services/coordinator/server/auth.h"
#include "services/coordinator/store/audit.h"

namespace reshard::coordinator {

class CallAudit {
 public:
  CallAudit(const Authorizer& authorizer, const char* method,
            const google::protobuf::Message& request);
  CallAudit(const CallAudit&) = delete;
  CallAudit& operator=(const CallAudit&) = delete;

  /// The caller, once authenticated.
  void SetCaller(const Principal& principal);

  /// Records the call's end (AuditApi::Finish) as its level says, and
  /// returns `status` unchanged.
  absl::Status Finish(absl::Status status);

 private:
  AuditApi* const api_;
  const AuditLevel level_;
  AuditRecord record_;
  std::optional<AuditScope> scope_;
};

}  // namespace reshard::coordinator
