#include "agent/process/busy_meter.h"

#include <sys/resource.h>

#include <utility>

namespace reshard::agent {

ProcessUsage SampleProcessUsage() {
  rusage r{};
  ProcessUsage u;
  if (::getrusage(RUSAGE_SELF, &r) != 0) return u;
  auto seconds = [](const timeval& t) {
    return static_cast<double>(t.tv_sec) + static_cast<double>(t.tv_usec) * 1e-6;
  };
  u.cpu_seconds = seconds(r.ru_utime) + seconds(r.ru_stime);
  u.voluntary = r.ru_nvcsw;
  u.involuntary = r.ru_nivcsw;
  return u;
}

double BusyPeriod::CpuSecondsPerGb() const {
  return bytes > 0 ? cpu_seconds / (static_cast<double>(bytes) / 1e9) : 0.0;
}

double BusyPeriod::WakeupsPerMb() const {
  return bytes > 0 ? static_cast<double>(voluntary) / (static_cast<double>(bytes) / 1e6) : 0.0;
}

BusyMeter::BusyMeter(std::function<ProcessUsage()> sample) : sample_(std::move(sample)) {}

void BusyMeter::TaskStarted() {
  std::lock_guard<std::mutex> l(mu_);
  if (running_++ == 0) {
    start_ = sample_();
    bytes_ = 0;
  }
}

void BusyMeter::Wrote(int64_t bytes) {
  std::lock_guard<std::mutex> l(mu_);
  if (running_ > 0 && bytes > 0) bytes_ += bytes;
}

bool BusyMeter::TaskFinished(BusyPeriod* period) {
  std::lock_guard<std::mutex> l(mu_);
  if (running_ == 0 || --running_ > 0) return false;
  const ProcessUsage end = sample_();
  period->cpu_seconds = end.cpu_seconds - start_.cpu_seconds;
  period->voluntary = end.voluntary - start_.voluntary;
  period->involuntary = end.involuntary - start_.involuntary;
  period->bytes = bytes_;
  return true;
}

}  // namespace reshard::agent
