// What the agent's host tasks cost the host: the process's CPU time and
// context switches (wake-ups) while at least one task runs, against the
// bytes the tasks wrote meanwhile. Overlapping tasks make one busy period,
// so nothing is counted twice. Pure: the usage comes from a sampler
// (getrusage in the agent, a fake in tests). Thread-safe.
#pragma once

#include <cstdint>
#include <functional>
#include <mutex>

namespace reshard::agent {

/// The process's resource use so far.
struct ProcessUsage {
  double cpu_seconds = 0;   // user + system, every thread
  int64_t voluntary = 0;    // context switches: the thread waited (a wake-up follows)
  int64_t involuntary = 0;  // context switches: the thread was preempted
};

/// getrusage(RUSAGE_SELF).
ProcessUsage SampleProcessUsage();

/// One busy period's cost.
struct BusyPeriod {
  double cpu_seconds = 0;
  int64_t voluntary = 0;
  int64_t involuntary = 0;
  int64_t bytes = 0;  // written by the tasks during it

  /// CPU seconds per GB (1e9 bytes) written; 0 when nothing was written.
  double CpuSecondsPerGb() const;
  /// Voluntary context switches per MB (1e6 bytes) written; 0 likewise.
  double WakeupsPerMb() const;
};

class BusyMeter {
 public:
  explicit BusyMeter(std::function<ProcessUsage()> sample = SampleProcessUsage);

  /// A task started: the first of a busy period samples the usage.
  void TaskStarted();
  /// A running task wrote `bytes` more.
  void Wrote(int64_t bytes);
  /// A task ended: the last of a busy period returns the period's cost
  /// (true); otherwise false and `*period` is untouched.
  bool TaskFinished(BusyPeriod* period);

 private:
  const std::function<ProcessUsage()> sample_;
  std::mutex mu_;
  int running_ = 0;
  ProcessUsage start_;
  int64_t bytes_ = 0;
};

}  // namespace reshard::agent
