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

double Average(double before, double now) {
  return before == 0 ? now : (1 - CostModel::kWeight) * before + CostModel::kWeight * now;
}

Rate Seed(double bytes_per_s) { return Rate{bytes_per_s, false}; }

// What a task teaches besides the NIC rates.
void LearnPhases(HostRates& r, const TaskObservation& o) {
  const v1::TaskTimings& t = o.timings;
  if (!o.route.empty()) r.route = o.route;
  LearnPhase(&r.setup, o.bytes_new, t.setup_seconds());
  LearnPhase(&r.verify, o.bytes_new, t.verify_seconds());
  LearnPhase(&r.seal, o.bytes_new, t.seal_seconds());
  r.prove_seconds = Average(r.prove_seconds, t.prove_seconds());
  const int64_t cross = std::max(o.bytes_in, o.bytes_out);
  if (t.move_seconds() > 0 && cross < CostModel::kMinBytes) {
    LearnPhase(&r.copy, o.bytes_local, t.move_seconds());
  }
  const int64_t moved = o.bytes_in + o.bytes_out + o.bytes_local;
  if (moved >= CostModel::kMinBytes && t.cpu_seconds() > 0) {
    r.cpu_seconds_per_byte =
        Average(r.cpu_seconds_per_byte, t.cpu_seconds() / static_cast<double>(moved));
  }
}

// The move phase copies locally while its transfers run (docs/agent.md,
// "Executing a HostTask"): when the network set its pace, it teaches the
// NIC rate of the direction that carried more bytes.
void LearnNetwork(HostRates& r, const TaskObservation& o) {
  const int64_t cross = std::max(o.bytes_in, o.bytes_out);
  const double move = o.timings.move_seconds();
  if (!(move > 0) || cross < CostModel::kMinBytes) return;
  const bool receiving = o.bytes_in >= o.bytes_out;
  LearnPhase(receiving ? &r.receive : &r.send, cross, move);
  // The other direction went at least this fast.
  Rate* other = receiving ? &r.send : &r.receive;
  const int64_t other_bytes = receiving ? o.bytes_out : o.bytes_in;
  if (other_bytes >= CostModel::kMinBytes &&
      (!other->learned || other->bytes_per_s < other_bytes / move)) {
    other->bytes_per_s = other_bytes / move;
    other->learned = true;
  }
}

// A move the machine's CPUs paced still shows that each NIC went at least
// as fast as it did: a rate below that (or none yet) is raised to it.
void LearnNetworkAtLeast(HostRates& r, const TaskObservation& o) {
  const double move = o.timings.move_seconds();
  if (!(move > 0)) return;
  for (auto [rate, bytes] : {std::pair{&r.receive, o.bytes_in}, {&r.send, o.bytes_out}}) {
    if (bytes < CostModel::kMinBytes) continue;
    if (!rate->learned || rate->bytes_per_s < bytes / move) {
      rate->bytes_per_s = bytes / move;
      rate->learned = true;
    }
  }
}

}  // namespace

HostRates CostModel::RatesOf(const std::string& host, const v1::HostProbe* probe) const {
  std::lock_guard<std::mutex> lock(mu_);
  if (probe == nullptr) {
    auto noted = probes_.find(host);
    if (noted != probes_.end()) probe = &noted->second;
  }
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
  if (probe != nullptr) {
    seeds.machine = probe->machine_id();
    seeds.cpus = std::max(1, probe->cpus());
  }
  auto it = learned_.find(host);
  if (it == learned_.end()) return seeds;
  HostRates r = it->second;
  for (auto [have, seed] : {std::pair{&r.send, &seeds.send}, {&r.receive, &seeds.receive},
                            {&r.copy, &seeds.copy}, {&r.setup, &seeds.setup},
                            {&r.verify, &seeds.verify}, {&r.seal, &seeds.seal}}) {
    if (!have->learned) *have = *seed;
  }
  if (r.route.empty()) r.route = seeds.route;
  r.machine = seeds.machine;
  r.cpus = seeds.cpus;
  return r;
}

void CostModel::NoteProbe(const std::string& host, const v1::HostProbe& probe) {
  std::lock_guard<std::mutex> lock(mu_);
  probes_[host] = probe;
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
  std::lock_guard<std::mutex> lock(mu_);
  HostRates& r = learned_[o.host];
  LearnPhases(r, o);
  LearnNetwork(r, o);
}

void CostModel::ObserveTask(const std::string& operation_id, const TaskObservation& o) {
  std::lock_guard<std::mutex> lock(mu_);
  LearnPhases(learned_[o.host], o);
  auto [it, added] = pending_.try_emplace(operation_id);
  it->second.push_back(o);
  if (!added) return;
  pending_order_.push_back(operation_id);
  while (pending_order_.size() > kMaxPending) {
    pending_.erase(pending_order_.front());
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
  double longest = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = pending_.find(operation_id);
    if (it == pending_.end()) return;
    const std::vector<TaskObservation> tasks = std::move(it->second);
    pending_.erase(it);
    // pending_order_ keeps the id until it reaches the front: erasing an
    // absent key then is harmless.
    // Per machine (a host without a machine id is its own): the CPU-seconds
    // of its hosts' tasks, its CPUs, their longest task.
    struct Machine {
      double cpu = 0, longest = 0;
      int cpus = 1;
    };
    std::map<std::string, Machine> machines;
    auto machine_of = [&](const std::string& host) {
      auto p = probes_.find(host);
      return p == probes_.end() || p->second.machine_id().empty() ? "host:" + host
                                                                  : p->second.machine_id();
    };
    for (const TaskObservation& o : tasks) {
      Machine& m = machines[machine_of(o.host)];
      m.cpu += o.timings.cpu_seconds();
      m.longest = std::max(m.longest, o.timings.total_seconds());
      auto p = probes_.find(o.host);
      if (p != probes_.end()) m.cpus = std::max(m.cpus, p->second.cpus());
      longest = std::max(longest, o.timings.total_seconds());
    }
    for (const TaskObservation& o : tasks) {
      const Machine& m = machines[machine_of(o.host)];
      if (m.longest > 0 && m.cpu / m.cpus >= kCpuBoundShare * m.longest) {
        LearnNetworkAtLeast(learned_[o.host], o);
      } else {
        LearnNetwork(learned_[o.host], o);
      }
    }
  }
  ObserveOperation(actual_seconds, longest);
}

void CostModel::Forget(const std::string& operation_id) {
  std::lock_guard<std::mutex> lock(mu_);
  pending_.erase(operation_id);
}

}  // namespace reshard::cost
