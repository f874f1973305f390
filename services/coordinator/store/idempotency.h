// The idempotency of a mutating store call (JobStore::CreateJob and
// DeleteJob, OperationStore::CreateOperation and TransitionOperation): what
// a key names, and the rules both stores apply to a key's reuse (written
// once here; each store only reads and writes the key's row). Pure
// functions; thread-safe.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace reshard::coordinator {

/// Idempotency of a mutating call: the same `key` for the same `method` and
/// `request_hash` returns the first call's resource; a different request
/// with a used key is InvalidArgument. An empty key disables it.
/// Keys are scoped: a key is looked up and claimed only among the keys of
/// the same `tenants`, so a key another scope used is simply free.
struct Idempotency {
  /// The caller's tenants, sorted and unique (MakeIdempotency); empty for a
  /// caller scoped to no tenant (an admin), which has a scope of its own.
  std::vector<std::string> tenants;
  std::string key;
  std::string method;        // e.g. "Resize"
  std::string request_hash;  // hash of the request without the key
};

/// A key's first use in its scope, as stored.
struct KeyUse {
  std::string method;
  std::string request_hash;
  std::string resource_id;  // what the first call made (or deleted)
};

/// A key's scope storable: InvalidArgument for a NUL byte in a tenant.
/// Checked before the key is looked up.
[[nodiscard]] absl::Status CheckKeyScope(const Idempotency& idem);
/// What `idem` gets from its key's first use in its scope (`first`;
/// nullopt when the scope has not used the key): the first call's resource
/// id when it was the same method and request, nullopt for an unused key,
/// InvalidArgument naming the key and the method it was used with
/// otherwise.
[[nodiscard]] absl::StatusOr<std::optional<std::string>> ReplayOf(
    const Idempotency& idem, const std::optional<KeyUse>& first);
/// A key the call would claim was claimed first by a concurrent request:
/// Aborted, to retry (the retry finds the key's first use).
absl::Status KeyTakenConcurrently(const Idempotency& idem);

}  // namespace reshard::coordinator
