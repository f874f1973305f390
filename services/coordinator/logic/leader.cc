#include "services/coordinator/logic/leader.h"

#include <chrono>
#include <utility>

#include "common/log.h"
#include "services/coordinator/store/call_class.h"

namespace reshard::coordinator {

LeaderLoop::LeaderLoop(std::unique_ptr<LeaderLock> lock, OperationDriver* driver,
                       CoordinatorMetrics* metrics, Options options)
    : lock_(std::move(lock)), driver_(driver), metrics_(metrics), options_(options) {}

LeaderLoop::~LeaderLoop() { Stop(); }

void LeaderLoop::EnableRetention(StorePtr store, Retention retention) {
  RESHARD_CHECK(!thread_.joinable()) << "LeaderLoop::EnableRetention after Start";
  retention_store_ = std::move(store);
  retention_ = retention;
}

void LeaderLoop::WatchStoreHealth(StoreHealthFn health, std::function<absl::Status()> probe) {
  RESHARD_CHECK(!thread_.joinable()) << "LeaderLoop::WatchStoreHealth after Start";
  health_ = std::move(health);
  probe_ = std::move(probe);
}

void LeaderLoop::EnablePolicies(std::function<absl::Status()> pass) {
  RESHARD_CHECK(!thread_.joinable()) << "LeaderLoop::EnablePolicies after Start";
  policies_ = std::move(pass);
}

bool LeaderLoop::StoreAnswers(bool* resumed) {
  if (!health_) return true;
  StoreHealth health = health_();
  if (!health.answering && probe_) {
    // Ask, rather than wait for other callers: the answer ends the outage.
    if (probe_().ok()) health = health_();
  }
  if (!health.answering) {
    // Heartbeats cannot be recorded now: judging leases (or stalls) over
    // this time would blame the hosts for the database.
    if (!silent_logged_) {
      RESHARD_LOG(WARNING) << "PostgreSQL has not answered for " << health.silent_ms
                           << " ms: operations and leases wait until it does";
      silent_logged_ = true;
    }
    return false;
  }
  silent_logged_ = false;
  if (health.outages != outages_seen_) {
    outages_seen_ = health.outages;
    if (*resumed) {
      RESHARD_LOG(WARNING) << "PostgreSQL answers again after " << health.last_outage_ms
                           << " ms without an answer: resuming operations, leases enforced "
                              "again after the grace";
      *resumed = false;
    }
  }
  return true;
}

void LeaderLoop::MaybePrune() {
  if (retention_store_ == nullptr) return;
  const auto now = std::chrono::steady_clock::now();
  if (last_prune_ != std::chrono::steady_clock::time_point{} &&
      now - last_prune_ < std::chrono::milliseconds(retention_.interval_ms)) {
    return;
  }
  last_prune_ = now;
  PrunedRows total;
  for (int batch = 0; batch < retention_.batches_per_round; ++batch) {
    absl::StatusOr<PrunedRows> pruned = retention_store_->PruneRetention(retention_.policy);
    if (!pruned.ok()) {
      RESHARD_LOG(WARNING) << "retention: " << pruned.status();
      break;
    }
    total.generations += pruned->generations;
    total.operations += pruned->operations;
    total.audit += pruned->audit;
    if (metrics_ != nullptr) {
      metrics_->RetentionPruned("generations", pruned->generations);
      metrics_->RetentionPruned("operations", pruned->operations);
      metrics_->RetentionPruned("audit_log", pruned->audit);
    }
    // A batch short of full on every table: nothing more is due now.
    if (pruned->generations < retention_.policy.batch_rows &&
        pruned->operations < retention_.policy.batch_rows &&
        pruned->audit < retention_.policy.batch_rows) {
      break;
    }
  }
  if (total.generations > 0 || total.operations > 0 || total.audit > 0) {
    RESHARD_LOG(INFO) << "retention: pruned " << total.generations << " generations, "
                      << total.operations << " operations, " << total.audit << " audit rows";
  }
}

void LeaderLoop::Start() {
  RESHARD_CHECK(!thread_.joinable()) << "LeaderLoop::Start called twice";
  if (metrics_ != nullptr) metrics_->SetLeader(false);
  thread_ = std::thread([this] { Run(); });
}

void LeaderLoop::Stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void LeaderLoop::Kick() {
  if (!leader_) return;
  {
    std::lock_guard<std::mutex> lock(mu_);
    kicked_ = true;
  }
  cv_.notify_all();
}

void LeaderLoop::Run() {
  // The lease sweep and the operations' steps may use the connections kept
  // for agents: clients never hold them up.
  CallClassScope agent_class(CallClass::kAgent);
  // ResumeAll must succeed once per leadership before Tick runs: it is what
  // re-reads every unfinished operation after a failover, and what grants
  // hosts the lease grace (also after the store's outage: StoreAnswers).
  bool resumed = false;
  auto set_leader = [this](bool leader) {
    leader_ = leader;
    if (metrics_ != nullptr) metrics_->SetLeader(leader);
  };
  for (;;) {
    int wait_ms = options_.retry_ms;
    if (!leader_) {
      absl::StatusOr<bool> acquired = lock_->TryAcquire();
      if (!acquired.ok()) {
        RESHARD_LOG(WARNING) << "leader lock: " << acquired.status();
      } else if (*acquired) {
        RESHARD_LOG(INFO) << "leader lock taken: this replica drives operations";
        set_leader(true);
        resumed = false;
      }
    } else if (!lock_->StillHeld()) {
      // The lock's connection dropped, so PostgreSQL has released it and
      // another replica may drive already: stop at once.
      RESHARD_LOG(WARNING) << "leader lock lost: no longer driving operations";
      set_leader(false);
      lock_->Release();
    }
    if (leader_) wait_ms = options_.tick_ms;
    if (leader_ && StoreAnswers(&resumed)) {
      if (!resumed) {
        absl::Status s = driver_->ResumeAll();
        if (s.ok()) {
          resumed = true;
        } else {
          RESHARD_LOG(WARNING) << "resuming operations failed (retrying): " << s;
        }
      } else {
        if (absl::Status s = driver_->Tick(); !s.ok()) {
          RESHARD_LOG(WARNING) << "driver tick: " << s;
        }
        if (policies_) {
          if (absl::Status s = policies_(); !s.ok()) RESHARD_LOG(WARNING) << "policies: " << s;
        }
        MaybePrune();
      }
    }
    std::unique_lock<std::mutex> lock(mu_);
    // A kick while leading ends the wait early (kicked_ is cleared here, so
    // a kick during the tick above is not lost: it shortens this wait).
    const bool stopping = cv_.wait_for(lock, std::chrono::milliseconds(wait_ms),
                                       [this] { return stop_ || (kicked_ && leader_); });
    kicked_ = false;
    if (stopping && stop_) break;
  }
  if (leader_) {
    lock_->Release();
    set_leader(false);
    RESHARD_LOG(INFO) << "leader lock released (stopping)";
  }
}

}  // namespace reshard::coordinator
