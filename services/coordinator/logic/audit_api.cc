#include "services/coordinator/logic/audit_api.h"

#include <algorithm>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/log.h"
#include "services/coordinator/logic/error_text.h"

namespace reshard::coordinator {

void AuditApi::Finish(AuditRecord& record, const absl::Status& status) {
  if (status.ok() && record.committed) return;
  record.code = absl::StatusCodeToString(status.code());
  record.message = std::string(status.message());
  if (absl::Status s = store_->AppendAudit(record); !s.ok()) {
    RESHARD_LOG(WARNING) << "audit row of " << record.method << " by \"" << record.identity
                         << "\" (" << record.code << ") not written: " << s;
  }
}

absl::StatusOr<v1::ListAuditResponse> AuditApi::List(const v1::ListAuditRequest& request,
                                                     std::vector<std::string> tenants) {
  if (request.page_size() < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("page_size is ", request.page_size(), "; it must be >= 0 (0: default)"));
  }
  if (request.since_unix_ms() < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("since_unix_ms is ", request.since_unix_ms(), "; it must be >= 0"));
  }
  AuditQuery query;
  // The token is the id of the previous page's last entry.
  if (!request.page_token().empty() &&
      (!absl::SimpleAtoi(request.page_token(), &query.before_id) || query.before_id <= 0)) {
    return absl::InvalidArgumentError(absl::StrCat("page_token \"",
                                                   TruncateError(request.page_token(), 64),
                                                   "\" is not a token ListAudit returned"));
  }
  query.tenants =
      request.tenant().empty() ? std::move(tenants) : std::vector<std::string>{request.tenant()};
  query.job_id = request.job_id();
  query.since_unix_ms = request.since_unix_ms();
  query.page_size = request.page_size() == 0
                        ? options_.default_page_size
                        : std::min<int>(request.page_size(), options_.max_page_size);
  absl::StatusOr<AuditPage> page = store_->ListAudit(query);
  if (!page.ok()) return page.status();
  v1::ListAuditResponse response;
  for (const AuditRecord& r : page->records) {
    v1::AuditEntry* e = response.add_entries();
    e->set_id(r.id);
    e->set_unix_ms(r.at_unix_ms);
    e->set_identity(r.identity);
    e->set_role(r.role);
    e->set_tenant(r.tenant);
    e->set_method(r.method);
    e->set_job_id(r.job_id);
    e->set_operation_id(r.operation_id);
    e->set_target(r.target);
    e->set_idempotency_key(r.idempotency_key);
    e->set_code(r.code);
    e->set_message(r.message);
  }
  if (page->next_before_id != 0) response.set_next_page_token(absl::StrCat(page->next_before_id));
  return response;
}

}  // namespace reshard::coordinator
