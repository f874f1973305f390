// The UCX backend of Transport (transport.h): one ucp context and worker,
// driven by a progress thread that also runs every UCX call, so the worker is
// single-threaded; public methods only queue work for it. Tag send/receive
// with peer error handling: a dead peer fails the requests that involve it
// instead of leaving them hanging. Thread-safe.
#pragma once

#include <memory>

#include "agent/transfer/transport.h"

namespace reshard::agent {

/// What MakeUcxTransport returns, with extras for tests and tooling.
class UcxTransport : public Transport {
 public:
  /// Pending sends + receives (for tests).
  virtual size_t pending() const = 0;
};

/// As MakeUcxTransport, with the concrete type.
[[nodiscard]] absl::StatusOr<std::unique_ptr<UcxTransport>> MakeUcxTransportImpl(
    const UcxOptions& options);

}  // namespace reshard::agent
