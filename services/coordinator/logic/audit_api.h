// Logic behind the audit trail (docs/security.md, "Audit"): finishing a
// call's record and listing the trail. Which methods are audited is the
// Authorizer's method table (server/auth.cc); the scope that carries a
// record to the store is store/audit.h.
// Thread-safe: holds no mutable state of its own.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "reshard/v1/coordinator.pb.h"
#include "services/coordinator/store/auth_store.h"

namespace reshard::coordinator {

class AuditApi {
 public:
  struct Options {
    int max_page_size = 1000;
    int default_page_size = 100;
  };

  AuditApi(std::shared_ptr<AuthStore> store, Options options)
      : store_(std::move(store)), options_(options) {}

  /// Ends a call's `record` with `status`: nothing to do when the call
  /// succeeded and its effect's transaction committed the record; otherwise
  /// (refused, failed, or a success with no effect, such as an idempotent
  /// replay) writes it with the status's code and message in its own
  /// transaction. A failure to write is logged, never returned: the call's
  /// own result stands.
  void Finish(AuditRecord& record, const absl::Status& status);

  /// Entries newest first. `tenants`: those the caller may see (empty:
  /// all); the request's tenant must be among them (the adapter checks).
  /// InvalidArgument naming page_size, since_unix_ms or page_token.
  [[nodiscard]] absl::StatusOr<v1::ListAuditResponse> List(const v1::ListAuditRequest& request,
                                                           std::vector<std::string> tenants);

 private:
  std::shared_ptr<AuthStore> store_;
  Options options_;
};

}  // namespace reshard::coordinator
