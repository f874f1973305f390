// Idempotency keys of mutating calls: a retried request (same key, same
// method, same body) returns the first call's result; the store compares the
// hash computed here. Thread-safe.
#pragma once

#include <string>

#include "google/protobuf/message.h"
#include "services/coordinator/store/store.h"

namespace reshard::coordinator {

/// Hex SHA-256 of `request` serialized deterministically with its
/// `idempotency_key` field cleared (when it has one), so the hash names the
/// request's content and is stable across processes and replicas.
std::string RequestHash(const google::protobuf::Message& request);

/// The store's Idempotency for `request` sent to `method` with `key`; an
/// empty key gives an empty Idempotency (no hash computed).
Idempotency MakeIdempotency(const std::string& key, const std::string& method,
                            const google::protobuf::Message& request);

}  // namespace reshard::coordinator
