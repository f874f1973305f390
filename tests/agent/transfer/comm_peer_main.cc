// A rank of a fake device communicator in its own process, which the fake
// comm test kills for real:
//   transfer_comm_peer ID_HEX NRANKS RANK
// Joins the communicator (FakeCommFactory::Init on a fake device), writes
// one byte 'r' to stdout, then waits for stdin to close (or to be killed).
// Exit 1 when Init fails (printed).
#include <unistd.h>

#include <cstdio>
#include <cstdlib>

#include "absl/strings/escaping.h"
#include "agent/transfer/fake_comm.h"

int main(int argc, char** argv) {
  if (argc != 4) return 64;
  reshard::agent::FakeDeviceApi device(reshard::agent::FakeDeviceApi::Options{});
  reshard::agent::FakeCommFactory factory(&device);
  auto comm = factory.Init(absl::HexStringToBytes(argv[1]), std::atoi(argv[2]),
                           std::atoi(argv[3]), 0);
  if (!comm.ok()) {
    std::fprintf(stderr, "%s\n", comm.status().ToString().c_str());
    return 1;
  }
  if (write(1, "r", 1) != 1) return 1;
  char c;
  while (read(0, &c, 1) > 0) {
  }
  return 0;
}
