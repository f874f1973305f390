// The idempotency rules (idempotency.h).
#include "services/coordinator/store/idempotency.h"

#include "absl/strings/str_cat.h"
#include "services/coordinator/store/store_checks.h"

namespace reshard::coordinator {

absl::Status CheckKeyScope(const Idempotency& idem) {
  for (const std::string& tenant : idem.tenants) {
    if (absl::Status s = CheckText("idempotency key tenant", tenant); !s.ok()) return s;
  }
  return absl::OkStatus();
}

absl::StatusOr<std::optional<std::string>> ReplayOf(const Idempotency& idem,
                                                    const std::optional<KeyUse>& first) {
  if (!first.has_value()) return std::optional<std::string>();
  if (first->method != idem.method || first->request_hash != idem.request_hash) {
    return absl::InvalidArgumentError(absl::StrCat("idempotency key \"", idem.key,
                                                   "\" was already used for a different ",
                                                   first->method, " request; use a new key"));
  }
  return std::optional<std::string>(first->resource_id);
}

absl::Status KeyTakenConcurrently(const Idempotency& idem) {
  return absl::AbortedError(
      absl::StrCat("idempotency key \"", idem.key, "\" was taken by a concurrent request; retry"));
}

}  // namespace reshard::coordinator
