// Idempotency keys of mutating calls: a retried request (same key, same
// method, same body) from the same scope returns the first call's result;
// the store compares the hash computed here. Keys are scoped to the
// caller's tenants (docs/coordinator.md, "Idempotency"): a key used in one
// scope is free in every other, and nothing about it is told there.
// Thread-safe.
#pragma once

#include <string>
#include <vector>

#include "google/protobuf/message.h"
#include "services/coordinator/store/store.h"

namespace reshard::coordinator {

/// Whose keys a call's key is among: the caller's tenants (a scheduler's or
/// viewer's, in any order), or none for a caller not scoped to tenants (an
/// admin), which has a scope of its own. The gRPC adapter fills it from the
/// authenticated principal; a caller of the logic without one (tests,
/// in-process tools) acts in the admin's scope.
struct KeyScope {
  std::vector<std::string> tenants;
};

/// Hex SHA-256 of `request` serialized deterministically with its
/// `idempotency_key` field cleared (when it has one), so the hash names the
/// request's content and is stable across processes and replicas.
std::string RequestHash(const google::protobuf::Message& request);

/// The method a request is for: its message name less "Request"
/// ("ResizeRequest" -> "Resize"), as stored with the key.
std::string RequestMethod(const google::protobuf::Message& request);

/// The store's Idempotency for `request` (a mutating call's, which has an
/// `idempotency_key` field) in `scope`: its key, method (RequestMethod),
/// hash and the scope's tenants sorted and unique. An empty key gives an
/// empty Idempotency (no hash computed).
Idempotency MakeIdempotency(const KeyScope& scope, const google::protobuf::Message& request);

}  // namespace reshard::coordinator
