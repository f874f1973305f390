// A process that opens a device allocation another process exported
// (DeviceApi::IpcOpen), checks the bytes it holds and writes new ones:
//   transfer_device_peer SPEC HANDLE_HEX BYTES READ_SEED WRITE_SEED
// SPEC picks the device API (MakeDeviceApi: "fake", "cuda"); HANDLE_HEX is
// the exported handle in hex (device_peer.h). Byte i is expected to be
// (READ_SEED + 7 i) mod 256 and becomes (WRITE_SEED + 7 i) mod 256. Exit 0
// when done, 2 when the bytes read differ, 1 on a device API error (printed).
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "absl/strings/escaping.h"
#include "agent/device/device_api.h"

using reshard::agent::CopyKind;
using reshard::agent::DeviceApi;

int main(int argc, char** argv) {
  if (argc != 6) return 64;
  const size_t bytes = std::strtoull(argv[3], nullptr, 10);
  const int read_seed = std::atoi(argv[4]);
  const int write_seed = std::atoi(argv[5]);
  auto fail = [](const absl::Status& s) {
    std::fprintf(stderr, "%s\n", s.ToString().c_str());
    return 1;
  };
  absl::StatusOr<std::unique_ptr<DeviceApi>> api = reshard::agent::MakeDeviceApi(argv[1]);
  if (!api.ok()) return fail(api.status());
  if (*api == nullptr) return fail(absl::FailedPreconditionError("no device API"));
  absl::StatusOr<void*> dev = (*api)->IpcOpen(0, absl::HexStringToBytes(argv[2]));
  if (!dev.ok()) return fail(dev.status());
  absl::StatusOr<reshard::agent::DeviceStream> stream = (*api)->CreateStream(0);
  if (!stream.ok()) return fail(stream.status());
  std::vector<uint8_t> host(bytes);
  if (absl::Status s =
          (*api)->MemcpyAsync(host.data(), *dev, bytes, CopyKind::kDeviceToHost, *stream);
      !s.ok()) {
    return fail(s);
  }
  if (absl::Status s = (*api)->StreamSynchronize(*stream); !s.ok()) return fail(s);
  for (size_t i = 0; i < bytes; ++i) {
    if (host[i] != static_cast<uint8_t>(read_seed + 7 * i)) return 2;
  }
  for (size_t i = 0; i < bytes; ++i) host[i] = static_cast<uint8_t>(write_seed + 7 * i);
  if (absl::Status s =
          (*api)->MemcpyAsync(*dev, host.data(), bytes, CopyKind::kHostToDevice, *stream);
      !s.ok()) {
    return fail(s);
  }
  if (absl::Status s = (*api)->DestroyStream(*stream); !s.ok()) return fail(s);
  if (absl::Status s = (*api)->IpcClose(0, *dev); !s.ok()) return fail(s);
  return 0;
}
