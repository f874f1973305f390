// device_bench: the executor's device-local steps (issue 23) against the
// device API's own device-to-device copy of the same bytes, in one run.
//
// One host, one float32 tensor of --mib MiB, device-resident: generation 1
// is one rank (tp 1) on device 0, generation 2 is two ranks (tp 2), split
// along rows (each new rank a contiguous half: two large runs) or along
// columns (each new rank's rows half a source row: one run per row). The
// executor runs the task as the agent does (TaskExecutor::Execute with the
// agent's device store: the device-direct route), timed
//  - "steps": from Execute's start to its last progress report with every
//    byte copied (buffers made, zeroed, every run queued and synchronized),
//  - "execute": the whole call, the seal included (every new byte copied to
//    pinned host memory and hashed with XXH3-64 on the CPU);
// against "D2D": MemcpyAsync of the same bytes, device to device, one call,
// into a buffer made before the clock starts. Every new byte is read back
// and compared with the source; a difference or a failed run exits 1.
//
//   device_bench [--device SPEC] [--mib N] [--reps N] [--quick]
// SPEC as $RESHARD_DEVICE (default: CUDA when loaded with a device); the
// CTest smoke runs it on the fake device (--device fake:2 --quick).
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "agent/device/device_api.h"
#include "agent/executor/executor.h"
#include "agent/shard_store/device_buffer.h"
#include "planner/planner.h"
#include "tests/support/job_builders.h"

namespace reshard::agent {
namespace {

using Clock = std::chrono::steady_clock;
constexpr char kJob[] = "bench";

double Since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

v1::Layout OneHost(int tp) { return test_support::MakeLayout(tp, 1, 1, {"h0"}, tp); }

v1::Ptc OneTensor(int64_t rows, int64_t cols, int axis) {
  v1::Ptc ptc;
  ptc.set_num_layers(1);
  test_support::SetTpSplit(test_support::AddTensor(&ptc, "w", {rows, cols}), axis);
  return ptc;
}

struct Figures {
  double steps = 0;    // seconds
  double execute = 0;  // seconds
  bool ok = false;
};

// One timed resize of `ptc` (1 rank -> 2 ranks, split along `axis`),
// checked byte for byte against `src` (the tensor's bytes, row-major).
Figures RunResize(DeviceBufferStore& devices, TaskExecutor& executor, const v1::Ptc& ptc, int axis,
                  const std::vector<uint8_t>& src, int rep) {
  Figures f;
  const int64_t rows = ptc.tensors(0).shape(0), cols = ptc.tensors(0).shape(1);
  const int64_t from_gen = 1 + 2 * rep, to_gen = from_gen + 1;
  auto made = devices.CreateAll({{kJob, from_gen, 0}}, {0}, {{static_cast<int64_t>(src.size())}});
  if (!made.ok() || !devices.WriteItem({kJob, from_gen, 0}, 0, 0, src.data(), src.size()).ok() ||
      !devices.Seal({kJob, from_gen, 0}, {}).ok()) {
    std::fprintf(stderr, "could not make the source: %s\n", made.status().ToString().c_str());
    return f;
  }
  auto plan = planner::PlanTransfer(ptc, OneHost(1), OneHost(2), {});
  if (!plan.ok()) {
    std::fprintf(stderr, "planner: %s\n", plan.status().ToString().c_str());
    return f;
  }
  v1::HostTask task;
  task.set_operation_id("op-" + std::to_string(rep));
  task.set_job_id(kJob);
  task.set_from_generation(from_gen);
  task.set_to_generation(to_gen);
  *task.mutable_ptc() = ptc;
  *task.mutable_plan() = *plan;
  const Clock::time_point t0 = Clock::now();
  double moved = -1;
  auto sums = executor.Execute(
      "h0", task,
      [&](int64_t done, int64_t total) {
        if (done == total && moved < 0) moved = Since(t0);
      },
      [] { return false; });
  f.execute = Since(t0);
  f.steps = moved;
  if (!sums.ok()) {
    std::fprintf(stderr, "Execute: %s\n", sums.status().ToString().c_str());
    return f;
  }
  // Read back and compare with the split of `src`.
  const int64_t half_rows = axis == 0 ? rows / 2 : rows, half_cols = axis == 0 ? cols : cols / 2;
  std::vector<uint8_t> got(half_rows * half_cols * 4);
  f.ok = true;
  for (int r = 0; r < 2 && f.ok; ++r) {
    auto b = devices.Get({kJob, to_gen, r});
    absl::Status s =
        b.ok() ? devices.ReadItem({kJob, to_gen, r}, 0, 0, got.data(), got.size()) : b.status();
    if (!s.ok()) {
      std::fprintf(stderr, "new rank %d: %s\n", r, s.ToString().c_str());
      f.ok = false;
      break;
    }
    for (int64_t i = 0; i < half_rows && f.ok; ++i) {
      const int64_t src_row = axis == 0 ? r * half_rows + i : i;
      const int64_t src_col = axis == 0 ? 0 : r * half_cols;
      if (std::memcmp(got.data() + i * half_cols * 4, src.data() + (src_row * cols + src_col) * 4,
                      half_cols * 4) != 0) {
        std::fprintf(stderr, "new rank %d row %lld: bytes differ\n", r, static_cast<long long>(i));
        f.ok = false;
      }
    }
  }
  devices.DropGeneration(kJob, from_gen);
  devices.DropGeneration(kJob, to_gen);
  return f;
}

// Seconds of one MemcpyAsync of `bytes`, device to device (best of `reps`).
double TimeD2D(DeviceApi& api, int64_t bytes, int reps) {
  auto a = api.Malloc(0, bytes), b = api.Malloc(0, bytes);
  auto stream = api.CreateStream(0);
  double best = -1;
  for (const absl::Status& s : {a.status(), b.status(), stream.status()}) {
    if (!s.ok()) std::fprintf(stderr, "D2D: %s\n", s.ToString().c_str());
  }
  if (a.ok() && b.ok() && stream.ok()) {
    for (int i = 0; i <= reps; ++i) {  // the first warms up
      const Clock::time_point t0 = Clock::now();
      absl::Status s = api.MemcpyAsync(*b, *a, bytes, CopyKind::kDeviceToDevice, *stream);
      if (s.ok()) s = api.StreamSynchronize(*stream);
      const double t = Since(t0);
      if (!s.ok()) {
        std::fprintf(stderr, "D2D: %s\n", s.ToString().c_str());
        best = -1;
        break;
      }
      if (i > 0 && (best < 0 || t < best)) best = t;
    }
  }
  if (stream.ok()) (void)api.DestroyStream(*stream);
  if (a.ok()) (void)api.Free(0, *a);
  if (b.ok()) (void)api.Free(0, *b);
  return best;
}

int Main(int argc, char** argv) {
  std::string spec;
  int64_t mib = 2048;
  int reps = 3;
  if (const char* e = std::getenv("RESHARD_DEVICE")) spec = e;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--device" && i + 1 < argc) {
      spec = argv[++i];
    } else if (a == "--mib" && i + 1 < argc) {
      mib = std::atoll(argv[++i]);
    } else if (a == "--reps" && i + 1 < argc) {
      reps = std::atoi(argv[++i]);
    } else if (a == "--quick") {
      mib = 16;
      reps = 1;
    } else {
      std::fprintf(stderr, "usage: device_bench [--device SPEC] [--mib N] [--reps N] [--quick]\n");
      return 2;
    }
  }
  auto api = MakeDeviceApi(spec);
  if (!api.ok() || *api == nullptr) {
    std::fprintf(stderr, "device_bench: no device API for \"%s\": %s\n", spec.c_str(),
                 api.ok() ? "none loaded (set --device)" : api.status().ToString().c_str());
    return 1;
  }
  DeviceApi& dev = **api;
  auto devices = DeviceBufferStore::Open(&dev, DeviceBufferStore::Options{});
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / ("device_bench-" + std::to_string(getpid()));
  ShardStore::Options so;
  std::filesystem::create_directories(dir);
  so.shm_dir = dir.string();
  so.host_id = "h0";
  so.memory_limit_bytes = int64_t{1} << 30;
  auto host = ShardStore::Open(so);
  if (!devices.ok() || !host.ok()) {
    std::fprintf(stderr, "device_bench: stores: %s %s\n", devices.status().ToString().c_str(),
                 host.status().ToString().c_str());
    return 1;
  }
  TaskExecutor executor(host->get(), nullptr, TaskExecutor::Options{}, devices->get());

