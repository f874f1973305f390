#include "agent/device/fake_device.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace reshard::agent {
namespace {

constexpr char kIpcTag[] = "fake-ipc";

int64_t RoundUp(int64_t v, int64_t to) { return (v + to - 1) / to * to; }

// "0x7f..." for messages.
std::string Addr(const void* p) {
  return absl::StrCat("0x", absl::Hex(reinterpret_cast<uintptr_t>(p)));
}

std::string Errno(const char* what) { return absl::StrCat(what, ": ", std::strerror(errno)); }

std::string Where(const char* call, int device, size_t bytes) {
  return absl::StrCat(call, " (fake device ", device, ", ", bytes, " bytes)");
}

}  // namespace

// One stream: a FIFO of operations, run in order by a thread of its own.
class FakeDeviceApi::Stream {
 public:
  explicit Stream(int device) : device_(device), thread_([this] { Run(); }) {}
  ~Stream() {
    {
      std::lock_guard<std::mutex> l(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }
  int device() const { return device_; }
  void Push(std::function<void()> op) {
    {
      std::lock_guard<std::mutex> l(mu_);
      queue_.push_back(std::move(op));
    }
    cv_.notify_all();
  }
  // Waits for the queue; returns (and clears) the first error of a host
  // work (LaunchHostWork) since the last call.
  absl::Status Synchronize() {
    std::unique_lock<std::mutex> l(mu_);
    cv_.wait(l, [this] { return queue_.empty() && !busy_; });
    absl::Status e = std::move(error_);
    error_ = absl::OkStatus();
    return e;
  }
  void WaitIdle() {
    std::unique_lock<std::mutex> l(mu_);
    cv_.wait(l, [this] { return queue_.empty() && !busy_; });
  }
  void SetError(absl::Status s) {
    std::lock_guard<std::mutex> l(mu_);
    if (error_.ok()) error_ = std::move(s);
  }

 private:
  void Run() {
    std::unique_lock<std::mutex> l(mu_);
    while (true) {
      cv_.wait(l, [this] { return stop_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stop_, nothing left
      std::function<void()> op = std::move(queue_.front());
      queue_.pop_front();
      busy_ = true;
      l.unlock();
      op();
      l.lock();
      busy_ = false;
      cv_.notify_all();
    }
  }

  const int device_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> queue_;
  bool busy_ = false;
  bool stop_ = false;
  absl::Status error_;
  std::thread thread_;  // last: starts after the members it uses
};

FakeDeviceApi::FakeDeviceApi(const Options& options)
    : options_(options), used_(static_cast<size_t>(std::max(options.devices, 0)), 0) {
  const int probe = memfd_create("reshard-fake-device-probe", MFD_CLOEXEC);
  struct stat st {};
  if (probe >= 0 && fstat(probe, &st) == 0) memfd_dev_ = st.st_dev;
  if (probe >= 0) close(probe);
}

FakeDeviceApi::~FakeDeviceApi() {
  for (Stream* s : streams_) {
    s->WaitIdle();
    delete s;
  }
  for (auto& [base, a] : allocations_) Unmap(reinterpret_cast<void*>(base), a);
}

DeviceApiCapabilities FakeDeviceApi::capabilities() const {
  DeviceApiCapabilities c;
  c.name = "fake";
  c.device_count = options_.devices;
  c.ipc = true;
  c.peer_copy = true;
  return c;
}

absl::Status FakeDeviceApi::CheckDevice(const char* call, int device) const {
  if (device < 0 || device >= options_.devices) {
    return absl::InvalidArgumentError(
        absl::StrCat(call, ": fake device ", device, " out of range [0, ", options_.devices, ")"));
  }
  return absl::OkStatus();
}

absl::StatusOr<void*> FakeDeviceApi::MapLocked(int device, int fd, size_t bytes, int64_t charged,
                                               bool opened) {
  const size_t mapped = RoundUp(std::max<size_t>(bytes, 1), sysconf(_SC_PAGESIZE));
  void* base = mmap(nullptr, mapped, PROT_NONE, MAP_SHARED, fd, 0);
  if (base == MAP_FAILED) return absl::ResourceExhaustedError(Errno("mmap"));
  void* shadow = mmap(nullptr, mapped, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (shadow == MAP_FAILED) {
    munmap(base, mapped);
    return absl::ResourceExhaustedError(Errno("mmap"));
  }
  Allocation a;
  a.device = device;
  a.bytes = bytes;
  a.mapped = mapped;
  a.charged = charged;
  a.fd = fd;
  a.shadow = static_cast<uint8_t*>(shadow);
  a.opened = opened;
  allocations_[reinterpret_cast<uintptr_t>(base)] = a;
  return base;
}

void FakeDeviceApi::Unmap(void* base, const Allocation& a) {
  munmap(base, a.mapped);
  munmap(a.shadow, a.mapped);
  if (a.fd >= 0) close(a.fd);
}

absl::StatusOr<void*> FakeDeviceApi::Malloc(int device, size_t bytes) {
  if (absl::Status s = CheckDevice("cudaMalloc", device); !s.ok()) return s;
  if (bytes == 0) return nullptr;
  const int64_t charged = RoundUp(static_cast<int64_t>(bytes), kDeviceAlignment);
  std::lock_guard<std::mutex> l(mu_);
  const int64_t free_bytes = options_.capacity_bytes - used_[device];
  if (charged > free_bytes) {
    return absl::ResourceExhaustedError(absl::StrCat(
        Where("cudaMalloc", device, bytes), ": out of memory, ", free_bytes, " of ",
        options_.capacity_bytes, " bytes free"));
  }
  int fd = memfd_create(absl::StrCat("reshard-fake-device-", device).c_str(), MFD_CLOEXEC);
  if (fd < 0) return absl::ResourceExhaustedError(Errno("memfd_create"));
  const size_t mapped = RoundUp(static_cast<int64_t>(bytes), sysconf(_SC_PAGESIZE));
  if (ftruncate(fd, static_cast<off_t>(mapped)) != 0) {
    std::string e = Errno("ftruncate");
    close(fd);
    return absl::ResourceExhaustedError(absl::StrCat(Where("cudaMalloc", device, bytes), ": ", e));
  }
  absl::StatusOr<void*> base = MapLocked(device, fd, bytes, charged, /*opened=*/false);
  if (!base.ok()) {
    close(fd);
    return base.status();
  }
  used_[device] += charged;
  return base;
}

absl::Status FakeDeviceApi::SynchronizeAll() {
  std::vector<Stream*> streams;
  {
    std::lock_guard<std::mutex> l(mu_);
    // Every stream, not only the device's: a peer copy on another device's
    // stream may read or write this device's memory.
    streams.assign(streams_.begin(), streams_.end());
  }
  // Waits only: a host work's error stays for its stream's synchronize.
  for (Stream* s : streams) s->WaitIdle();
  return absl::OkStatus();
}

absl::StatusOr<FakeDeviceApi::Allocations::iterator> FakeDeviceApi::FindLocked(const char* call,
                                                                              int device,
                                                                              void* ptr,
                                                                              bool opened) {
  auto it = allocations_.find(reinterpret_cast<uintptr_t>(ptr));
  if (it == allocations_.end() || it->second.opened != opened || it->second.device != device) {
    return absl::InvalidArgumentError(absl::StrCat(
        call, " (fake device ", device, "): ", Addr(ptr), " is not memory that ",
        opened ? "IpcOpen" : "Malloc", " returned on this device"));
  }
  return it;
}

absl::Status FakeDeviceApi::Free(int device, void* ptr) {
  if (absl::Status s = CheckDevice("cudaFree", device); !s.ok()) return s;
  if (ptr == nullptr) return absl::OkStatus();
  if (absl::Status s = SynchronizeAll(); !s.ok()) return s;
  std::lock_guard<std::mutex> l(mu_);
  absl::StatusOr<Allocations::iterator> it = FindLocked("cudaFree", device, ptr, false);
  if (!it.ok()) return it.status();
  used_[device] -= (*it)->second.charged;
  Unmap(ptr, (*it)->second);
  allocations_.erase(*it);
  return absl::OkStatus();
}

absl::StatusOr<DeviceMemoryInfo> FakeDeviceApi::MemoryInfo(int device) {
  if (absl::Status s = CheckDevice("cudaMemGetInfo", device); !s.ok()) return s;
  std::lock_guard<std::mutex> l(mu_);
  return DeviceMemoryInfo{options_.capacity_bytes - used_[device], options_.capacity_bytes};
}

int64_t FakeDeviceApi::used_bytes(int device) const {
  std::lock_guard<std::mutex> l(mu_);
  return device >= 0 && device < options_.devices ? used_[device] : 0;
}

absl::StatusOr<DeviceStream> FakeDeviceApi::CreateStream(int device) {
  if (absl::Status s = CheckDevice("cudaStreamCreate", device); !s.ok()) return s;
  auto* s = new Stream(device);
  std::lock_guard<std::mutex> l(mu_);
  streams_.insert(s);
  return DeviceStream{s, device};
}

absl::StatusOr<FakeDeviceApi::Stream*> FakeDeviceApi::Find(const char* call,
                                                           DeviceStream stream) const {
  std::lock_guard<std::mutex> l(mu_);
  auto* s = static_cast<Stream*>(stream.impl);
  if (streams_.count(s) == 0) {
    return absl::InvalidArgumentError(absl::StrCat(call, ": stream ", Addr(stream.impl),
                                                   " of device ", stream.device,
                                                   " is not a live fake stream"));
  }
  return s;
}

absl::Status FakeDeviceApi::DestroyStream(DeviceStream stream) {
  absl::StatusOr<Stream*> s = Find("cudaStreamDestroy", stream);
  if (!s.ok()) return s.status();
  (void)(*s)->Synchronize();  // a host work's error dies with its stream
  {
    std::lock_guard<std::mutex> l(mu_);
    streams_.erase(*s);
  }
  delete *s;
  return absl::OkStatus();
}

absl::StatusOr<uint8_t*> FakeDeviceApi::Shadow(const char* call, const char* what,
                                               const void* ptr, size_t bytes, int device) const {
  const auto p = reinterpret_cast<uintptr_t>(ptr);
  std::lock_guard<std::mutex> l(mu_);
  auto it = allocations_.upper_bound(p);
  if (it != allocations_.begin()) {
    --it;
    const Allocation& a = it->second;
    if (p >= it->first && p + bytes <= it->first + a.bytes && ptr != nullptr) {
      if (a.device != device) {
        return absl::InvalidArgumentError(absl::StrCat(Where(call, device, bytes), ": ", what, " ",
                                                       Addr(ptr), " is memory of fake device ",
                                                       a.device));
      }
      return a.shadow + (p - it->first);
    }
  }
  return absl::InvalidArgumentError(
      absl::StrCat(Where(call, device, bytes), ": ", what, " ", Addr(ptr),
                   " is not device memory of that device (or the range passes its "
                   "allocation's end)"));
}

absl::Status FakeDeviceApi::CheckHost(const char* call, const char* what, const void* ptr,
                                      size_t bytes, int device) const {
  const auto p = reinterpret_cast<uintptr_t>(ptr);
  std::lock_guard<std::mutex> l(mu_);
  auto it = allocations_.lower_bound(p + bytes);
  if (it != allocations_.begin()) {
    --it;
    if (it->first + it->second.mapped > p) {
      return absl::InvalidArgumentError(absl::StrCat(Where(call, device, bytes), ": ", what,
                                                     " ", Addr(ptr),
                                                     " is device memory, not host memory"));
    }
  }
  return ptr == nullptr && bytes > 0
             ? absl::InvalidArgumentError(absl::StrCat(Where(call, device, bytes), ": ", what,
                                                       " is null"))
             : absl::OkStatus();
}

absl::Status FakeDeviceApi::MemcpyAsync(void* dst, const void* src, size_t bytes, CopyKind kind,
                                        DeviceStream stream) {
  absl::StatusOr<Stream*> s = Find("cudaMemcpyAsync", stream);
  if (!s.ok()) return s.status();
  if (bytes == 0) return absl::OkStatus();
  const int d = (*s)->device();
  uint8_t* to = static_cast<uint8_t*>(dst);
  const uint8_t* from = static_cast<const uint8_t*>(src);
  if (kind == CopyKind::kHostToDevice || kind == CopyKind::kDeviceToDevice) {
    absl::StatusOr<uint8_t*> sh = Shadow("cudaMemcpyAsync", "destination", dst, bytes, d);
    if (!sh.ok()) return sh.status();
    to = *sh;
  } else if (absl::Status c = CheckHost("cudaMemcpyAsync", "destination", dst, bytes, d);
             !c.ok()) {
    return c;
  }
  if (kind == CopyKind::kDeviceToHost || kind == CopyKind::kDeviceToDevice) {
    absl::StatusOr<uint8_t*> sh = Shadow("cudaMemcpyAsync", "source", src, bytes, d);
    if (!sh.ok()) return sh.status();
    from = *sh;
  } else if (absl::Status c = CheckHost("cudaMemcpyAsync", "source", src, bytes, d); !c.ok()) {
    return c;
  }
  (*s)->Push([to, from, bytes] { std::memmove(to, from, bytes); });
  return absl::OkStatus();
}

absl::Status FakeDeviceApi::MemcpyPeerAsync(void* dst, int dst_device, const void* src,
                                            int src_device, size_t bytes, DeviceStream stream) {
  absl::StatusOr<Stream*> s = Find("cudaMemcpyPeerAsync", stream);
  if (!s.ok()) return s.status();
  if (bytes == 0) return absl::OkStatus();
  absl::StatusOr<uint8_t*> to = Shadow("cudaMemcpyPeerAsync", "destination", dst, bytes,
                                       dst_device);
  if (!to.ok()) return to.status();
  absl::StatusOr<uint8_t*> from = Shadow("cudaMemcpyPeerAsync", "source", src, bytes, src_device);
  if (!from.ok()) return from.status();
  (*s)->Push([to = *to, from = *from, bytes] { std::memmove(to, from, bytes); });
  return absl::OkStatus();
}

absl::Status FakeDeviceApi::MemsetAsync(void* dst, int value, size_t bytes, DeviceStream stream) {
  absl::StatusOr<Stream*> s = Find("cudaMemsetAsync", stream);
  if (!s.ok()) return s.status();
  if (bytes == 0) return absl::OkStatus();
  absl::StatusOr<uint8_t*> to = Shadow("cudaMemsetAsync", "destination", dst, bytes,
                                       (*s)->device());
  if (!to.ok()) return to.status();
  (*s)->Push([to = *to, value, bytes] { std::memset(to, value, bytes); });
  return absl::OkStatus();
}

absl::Status FakeDeviceApi::StreamSynchronize(DeviceStream stream) {
  absl::StatusOr<Stream*> s = Find("cudaStreamSynchronize", stream);
  if (!s.ok()) return s.status();
  return (*s)->Synchronize();
}

absl::Status FakeDeviceApi::LaunchHostWork(DeviceStream stream,
                                           std::function<absl::Status()> work) {
  absl::StatusOr<Stream*> s = Find("cudaLaunchHostFunc", stream);
  if (!s.ok()) return s.status();
  Stream* q = *s;
  q->Push([q, work = std::move(work)] {
    if (absl::Status e = work(); !e.ok()) q->SetError(std::move(e));
  });
  return absl::OkStatus();
}

absl::StatusOr<uint8_t*> FakeDeviceApi::HostView(const char* call, const void* ptr, size_t bytes,
                                                 int device) const {
  if (absl::Status s = CheckDevice(call, device); !s.ok()) return s;
  return Shadow(call, "buffer", ptr, bytes, device);
}

std::function<void()> FakeDeviceApi::HoldStream(DeviceStream stream) {
  absl::StatusOr<Stream*> s = Find("HoldStream", stream);
  if (!s.ok()) return [] {};
  auto gate = std::make_shared<std::pair<std::mutex, std::condition_variable>>();
  auto open = std::make_shared<bool>(false);
  (*s)->Push([gate, open] {
    std::unique_lock<std::mutex> l(gate->first);
    gate->second.wait(l, [&] { return *open; });
  });
  return [gate, open] {
    {
      std::lock_guard<std::mutex> l(gate->first);
      *open = true;
    }
    gate->second.notify_all();
  };
}

absl::StatusOr<void*> FakeDeviceApi::MallocHost(size_t bytes) {
  void* p = std::aligned_alloc(4096, RoundUp(std::max<size_t>(bytes, 1), 4096));
  if (p == nullptr) {
    return absl::ResourceExhaustedError(absl::StrCat("cudaMallocHost (fake): ", bytes, " bytes"));
  }
  host_registrations_.fetch_add(1);
  return p;
}

absl::Status FakeDeviceApi::FreeHost(void* ptr) {
  std::free(ptr);
  return absl::OkStatus();
}

absl::StatusOr<std::string> FakeDeviceApi::IpcExport(int device, void* ptr) {
  if (absl::Status s = CheckDevice("cudaIpcGetMemHandle", device); !s.ok()) return s;
  std::lock_guard<std::mutex> l(mu_);
  absl::StatusOr<Allocations::iterator> it = FindLocked("cudaIpcGetMemHandle", device, ptr, false);
  if (!it.ok()) return it.status();
  return absl::StrCat(kIpcTag, " ", getpid(), " ", (*it)->second.fd, " ", device, " ",
                      (*it)->second.bytes);
}

namespace {

struct FakeIpcHandle {
  int64_t pid = 0, fd = 0, device = 0;
  uint64_t bytes = 0;
};

absl::StatusOr<FakeIpcHandle> ParseIpcHandle(int device, const std::string& handle) {
  std::vector<std::string> f = absl::StrSplit(handle, ' ');
  FakeIpcHandle h;
  if (f.size() != 5 || f[0] != kIpcTag || !absl::SimpleAtoi(f[1], &h.pid) ||
      !absl::SimpleAtoi(f[2], &h.fd) || !absl::SimpleAtoi(f[3], &h.device) ||
      !absl::SimpleAtoi(f[4], &h.bytes) || h.pid <= 0 || h.fd < 0) {
    return absl::InvalidArgumentError(absl::StrCat("cudaIpcOpenMemHandle (fake device ", device,
                                                   "): \"", handle, "\" is not a fake IPC handle"));
  }
  return h;
}

}  // namespace

absl::StatusOr<void*> FakeDeviceApi::IpcOpenFrom(int device, const std::string& handle,
                                                 int64_t peer_pid) {
  if (absl::Status s = CheckDevice("cudaIpcOpenMemHandle", device); !s.ok()) return s;
  absl::StatusOr<FakeIpcHandle> h = ParseIpcHandle(device, handle);
  if (!h.ok()) return h.status();
  if (peer_pid <= 0 || h->pid != peer_pid) {
    return absl::PermissionDeniedError(absl::StrCat(
        Where("cudaIpcOpenMemHandle", device, h->bytes), ": the handle names process ", h->pid,
        " descriptor ", h->fd, ", but the caller is ",
        peer_pid > 0 ? absl::StrCat("process ", peer_pid) : std::string("an unknown process"),
        ": a worker exports only its own memory"));
  }
  return IpcOpen(device, handle);
}

absl::StatusOr<void*> FakeDeviceApi::IpcOpen(int device, const std::string& handle) {
  if (absl::Status s = CheckDevice("cudaIpcOpenMemHandle", device); !s.ok()) return s;
  absl::StatusOr<FakeIpcHandle> h = ParseIpcHandle(device, handle);
  if (!h.ok()) return h.status();
  const uint64_t bytes = h->bytes;
  const std::string path = absl::StrCat("/proc/", h->pid, "/fd/", h->fd);
  const absl::Status not_memfd = absl::PermissionDeniedError(
      absl::StrCat(Where("cudaIpcOpenMemHandle", device, bytes), ": ", path,
                   " is not a memfd (a fake device allocation is one); nothing was read"));
  // What the descriptor names first (nothing is opened for a file on disk),
  // then what was opened: the fstat below is the check that counts.
  char link[64] = {};
  const ssize_t n = readlink(path.c_str(), link, sizeof(link) - 1);
  if (n >= 0 && !absl::StartsWith(absl::string_view(link, static_cast<size_t>(n)), "/memfd:")) {
    return not_memfd;
  }
  // O_NONBLOCK: a FIFO or a leased file never blocks the agent; what is not
  // a memfd is refused below before a byte is read.
  int file = open(path.c_str(), O_RDWR | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
  if (file < 0) {
    return absl::UnavailableError(absl::StrCat(Where("cudaIpcOpenMemHandle", device, bytes), ": ",
                                               Errno(path.c_str())));
  }
  struct stat st {};
  if (fstat(file, &st) != 0 || !S_ISREG(st.st_mode) || memfd_dev_ == 0 || st.st_dev != memfd_dev_) {
    close(file);
    return not_memfd;
  }
  if (static_cast<uint64_t>(st.st_size) < bytes) {
    close(file);
    return absl::InvalidArgumentError(absl::StrCat(Where("cudaIpcOpenMemHandle", device, bytes),
                                                   ": ", path, " holds fewer bytes"));
  }
  std::lock_guard<std::mutex> l(mu_);
  absl::StatusOr<void*> base = MapLocked(device, file, bytes, 0, /*opened=*/true);
  close(file);  // the mappings keep the memory
  if (base.ok()) allocations_[reinterpret_cast<uintptr_t>(*base)].fd = -1;
  return base;
}

absl::Status FakeDeviceApi::IpcClose(int device, void* ptr) {
  if (absl::Status s = CheckDevice("cudaIpcCloseMemHandle", device); !s.ok()) return s;
  if (absl::Status s = SynchronizeAll(); !s.ok()) return s;
  std::lock_guard<std::mutex> l(mu_);
  absl::StatusOr<Allocations::iterator> it = FindLocked("cudaIpcCloseMemHandle", device, ptr, true);
  if (!it.ok()) return it.status();
  Unmap(ptr, (*it)->second);
  allocations_.erase(*it);
  return absl::OkStatus();
}

absl::StatusOr<size_t> FakeDeviceApi::AllocationSize(int device, const void* ptr) {
  if (absl::Status s = CheckDevice("cuMemGetAddressRange", device); !s.ok()) return s;
  const auto p = reinterpret_cast<uintptr_t>(ptr);
  std::lock_guard<std::mutex> l(mu_);
  auto it = allocations_.upper_bound(p);
  if (ptr != nullptr && it != allocations_.begin()) {
    --it;
    const Allocation& a = it->second;
    if (p < it->first + a.bytes && a.device == device) return it->first + a.bytes - p;
  }
  return absl::InvalidArgumentError(absl::StrCat("cuMemGetAddressRange (fake device ", device,
                                                 "): ", Addr(ptr),
                                                 " is in no allocation of that device"));
}

}  // namespace reshard::agent
