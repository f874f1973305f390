// A process that opens a fake device allocation another process exported
// (FakeDeviceApi::IpcOpen), checks the bytes it holds and writes new ones:
//   fake_device_peer HANDLE BYTES READ_SEED WRITE_SEED
// byte i is expected to be (READ_SEED + 7 i) mod 256 and becomes
// (WRITE_SEED + 7 i) mod 256. Exit 0 when done, 2 when the bytes read
// differ, 1 on a device API error (printed).
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "agent/transfer/fake_device.h"

using reshard::agent::CopyKind;
using reshard::agent::FakeDeviceApi;

int main(int argc, char** argv) {
  if (argc != 5) return 64;
  const size_t bytes = std::strtoull(argv[2], nullptr, 10);
  const int read_seed = std::atoi(argv[3]);
  const int write_seed = std::atoi(argv[4]);
  FakeDeviceApi api(FakeDeviceApi::Options{});
  auto fail = [](const absl::Status& s) {
    std::fprintf(stderr, "%s\n", s.ToString().c_str());
    return 1;
  };
  absl::StatusOr<void*> dev = api.IpcOpen(0, argv[1]);
  if (!dev.ok()) return fail(dev.status());
  absl::StatusOr<reshard::agent::DeviceStream> stream = api.CreateStream(0);
  if (!stream.ok()) return fail(stream.status());
  std::vector<uint8_t> host(bytes);
  if (absl::Status s = api.MemcpyAsync(host.data(), *dev, bytes, CopyKind::kDeviceToHost, *stream);
      !s.ok()) {
    return fail(s);
  }
  if (absl::Status s = api.StreamSynchronize(*stream); !s.ok()) return fail(s);
  for (size_t i = 0; i < bytes; ++i) {
    if (host[i] != static_cast<uint8_t>(read_seed + 7 * i)) return 2;
  }
  for (size_t i = 0; i < bytes; ++i) host[i] = static_cast<uint8_t>(write_seed + 7 * i);
  if (absl::Status s = api.MemcpyAsync(*dev, host.data(), bytes, CopyKind::kHostToDevice, *stream);
      !s.ok()) {
    return fail(s);
  }
  if (absl::Status s = api.DestroyStream(*stream); !s.ok()) return fail(s);
  if (absl::Status s = api.IpcClose(0, *dev); !s.ok()) return fail(s);
  return 0;
}
