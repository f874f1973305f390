// How many watch streams (WatchJob, WatchOperation) a coordinator replica
// serves at once: per caller identity, per tenant and in total. The tenant
// budget keeps one tenant (however many identities it has: every job's
// worker token is one) from taking the replica's whole total; a caller of no
// tenant (an admin) has a tenant budget of its own. A stream holds no thread
// and reads nothing while nothing changes (the change feed), but it holds
// memory, so one read-only viewer must not open them without bound (issue
// 19, defect 6). The agents' long polls (WaitForTasks) are AgentService
// calls and never take a slot.
//
// A stream holds a WatchSlot for as long as gRPC serves it (watch_reactor.h);
// the slot is given back by the slot's destructor, whatever ends the stream
// (final state, error, client cancel or disconnect, shutdown).
//
// Thread-safe. A WatchSlot must not outlive the WatchStreamLimits it came
// from.
#pragma once

#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <utility>

#include "absl/status/statusor.h"

namespace reshard::coordinator {

class CoordinatorMetrics;
class WatchStreamLimits;

/// One open watch stream's place in the limits; released on destruction.
/// Move-only; a moved-from slot holds nothing.
class [[nodiscard]] WatchSlot {
 public:
  WatchSlot() = default;
  ~WatchSlot() { Release(); }
  WatchSlot(WatchSlot&& other) noexcept { *this = std::move(other); }
  WatchSlot& operator=(WatchSlot&& other) noexcept;
  WatchSlot(const WatchSlot&) = delete;
  WatchSlot& operator=(const WatchSlot&) = delete;

  /// Gives the slot back now (idempotent).
  void Release();

 private:
  friend class WatchStreamLimits;
  WatchSlot(WatchStreamLimits* limits, std::string identity, std::string tenant, std::string method)
      : limits_(limits),
        identity_(std::move(identity)),
        tenant_(std::move(tenant)),
        method_(std::move(method)) {}

  WatchStreamLimits* limits_ = nullptr;
  std::string identity_;
  std::string tenant_;
  std::string method_;
};

class WatchStreamLimits {
 public:
  struct Options {
    /// Streams open at once on this replica, all callers together.
    int64_t max_total = 128;
    /// Streams open at once for one identity (Principal::name).
    int64_t max_per_identity = 32;
    /// Streams open at once for one tenant, all its identities together
    /// (its schedulers, viewers and its jobs' worker tokens).
    int64_t max_per_tenant = 64;
  };

  /// `metrics` may be null; else it gets reshard_coordinator_watch_streams
  /// and the refusals.
  WatchStreamLimits(Options options, CoordinatorMetrics* metrics);

  /// A slot for one more `method` stream of `identity` of no tenant (its
  /// tenant budget is its own), or RESOURCE_EXHAUSTED naming the limit, as
  /// below.
  [[nodiscard]] absl::StatusOr<WatchSlot> Acquire(const std::string& identity,
                                                  const std::string& method) {
    return Acquire(identity, "", method);
  }
  /// A slot for one more `method` stream of `identity`, counted against
  /// `tenant`'s budget (empty: a budget of the identity's own, e.g. an
  /// admin's), or RESOURCE_EXHAUSTED naming the first limit it is past, the
  /// count and the limit's flag and value, checked in this order: the
  /// identity's (`too many watch streams for "viewer:dash@t": 32 open, limit
  /// --max-watch-streams-per-identity 32; ...`), the tenant's (`too many
  /// watch streams for tenant "t": 64 open, limit
  /// --max-watch-streams-per-tenant 64 ("worker:J" holds 0); ...`), the
  /// replica's (`... limit --max-watch-streams 128 ...`).
  [[nodiscard]] absl::StatusOr<WatchSlot> Acquire(const std::string& identity,
                                                  const std::string& tenant,
                                                  const std::string& method);

  /// Streams open now, in total and of `identity`.
  int64_t open() const;
  int64_t open(const std::string& identity) const;
  /// Streams open now counted against `tenant` (non-empty).
  int64_t open_in_tenant(const std::string& tenant) const;

 private:
  friend class WatchSlot;
  /// The tenant budget a stream counts against: {tenant, ""}, or for a
  /// caller of no tenant {"", identity} (no tenant's name can be empty, so
  /// the two never meet).
  using BudgetKey = std::pair<std::string, std::string>;
  static BudgetKey BudgetOf(const std::string& identity, const std::string& tenant) {
    return tenant.empty() ? BudgetKey{"", identity} : BudgetKey{tenant, ""};
  }
  void Release(const std::string& identity, const std::string& tenant, const std::string& method);

  const Options options_;
  CoordinatorMetrics* const metrics_;
  mutable std::mutex mu_;
  int64_t total_ = 0;
  std::map<std::string, int64_t> per_identity_;  // only identities with open streams
  std::map<BudgetKey, int64_t> per_tenant_;      // only budgets with open streams
  std::map<std::string, int64_t> per_method_;
};

}  // namespace reshard::coordinator
