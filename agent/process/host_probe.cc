#include "agent/process/host_probe.h"

#include <sys/mman.h>
#include <xxhash.h>

#include <chrono>
#include <cstring>
#include <vector>

namespace reshard::agent {

v1::HostProbe MeasureHostProbe(int64_t bytes) {
  v1::HostProbe probe;
  const size_t n = static_cast<size_t>(bytes);
  std::vector<uint8_t> src(n);
  for (size_t i = 0; i < n; i += 4096) src[i] = static_cast<uint8_t>(i >> 12);
  void* dst = mmap(nullptr, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (dst == MAP_FAILED) return probe;  // no probe: the coordinator uses its defaults
  using Clock = std::chrono::steady_clock;
  const auto t0 = Clock::now();
  std::memcpy(dst, src.data(), n);
  const auto t1 = Clock::now();
  volatile uint64_t sum = XXH3_64bits(dst, n);
  (void)sum;
  const auto t2 = Clock::now();
  munmap(dst, n);
  const double copy = std::chrono::duration<double>(t1 - t0).count();
  const double hash = std::chrono::duration<double>(t2 - t1).count();
  if (copy > 0) probe.set_copy_bytes_per_s(static_cast<double>(bytes) / copy);
  if (hash > 0) probe.set_hash_bytes_per_s(static_cast<double>(bytes) / hash);
  return probe;
}

}  // namespace reshard::agent