  const int64_t cols = 4096;
  const int64_t rows = std::max<int64_t>(2, mib * (int64_t{1} << 20) / (cols * 4) / 2 * 2);
  const int64_t bytes = rows * cols * 4;
  std::vector<uint8_t> src(bytes);
  for (int64_t i = 0; i < bytes; ++i) src[i] = static_cast<uint8_t>((i * 2654435761u) >> 13);
  const DeviceApiCapabilities caps = dev.capabilities();
  std::printf(
      "device_bench: %s, %d device(s); one float32 tensor [%lld, %lld], %.1f MiB; "
      "1 rank -> 2 ranks on one host (device-direct route); best of %d\n",
      caps.name.c_str(), caps.device_count, static_cast<long long>(rows),
      static_cast<long long>(cols), bytes / 1048576.0, reps);
  const double d2d = TimeD2D(dev, bytes, reps);
  if (d2d <= 0) return 1;
  std::printf("  %-44s %9.2f GB/s  (%8.2f ms)\n", "D2D (MemcpyAsync, one call)", bytes / d2d / 1e9,
              d2d * 1e3);
  int failures = 0;
  int rep_id = 0;
  for (const int axis : {0, 1}) {
    const v1::Ptc ptc = OneTensor(rows, cols, axis);
    Figures best;
    for (int i = 0; i <= reps; ++i) {  // the first warms up
      const Figures f = RunResize(**devices, executor, ptc, axis, src, rep_id++);
      if (!f.ok) {
        ++failures;
        break;
      }
      if (i == 0) continue;
      if (best.steps <= 0 || f.steps < best.steps) best.steps = f.steps;
      if (best.execute <= 0 || f.execute < best.execute) best.execute = f.execute;
    }
    if (best.steps <= 0) continue;
    const char* what = axis == 0 ? "rows (2 runs)" : "columns (1 run per row)";
    std::printf("  split along %-23s steps   %9.2f GB/s  (%8.2f ms)  %.2fx D2D (target >= 0.7x)\n",
                what, bytes / best.steps / 1e9, best.steps * 1e3, d2d / best.steps);
    std::printf("  split along %-23s execute %9.2f GB/s  (%8.2f ms)  %.2fx D2D (seal included)\n",
                what, bytes / best.execute / 1e9, best.execute * 1e3, d2d / best.execute);
  }
  std::filesystem::remove_all(dir);
  std::printf("device_bench: %s\n", failures == 0 ? "every new byte checked" : "FAILED");
  return failures == 0 ? 0 : 1;
}

}  // namespace
}  // namespace reshard::agent

int main(int argc, char** argv) { return reshard::agent::Main(argc, argv); }
