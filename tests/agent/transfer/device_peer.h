// Runs transfer_device_peer (device_peer_main.cc) on an exported device
// allocation, for the IPC tests of the fake and the CUDA device APIs.
#pragma once

#include <cstdint>
#include <cstdlib>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/escaping.h"
#include "tests/support/process.h"

namespace reshard::agent {

/// Byte i of a test pattern: (seed + 7 i) mod 256, as the peer checks.
inline std::vector<uint8_t> PeerPattern(size_t bytes, int seed) {
  std::vector<uint8_t> v(bytes);
  for (size_t i = 0; i < bytes; ++i) v[i] = static_cast<uint8_t>(seed + 7 * i);
  return v;
}

/// The peer's exit status: 0 when it read PeerPattern(bytes, read_seed)
/// through `handle` and wrote PeerPattern(bytes, write_seed), 2 when it read
/// other bytes, 1 on a device API error; -1 when it did not run or ran past
/// 2 minutes (then killed).
inline int RunDevicePeer(const std::string& spec, const std::string& handle, size_t bytes,
                         int read_seed, int write_seed) {
  // $RESHARD_DEVICE_PEER_PATH: where the binary is when the tests run from
  // another tree than the build's (scripts/gpu_check.sh carries them).
  const char* path = std::getenv("RESHARD_DEVICE_PEER_PATH");
  std::vector<std::string> args = {path != nullptr ? path : RESHARD_DEVICE_PEER_PATH,
                                   spec,
                                   absl::BytesToHexString(handle),
                                   std::to_string(bytes),
                                   std::to_string(read_seed),
                                   std::to_string(write_seed)};
  test_support::SpawnOptions options;
  options.argv = std::move(args);
  absl::StatusOr<test_support::ChildProcess> peer = test_support::ChildProcess::Spawn(options);
  if (!peer.ok()) return -1;
  // Killed and reaped by `peer` if it runs past the deadline.
  return peer->WaitExit(absl::Minutes(2)).value_or(-1);
}

}  // namespace reshard::agent
