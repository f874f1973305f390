// Bearer tokens for people and schedulers (docs/security.md): created and
// revoked by an admin, scoped to a role and tenants, expiring. A token is
// `<id>.<secret>`: the id is public (lists, logs, refusals), the secret is
// shown once at creation and stored only as its SHA-256.
//
// Thread-safe (the store is).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "services/coordinator/clock.h"
#include "services/coordinator/store/auth_store.h"

namespace reshard::coordinator {

class TokenApi {
 public:
  /// Longest lifetime a token may be given (and the default).
  static constexpr int64_t kMaxTtlMs = 366LL * 24 * 3600 * 1000;
  static constexpr int64_t kDefaultTtlMs = 30LL * 24 * 3600 * 1000;

  TokenApi(std::shared_ptr<AuthStore> store, const Clock* clock)
      : store_(std::move(store)), clock_(clock) {}

  struct Created {
    TokenRecord record;
    std::string token;  // `<id>.<secret>`: the only time it is known
  };

  /// InvalidArgument naming the field for an empty name, a role other than
  /// admin / scheduler / viewer, a scheduler or viewer without tenants, or a
  /// ttl outside (0, kMaxTtlMs] (0: kDefaultTtlMs).
  [[nodiscard]] absl::StatusOr<Created> Create(const std::string& name, const std::string& role,
                                               const std::vector<std::string>& tenants,
                                               int64_t ttl_ms, const std::string& created_by);
  /// NotFound naming the id.
  [[nodiscard]] absl::StatusOr<TokenRecord> Revoke(const std::string& id);
  [[nodiscard]] absl::StatusOr<std::vector<TokenRecord>> List();

  /// The record of `token` when it is valid now. UNAUTHENTICATED for a
  /// malformed, unknown, revoked or expired token; the message names the
  /// token's id at most, never its secret. Unavailable when the store is.
  [[nodiscard]] absl::StatusOr<TokenRecord> Verify(const std::string& token) const;

 private:
  std::shared_ptr<AuthStore> store_;
  const Clock* clock_;
};

/// The raw SHA-256 (32 bytes) of `data`.
std::string Sha256(const std::string& data);

}  // namespace reshard::coordinator
