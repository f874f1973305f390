// A UCX transport in its own process, for tests that kill a peer for real
// (ucx_transport_test.cc). Protocol over stdin/stdout, each address as an
// 8-byte length then its bytes:
//   1. writes its UCX address, reads the test's;
//   2. posts `count` receives of `bytes` each, tags `tag_base` + i, all into one
//      buffer (the contents do not matter), then writes one byte;
//   3. waits for stdin to close, shuts down and exits 0.
// Usage: transfer_ucx_peer COUNT BYTES TAG_BASE
//
// Or, a peer whose peer dies while they connect (ucx_peer_death_test.cc):
// transfer_ucx_peer --answer TAG [--worker-address] (see Answer).
//
// Or, a peer that dies while connecting: transfer_ucx_peer --send-and-stop
// BYTES TAG PAUSE_US does step 1, then connects to the test's transport,
// sends BYTES under TAG, waits PAUSE_US, writes one byte and stops itself
// (SIGSTOP): alive, its sockets still accept, but nothing answers, until the
// test SIGKILLs it.
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <future>
#include <memory>
#include <string>
#include <vector>

#include "agent/transfer/ucx_transport.h"

namespace {

bool WriteAll(int fd, const void* data, size_t n) {
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    const ssize_t k = write(fd, p, n);
    if (k <= 0) return false;
    p += k;
    n -= static_cast<size_t>(k);
  }
  return true;
}

bool ReadAll(int fd, void* data, size_t n) {
  char* p = static_cast<char*>(data);
  while (n > 0) {
    const ssize_t k = read(fd, p, n);
    if (k <= 0) return false;
    p += k;
    n -= static_cast<size_t>(k);
  }
  return true;
}

// Step 1: starts a transport, writes its address and reads the test's into
// `theirs`; 0, or the exit status to fail with.
int StartAndExchange(std::unique_ptr<reshard::agent::UcxTransport>* t, std::string* theirs,
                     bool listen = true) {
  reshard::agent::UcxOptions options;
  options.net_devices = "lo";
  options.transports = "tcp,self";
  options.listen = listen;
  auto made = reshard::agent::MakeUcxTransportImpl(options);
  if (!made.ok()) return 3;
  *t = std::move(*made);
  const std::string mine = (*t)->LocalAddress();
  const uint64_t len = mine.size();
  if (!WriteAll(1, &len, sizeof(len)) || !WriteAll(1, mine.data(), mine.size())) return 4;
  uint64_t theirs_len = 0;
  if (!ReadAll(0, &theirs_len, sizeof(theirs_len)) || theirs_len > (1 << 20)) return 5;
  theirs->assign(theirs_len, '\0');
  if (!ReadAll(0, theirs->data(), theirs->size())) return 5;
  return 0;
}

int SendAndStop(uint64_t bytes, uint64_t tag, uint64_t pause_us) {
  std::unique_ptr<reshard::agent::UcxTransport> t;
  std::string theirs;
  if (const int rc = StartAndExchange(&t, &theirs); rc != 0) return rc;
  if (!t->Connect("test", theirs).ok()) return 6;
  std::vector<uint8_t> buffer(bytes, 7);
  t->Send("test", tag, buffer.data(), buffer.size(), [](absl::Status) {});
  if (pause_us > 0) usleep(static_cast<useconds_t>(pause_us));
  const char sent = 's';
  if (!WriteAll(1, &sent, 1)) return 4;
  raise(SIGSTOP);
  return 0;  // never: the test SIGKILLs it
}

// Step 1 (listening, or by worker address if `worker_address`), then sends
// 1 MiB under `tag` to the address read in step 1, writes 'd' (sent) or 'f'
// (failed), waits for stdin to close, shuts down and exits 0.
int Answer(uint64_t tag, bool worker_address) {
  std::unique_ptr<reshard::agent::UcxTransport> t;
  std::string theirs;
  if (const int rc = StartAndExchange(&t, &theirs, !worker_address); rc != 0) return rc;
  if (!t->Connect("test", theirs).ok()) return 6;
  std::vector<uint8_t> buffer(size_t{1} << 20, 5);
  std::promise<absl::Status> sent;
  t->Send("test", tag, buffer.data(), buffer.size(), [&](absl::Status s) { sent.set_value(s); });
  std::future<absl::Status> done = sent.get_future();
  const bool ok =
      done.wait_for(std::chrono::seconds(30)) == std::future_status::ready && done.get().ok();
  const char result = ok ? 'd' : 'f';
  if (!WriteAll(1, &result, 1)) return 4;
  char c;
  while (read(0, &c, 1) > 0) {
  }
  t->Shutdown();
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc >= 3 && std::string(argv[1]) == "--answer") {
    return Answer(std::strtoull(argv[2], nullptr, 10),
                  argc == 4 && std::string(argv[3]) == "--worker-address");
  }
  if (argc == 5 && std::string(argv[1]) == "--send-and-stop") {
    return SendAndStop(std::strtoull(argv[2], nullptr, 10), std::strtoull(argv[3], nullptr, 10),
                       std::strtoull(argv[4], nullptr, 10));
  }
  if (argc != 4) return 2;
  const uint64_t count = std::strtoull(argv[1], nullptr, 10);
  const uint64_t bytes = std::strtoull(argv[2], nullptr, 10);
  const uint64_t tag_base = std::strtoull(argv[3], nullptr, 10);
  std::unique_ptr<reshard::agent::UcxTransport> t;
  std::string theirs;
  if (const int rc = StartAndExchange(&t, &theirs); rc != 0) return rc;
  // Only checked: like a destination agent, which connects only to the hosts
  // it sends to, the peer replies over the endpoint UCX creates for the test.
  if (theirs.empty()) return 6;
  std::vector<uint8_t> buffer(bytes);
  for (uint64_t i = 0; i < count; ++i) {
    t->Receive(tag_base + i, buffer.data(), buffer.size(), [](absl::Status) {});
  }
  const char ready = 'r';
  if (!WriteAll(1, &ready, 1)) return 4;
  char c;
  while (read(0, &c, 1) > 0) {
  }
  t->Shutdown();
  return 0;
}
