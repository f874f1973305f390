#include "agent/process/host_probe.h"

#include <sched.h>
#include <sys/mman.h>
#include <xxhash.h>

#include <chrono>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

namespace reshard::agent {
namespace {

// The machine's boot id (agents of one machine share its CPUs) and the CPUs
// this process may run on.
void DescribeMachine(v1::HostProbe* probe);

}  // namespace

v1::HostProbe MeasureHostProbe(int64_t bytes) {
  v1::HostProbe probe;
  DescribeMachine(&probe);
  if (bytes <= 0) return probe;
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

namespace {

void DescribeMachine(v1::HostProbe* probe) {
  std::ifstream boot("/proc/sys/kernel/random/boot_id");
  std::string id;
  if (boot >> id) probe->set_machine_id(id);
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) == 0) probe->set_cpus(CPU_COUNT(&set));
}

}  // namespace

}  // namespace reshard::agent
