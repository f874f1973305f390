#include "cost/model.h"

#include <algorithm>

namespace reshard::cost {
namespace {

// Averages in seconds per byte, so that a slow observation weighs as much
// as the time it cost.
void Learn(Rate* r, double bytes_per_s) {
  if (!(bytes_per_s > 0)) return;
  if (!r->learned) {
    r->bytes_per_s = bytes_per_s;
    r->learned = true;
    return;
  }
  const double per_byte =
      (1 - CostModel::kWeight) / r->bytes_per_s + CostModel::kWeight / bytes_per_s;
  r->bytes_per_s = 1 / per_byte;
}

// A phase of `seconds` over `bytes`: its rate when both say enough.
void LearnPhase(Rate* r, int64_t bytes, double seconds) {
  if (bytes < CostModel::kMinBytes || !(seconds > 0)) return;
  Learn(r, static_cast<double>(bytes) / seconds);
}

Rate Seed(double bytes_per_s) { return Rate{bytes_per_s, false}; }

}  // namespace

HostRates CostModel::RatesOf(const std::string& host, const v1::HostProbe* probe) const {
  const double copy = probe != nullptr && probe->copy_bytes_per_s() > 0
                          ? probe->copy_bytes_per_s()
                          : defaults_.copy_bytes_per_s;
  const double hash = probe != nullptr && probe->hash_bytes_per_s() > 0
                          ? probe->hash_bytes_per_s()
                          : defaults_.hash_bytes_per_s;
  HostRates seeds;
  seeds.send = seeds.receive = Seed(defaults_.link_bytes_per_s);
  seeds.copy = Seed(copy);
  seeds.setup = Seed(copy);   // a new buffer's pages are faulted in once
  seeds.verify = Seed(hash);  // the sources are hashed again
  seeds.seal = Seed(hash);    // every new shard is hashed
  seeds.route = "host";
  std::lock_guard<std::mutex> lock(mu_);
  auto it = learned_.find(host);
  if (it == learned_.end()) return seeds;
  HostRates r = it->second;
  for (auto [have, seed] : {std::pair{&r.send, &seeds.send},
                            {&r.receive, &seeds.receive},
                            {&r.copy, &seeds.copy},
                            {&r.setup, &seeds.setup},
                            {&r.verify, &seeds.verify},
                            {&r.seal, &seeds.seal}}) {
    if (!have->learned) *have = *seed;
  }
  if (r.route.empty()) r.route = seeds.route;
  return r;
}

double CostModel::OverheadSeconds() const {
  std::lock_guard<std::mutex> lock(mu_);
  return overhead_learned_ ? overhead_ : defaults_.overhead_seconds;
}

bool CostModel::OverheadLearned() const {
  std::lock_guard<std::mutex> lock(mu_);
  return overhead_learned_;
}

void CostModel::ObserveTask(const TaskObservation& o) {
  const v1::TaskTimings& t = o.timings;
  std::lock_guard<std::mutex> lock(mu_);
  HostRates& r = learned_[o.host];
  if (!o.route.empty()) r.route = o.route;
  LearnPhase(&r.setup, o.bytes_new, t.setup_seconds());
  LearnPhase(&r.verify, o.bytes_new, t.verify_seconds());
  LearnPhase(&r.seal, o.bytes_new, t.seal_seconds());
  r.prove_seconds = r.prove_seconds == 0
                        ? t.prove_seconds()
                        : (1 - kWeight) * r.prove_seconds + kWeight * t.prove_seconds();
  // The move phase copies locally while its transfers run (docs/agent.md,
  // "Executing a HostTask"): it takes as long as the longer of the two, and
  // teaches the rate of whichever dominated it.
  const int64_t cross = std::max(o.bytes_in, o.bytes_out);
  const double move = t.move_seconds();
  if (move > 0 && cross >= kMinBytes) {
    const bool receiving = o.bytes_in >= o.bytes_out;
    LearnPhase(receiving ? &r.receive : &r.send, cross, move);
    // The other direction went at least this fast.
    Rate* other = receiving ? &r.send : &r.receive;
    const int64_t other_bytes = receiving ? o.bytes_out : o.bytes_in;
    if (other_bytes >= kMinBytes && (!other->learned || other->bytes_per_s < other_bytes / move)) {
      other->bytes_per_s = other_bytes / move;
      other->learned = true;
    }
  } else if (move > 0 && cross < kMinBytes) {
    LearnPhase(&r.copy, o.bytes_local, move);
  }
  const int64_t moved = o.bytes_in + o.bytes_out + o.bytes_local;
  if (moved >= kMinBytes && t.cpu_seconds() > 0) {
    const double per_byte = t.cpu_seconds() / static_cast<double>(moved);
    r.cpu_seconds_per_byte = r.cpu_seconds_per_byte == 0
                                 ? per_byte
                                 : (1 - kWeight) * r.cpu_seconds_per_byte + kWeight * per_byte;
  }
}

void CostModel::ObserveTask(const std::string& operation_id, const TaskObservation& o) {
  ObserveTask(o);
  std::lock_guard<std::mutex> lock(mu_);
  auto [it, added] = longest_.emplace(operation_id, 0.0);
  it->second = std::max(it->second, o.timings.total_seconds());
  if (!added) return;
  pending_order_.push_back(operation_id);
  while (pending_order_.size() > kMaxPending) {
    longest_.erase(pending_order_.front());
    pending_order_.pop_front();
  }
}

void CostModel::ObserveOperation(double actual_seconds, double longest_task_seconds) {
  if (!(actual_seconds > 0)) return;
  const double overhead = std::max(0.0, actual_seconds - longest_task_seconds);
  std::lock_guard<std::mutex> lock(mu_);
  overhead_ = overhead_learned_ ? (1 - kWeight) * overhead_ + kWeight * overhead : overhead;
  overhead_learned_ = true;
}

void CostModel::ObserveCommit(const std::string& operation_id, double actual_seconds) {
  double longest = -1;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = longest_.find(operation_id);
    if (it == longest_.end()) return;
    longest = it->second;
    longest_.erase(it);
    // pending_order_ keeps the id until it reaches the front: erasing an
    // absent key then is harmless.
  }
  ObserveOperation(actual_seconds, longest);
}

void CostModel::Forget(const std::string& operation_id) {
  std::lock_guard<std::mutex> lock(mu_);
  longest_.erase(operation_id);
}

}  // namespace reshard::cost
