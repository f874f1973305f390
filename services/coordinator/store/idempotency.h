// The idempotency of a mutating store call (JobStore::CreateJob and
// DeleteJob, OperationStore::CreateOperation and TransitionOperation): what
// a key names. Both stores keep the keys with the resource they name.
#pragma once

#include <string>
#include <vector>

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

}  // namespace reshard::coordinator
