#include "services/coordinator/logic/tokens.h"

#include <openssl/sha.h>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "services/coordinator/logic/ids.h"

namespace reshard::coordinator {
namespace {

constexpr char kIdPrefix[] = "tok-";

}  // namespace

std::string Sha256(const std::string& data) {
  unsigned char digest[SHA256_DIGEST_LENGTH];
  SHA256(reinterpret_cast<const unsigned char*>(data.data()), data.size(), digest);
  return std::string(reinterpret_cast<const char*>(digest), sizeof(digest));
}

absl::StatusOr<TokenApi::Created> TokenApi::Create(const std::string& name, const std::string& role,
                                                   const std::vector<std::string>& tenants,
                                                   int64_t ttl_ms, const std::string& created_by) {
  if (name.empty()) return absl::InvalidArgumentError("name is empty");
  if (role != "admin" && role != "scheduler" && role != "viewer") {
    return absl::InvalidArgumentError(
        absl::StrCat("role \"", role, "\": expected admin, scheduler or viewer"));
  }
  if (role != "admin" && tenants.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("tenants: a ", role, " token needs at least one tenant"));
  }
  for (const std::string& t : tenants) {
    if (t.empty()) return absl::InvalidArgumentError("tenants: an empty tenant name");
  }
  if (ttl_ms == 0) ttl_ms = kDefaultTtlMs;
  if (ttl_ms < 0 || ttl_ms > kMaxTtlMs) {
    return absl::InvalidArgumentError(absl::StrCat(
        "ttl ", ttl_ms / 1000, " s: must be between 1 s and ", kMaxTtlMs / 1000, " s"));
  }
  Created out;
  out.record.id = absl::StrCat(kIdPrefix, NewId().substr(0, 16));
  out.record.name = name;
  out.record.role = role;
  out.record.tenants = tenants;
  out.record.created_by = created_by;
  out.record.created_unix_ms = clock_->NowUnixMs();
  out.record.expires_unix_ms = out.record.created_unix_ms + ttl_ms;
  const std::string secret = absl::StrCat(NewId(), NewId());  // 256 random bits
  if (absl::Status s = store_->CreateToken(out.record, Sha256(secret)); !s.ok()) return s;
  out.token = absl::StrCat(out.record.id, ".", secret);
  return out;
}

absl::StatusOr<TokenRecord> TokenApi::Revoke(const std::string& id) {
  return store_->RevokeToken(id, clock_->NowUnixMs());
}

absl::StatusOr<std::vector<TokenRecord>> TokenApi::List() { return store_->ListTokens(); }

absl::StatusOr<TokenRecord> TokenApi::Verify(const std::string& token) const {
  const size_t dot = token.find('.');
  if (!absl::StartsWith(token, kIdPrefix) || dot == std::string::npos || dot + 1 >= token.size()) {
    return absl::UnauthenticatedError("the bearer token is malformed (expected tok-ID.SECRET)");
  }
  const std::string id = token.substr(0, dot);
  absl::StatusOr<TokenRecord> record = store_->FindToken(Sha256(token.substr(dot + 1)));
  if (absl::IsNotFound(record.status()) || (record.ok() && record->id != id)) {
    return absl::UnauthenticatedError(absl::StrCat("bearer token \"", id, "\" is not known"));
  }
  if (!record.ok()) return record.status();
  if (record->revoked_unix_ms.has_value()) {
    return absl::UnauthenticatedError(absl::StrCat("bearer token \"", id, "\" was revoked"));
  }
  if (clock_->NowUnixMs() >= record->expires_unix_ms) {
    return absl::UnauthenticatedError(absl::StrCat(
        "bearer token \"", id, "\" expired at ",
        absl::FormatTime(absl::FromUnixMillis(record->expires_unix_ms), absl::UTCTimeZone())));
  }
  return record;
}

}  // namespace reshard::coordinator
