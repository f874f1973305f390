#include "services/coordinator/server/stream_limits.h"

#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "services/coordinator/metrics/metrics.h"

namespace reshard::coordinator {

WatchSlot& WatchSlot::operator=(WatchSlot&& other) noexcept {
  if (this != &other) {
    Release();
    limits_ = std::exchange(other.limits_, nullptr);
    identity_ = std::move(other.identity_);
    tenant_ = std::move(other.tenant_);
    method_ = std::move(other.method_);
  }
  return *this;
}

void WatchSlot::Release() {
  if (limits_ == nullptr) return;
  std::exchange(limits_, nullptr)->Release(identity_, tenant_, method_);
}

WatchStreamLimits::WatchStreamLimits(Options options, CoordinatorMetrics* metrics)
    : options_(options), metrics_(metrics) {}

absl::StatusOr<WatchSlot> WatchStreamLimits::Acquire(const std::string& identity,
                                                     const std::string& tenant,
                                                     const std::string& method) {
  std::lock_guard<std::mutex> lock(mu_);
  // The caller's own limit first: a viewer at its limit learns that, not
  // how busy the replica is.
  const auto it = per_identity_.find(identity);
  const int64_t mine = it == per_identity_.end() ? 0 : it->second;
  if (mine >= options_.max_per_identity) {
    if (metrics_ != nullptr) metrics_->WatchStreamRefused("per_identity");
    return absl::ResourceExhaustedError(
        absl::StrCat("too many watch streams for \"", identity, "\": ", mine,
                     " open, limit --max-watch-streams-per-identity ", options_.max_per_identity,
                     "; close one (or wait for it to end) and retry"));
  }
  // The tenant's: one tenant's identities (a worker token per job) share
  // one budget, so they cannot fill the replica for the others. Before the
  // replica's total: a tenant at its budget learns that, not how busy the
  // other tenants are.
  const BudgetKey budget = BudgetOf(identity, tenant);
  const auto in_tenant = per_tenant_.find(budget);
  const int64_t ours = in_tenant == per_tenant_.end() ? 0 : in_tenant->second;
  if (ours >= options_.max_per_tenant) {
    if (metrics_ != nullptr) metrics_->WatchStreamRefused("per_tenant");
    return absl::ResourceExhaustedError(absl::StrCat(
        "too many watch streams for ",
        tenant.empty() ? absl::StrCat("\"", identity, "\" (no tenant: its own budget)")
                       : absl::StrCat("tenant \"", tenant, "\""),
        ": ", ours, " open, limit --max-watch-streams-per-tenant ", options_.max_per_tenant, " (\"",
        identity, "\" holds ", mine, "); close one (or wait for it to end) and retry"));
  }
  if (total_ >= options_.max_total) {
    if (metrics_ != nullptr) metrics_->WatchStreamRefused("total");
    return absl::ResourceExhaustedError(absl::StrCat(
        "too many watch streams on this coordinator: ", total_, " open, limit --max-watch-streams ",
        options_.max_total, " (\"", identity, "\" holds ", mine, "); retry later"));
  }
  ++total_;
  ++per_identity_[identity];
  ++per_tenant_[budget];
  const int64_t of_method = ++per_method_[method];
  if (metrics_ != nullptr) metrics_->SetWatchStreams(method, of_method);
  return WatchSlot(this, identity, tenant, method);
}

void WatchStreamLimits::Release(const std::string& identity, const std::string& tenant,
                                const std::string& method) {
  std::lock_guard<std::mutex> lock(mu_);
  --total_;
  if (auto it = per_identity_.find(identity); it != per_identity_.end() && --it->second <= 0) {
    per_identity_.erase(it);
  }
  if (auto it = per_tenant_.find(BudgetOf(identity, tenant));
      it != per_tenant_.end() && --it->second <= 0) {
    per_tenant_.erase(it);
  }
  const int64_t of_method = --per_method_[method];
  if (metrics_ != nullptr) metrics_->SetWatchStreams(method, of_method);
}

int64_t WatchStreamLimits::open() const {
  std::lock_guard<std::mutex> lock(mu_);
  return total_;
}

int64_t WatchStreamLimits::open(const std::string& identity) const {
  std::lock_guard<std::mutex> lock(mu_);
  const auto it = per_identity_.find(identity);
  return it == per_identity_.end() ? 0 : it->second;
}

int64_t WatchStreamLimits::open_in_tenant(const std::string& tenant) const {
  std::lock_guard<std::mutex> lock(mu_);
  const auto it = per_tenant_.find(BudgetKey{tenant, ""});
  return it == per_tenant_.end() ? 0 : it->second;
}

}  // namespace reshard::coordinator
