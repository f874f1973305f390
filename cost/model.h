// The coordinator's cost model (docs/scheduler.md, "The cost of an
// operation"): each host's rates, learned from the phase timings its agent
// reports with every finished task (v1::TaskTimings), seeded by the agent's
// registration probe (v1::HostProbe) and, for what no probe measures (the
// network), by configured defaults; and the overhead of an operation beyond
// its hosts' tasks, learned from every commit. Thread-safe.
#pragma once

#include <cstdint>
#include <deque>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "reshard/v1/agent.pb.h"

namespace reshard::cost {

/// What the model assumes where nothing was measured or learned.
struct Defaults {
  double link_bytes_per_s = 1.25e9;  // a host's NIC, each direction (10 Gb/s)
  double copy_bytes_per_s = 2e9;     // without a probe
  double hash_bytes_per_s = 4e9;     // without a probe
  double overhead_seconds = 0.5;     // an operation beyond its hosts' tasks
};

/// One rate and where it came from.
struct Rate {
  double bytes_per_s = 0;
  bool learned = false;  // from a committed operation (else a seed)
};

/// A host's rates: what its task's phases take per byte.
struct HostRates {
  Rate send, receive;               // cross-host, the host's NIC each way, as achieved
  Rate copy;                        // local copies (within the host)
  Rate setup;                       // new buffers made, per byte of the host's new ranks
  Rate verify;                      // per byte of the host's new ranks
  Rate seal;                        // per byte of the host's new ranks
  double prove_seconds = 0;         // reaching peers and proving (fixed)
  double cpu_seconds_per_byte = 0;  // per byte in, out and local; 0: never observed
  std::string route;                // of its last task ("host" before any)
  // Its machine (hosts with one machine id share its CPUs; empty: its own)
  // and the CPUs the agent may use (HostProbe).
  std::string machine;
  int cpus = 1;
};

/// What one host's finished task moved (from the operation's plan) and took
/// (from its agent).
struct TaskObservation {
  std::string host;
  int64_t bytes_in = 0, bytes_out = 0, bytes_local = 0, bytes_new = 0;
  std::string route;
  v1::TaskTimings timings;
};

class CostModel {
 public:
  explicit CostModel(Defaults defaults = {}) : defaults_(defaults) {}

  /// The rates of `host`: learned where a committed operation taught them,
  /// else from `probe` (null: the last one NoteProbe kept, if any) and the
  /// defaults.
  HostRates RatesOf(const std::string& host, const v1::HostProbe* probe) const;
  /// Keeps `host`'s registration probe: its machine and CPUs, which
  /// ObserveCommit needs to tell a CPU-bound operation.
  void NoteProbe(const std::string& host, const v1::HostProbe& probe);
  double OverheadSeconds() const;
  bool OverheadLearned() const;
  const Defaults& defaults() const { return defaults_; }

  /// Learns from one host's finished task. Tasks too small to time a rate
  /// (under kMinBytes in the phase) leave it as it was.
  void ObserveTask(const TaskObservation& o);
  /// The same but for the NIC rates, which wait for the commit of
  /// `operation_id` (ObserveCommit): only then is it known whether the
  /// machines' CPUs, not the network, set the pace.
  void ObserveTask(const std::string& operation_id, const TaskObservation& o);
  /// Learns the overhead from one committed operation: `actual_seconds`
  /// (planned -> committed) minus its longest host task.
  void ObserveOperation(double actual_seconds, double longest_task_seconds);
  /// For `operation_id`'s tasks ObserveTask saw: the NIC rates of the hosts
  /// whose machine was not CPU-bound (its hosts' CPU-seconds over its CPUs
  /// under kCpuBoundShare of their longest task); on a CPU-bound machine
  /// only a floor (each NIC went at least as fast as the move: a lower rate,
  /// or none, is raised to that); and the overhead (ObserveOperation); then
  /// forgets the operation. Nothing when it saw none.
  void ObserveCommit(const std::string& operation_id, double actual_seconds);
  /// Forgets an operation that ended without committing.
  void Forget(const std::string& operation_id);

  /// Bytes below which a phase's time says too little about its rate.
  static constexpr int64_t kMinBytes = 16 << 20;
  /// Weight of a new observation against what was learned before.
  static constexpr double kWeight = 0.5;
  /// A machine whose hosts' tasks used at least this share of its CPUs over
  /// their longest task was CPU-bound: its hosts' moves give their NICs only
  /// a floor.
  static constexpr double kCpuBoundShare = 0.6;

 private:
  const Defaults defaults_;
  mutable std::mutex mu_;
  std::map<std::string, HostRates> learned_;  // only rates with learned = true are used
  double overhead_ = 0;
  bool overhead_learned_ = false;
  std::map<std::string, v1::HostProbe> probes_;
  // Operations with finished tasks and no end yet: their tasks, and the
  // order they came in (the oldest are dropped beyond kMaxPending).
  static constexpr size_t kMaxPending = 4096;
  std::map<std::string, std::vector<TaskObservation>> pending_;
  std::deque<std::string> pending_order_;
};

}  // namespace reshard::cost
