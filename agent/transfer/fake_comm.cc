#include "agent/transfer/fake_comm.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <functional>
#include <optional>
#include <random>
#include <set>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"

namespace reshard::agent {
namespace {

using Clock = std::chrono::steady_clock;
constexpr char kIdTag[] = "fake-comm";
constexpr size_t kTokenBytes = 16;

std::string Errno() { return std::strerror(errno); }

// How long a wait may last: until `deadline`, and while `cancelled` (may
// be null or empty) says no; polled every kWaitSlice.
struct WaitLimit {
  Clock::time_point deadline;
  const std::function<bool()>* cancelled = nullptr;
};
constexpr auto kWaitSlice = std::chrono::milliseconds(5);

// poll(2) on `fd` for `events` within `limit`: >0 ready, or the status that
// ended the wait (Unavailable "timed out", Cancelled "cancelled").
absl::StatusOr<int> PollWithin(int fd, short events, const WaitLimit& limit) {
  while (true) {
    if (limit.cancelled != nullptr && *limit.cancelled && (*limit.cancelled)()) {
      return absl::CancelledError("cancelled");
    }
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(limit.deadline - Clock::now());
    if (left.count() <= 0) return absl::UnavailableError("timed out");
    pollfd pfd{fd, events, 0};
    const int r =
        poll(&pfd, 1, static_cast<int>(std::min<int64_t>(left.count(), kWaitSlice.count())));
    if (r < 0 && errno != EINTR) return absl::UnavailableError(Errno());
    if (r > 0) return r;
  }
}

// Reads/writes all of [p, p + n). With a limit, waits for the socket at most
// that long (PollWithin's errors). A closed connection is Unavailable.
absl::Status Io(int fd, bool write, void* p, size_t n, const WaitLimit* limit) {
  auto* b = static_cast<uint8_t*>(p);
  while (n > 0) {
    if (limit != nullptr) {
      absl::StatusOr<int> r = PollWithin(fd, static_cast<short>(write ? POLLOUT : POLLIN), *limit);
      if (!r.ok()) return r.status();
    }
    const ssize_t k = write ? send(fd, b, n, MSG_NOSIGNAL) : recv(fd, b, n, 0);
    if (k < 0 && errno == EINTR) continue;
    if (k < 0) return absl::UnavailableError(Errno());
    if (k == 0) return absl::UnavailableError("the connection closed");
    b += k;
    n -= static_cast<size_t>(k);
  }
  return absl::OkStatus();
}

absl::Status WriteAll(int fd, const void* p, size_t n, const WaitLimit* limit = nullptr) {
  return Io(fd, true, const_cast<void*>(p), n, limit);
}
absl::Status ReadAll(int fd, void* p, size_t n, const WaitLimit* limit = nullptr) {
  return Io(fd, false, p, n, limit);
}

// A listening TCP socket on `address`, port chosen by the OS.
absl::StatusOr<std::pair<int, uint16_t>> Listen(const std::string& address) {
  sockaddr_in a{};
  a.sin_family = AF_INET;
  if (inet_pton(AF_INET, address.c_str(), &a.sin_addr) != 1) {
    return absl::InvalidArgumentError(absl::StrCat("fake comm: \"", address, "\" is not IPv4"));
  }
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  socklen_t len = sizeof(a);
  if (fd < 0 || bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0 ||
      listen(fd, 128) != 0 || getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) != 0) {
    std::string e = Errno();
    if (fd >= 0) close(fd);
    return absl::UnavailableError(absl::StrCat("fake comm: listening on ", address, ": ", e));
  }
  return std::make_pair(fd, ntohs(a.sin_port));
}

absl::StatusOr<int> Connect(uint32_t ip, uint16_t port) {
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = ip;
  a.sin_port = htons(port);
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0 || connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0) {
    std::string e = Errno();
    if (fd >= 0) close(fd);
    char s[INET_ADDRSTRLEN] = {};
    inet_ntop(AF_INET, &a.sin_addr, s, sizeof(s));
    return absl::UnavailableError(absl::StrCat("connecting to ", s, ":", port, ": ", e));
  }
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  return fd;
}

absl::StatusOr<int> Accept(int listener, const WaitLimit& limit) {
  while (true) {
    absl::StatusOr<int> r = PollWithin(listener, POLLIN, limit);
    if (!r.ok()) return r.status();
    int fd = accept4(listener, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0 && (errno == EINTR || errno == ECONNABORTED || errno == EAGAIN)) continue;
    if (fd < 0) return absl::UnavailableError(Errno());
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    return fd;
  }
}

// What a rank says first on every connection it opens.
struct Hello {
  char token[kTokenBytes];
  uint32_t rank;
  uint32_t ip;    // where it listens (network order)
  uint16_t port;  // host order
  uint16_t pad;
};

// A rank's listener, in the table rank 0 sends to everyone.
struct Endpoint {
  uint32_t ip;
  uint16_t port;
  uint16_t pad;
};

struct ParsedId {
  uint32_t ip = 0;
  uint16_t port = 0;
  std::string token;  // kTokenBytes raw
};

absl::StatusOr<ParsedId> ParseId(const std::string& id) {
  std::vector<std::string> f = absl::StrSplit(id, ' ');
  ParsedId p;
  uint32_t port = 0;
  in_addr a{};
  if (f.size() != 4 || f[0] != kIdTag || inet_pton(AF_INET, f[1].c_str(), &a) != 1 ||
      !absl::SimpleAtoi(f[2], &port) || port == 0 || port > 65535 ||
      f[3].size() != 2 * kTokenBytes) {
    return absl::InvalidArgumentError(absl::StrCat("fake comm: \"", absl::CHexEscape(id),
                                                   "\" is not a fake communicator id"));
  }
  p.ip = a.s_addr;
  p.port = static_cast<uint16_t>(port);
  p.token = absl::HexStringToBytes(f[3]);
  return p;
}

// Sockets to the peers, shared by the communicator and the work it queued
// (which may outlive it): closed when the last holder goes.
struct Links {
  std::vector<int> fds;  // by rank; -1 for this rank
  std::mutex mu;
  absl::Status broken;   // the first failure; every later transfer fails with it
  ~Links() {
    for (int fd : fds) {
      if (fd >= 0) close(fd);
    }
  }
  // Records `s` as the failure (first one wins) and shuts every socket down
  // so that transfers blocked on them fail at once.
  void Break(const absl::Status& s) {
    std::lock_guard<std::mutex> l(mu);
    if (broken.ok()) broken = s;
    for (int fd : fds) {
      if (fd >= 0) shutdown(fd, SHUT_RDWR);
    }
  }
  absl::Status Broken() {
    std::lock_guard<std::mutex> l(mu);
    return broken;
  }
};

class FakeComm : public DeviceComm {
 public:
  FakeComm(FakeDeviceApi* api, int nranks, int rank, int device, std::shared_ptr<Links> links)
      : api_(api), nranks_(nranks), rank_(rank), device_(device), links_(std::move(links)) {}
  ~FakeComm() override { Abort(); }

  int rank() const override { return rank_; }
  int nranks() const override { return nranks_; }
  int device() const override { return device_; }

  absl::Status Send(const void* data, size_t bytes, int peer, DeviceStream stream) override {
    return Add("ncclSend", true, const_cast<void*>(data), bytes, peer, stream);
  }
  absl::Status Recv(void* data, size_t bytes, int peer, DeviceStream stream) override {
    return Add("ncclRecv", false, data, bytes, peer, stream);
  }
  absl::Status GroupStart() override {
    if (in_group_) return absl::FailedPreconditionError(Where("ncclGroupStart") + ": nested group");
    in_group_ = true;
    return absl::OkStatus();
  }
  absl::Status GroupEnd() override {
    if (!in_group_) return absl::FailedPreconditionError(Where("ncclGroupEnd") + ": no group");
    in_group_ = false;
    std::vector<Op> ops = std::move(group_);
    group_.clear();
    if (ops.empty()) return absl::OkStatus();
    for (const Op& op : ops) {
      if (op.stream.impl != ops[0].stream.impl) {
        return absl::InvalidArgumentError(
            Where("ncclGroupEnd") + ": the group's transfers are on more than one stream");
      }
    }
    return Launch(std::move(ops));
  }
  void Abort() override {
    links_->Break(absl::AbortedError(
        absl::StrCat("fake comm rank ", rank_, " of ", nranks_, ": communicator aborted")));
  }

 private:
  struct Op {
    bool send = false;
    int peer = -1;
    uint8_t* view = nullptr;  // the fake's host view of the device bytes
    size_t bytes = 0;
    DeviceStream stream;
  };

  std::string Where(const char* call) const {
    return absl::StrCat(call, " (fake comm rank ", rank_, " of ", nranks_, ")");
  }
  std::string Where(const char* call, int peer, size_t bytes) const {
    return absl::StrCat(call, (std::strcmp(call, "ncclSend") == 0 ? " to" : " from"),
                        " peer rank ", peer, " (fake comm rank ", rank_, " of ", nranks_, ", ",
                        bytes, " bytes)");
  }

  absl::Status Add(const char* call, bool send, void* data, size_t bytes, int peer,
                   DeviceStream stream) {
    if (absl::Status b = links_->Broken(); !b.ok()) {
      return absl::Status(b.code(), absl::StrCat(Where(call, peer, bytes), ": ", b.message()));
    }
    if (peer < 0 || peer >= nranks_ || peer == rank_) {
      return absl::InvalidArgumentError(absl::StrCat(
          Where(call, peer, bytes), ": peer must be another rank in [0, ", nranks_, ")"));
    }
    if (stream.device != device_) {
      return absl::InvalidArgumentError(absl::StrCat(Where(call, peer, bytes),
                                                     ": the stream is on device ", stream.device,
                                                     ", the communicator on ", device_));
    }
    if (bytes == 0) return absl::OkStatus();
    absl::StatusOr<uint8_t*> view = api_->HostView(call, data, bytes, device_);
    if (!view.ok()) return view.status();
    Op op{send, peer, *view, bytes, stream};
    if (in_group_) {
      group_.push_back(op);
      return absl::OkStatus();
    }
    return Launch({op});
  }

  // Queues `ops` as one host work: one thread per (peer, direction) lane,
  // each lane's transfers in order.
  absl::Status Launch(std::vector<Op> ops) {
    const DeviceStream stream = ops[0].stream;
    std::map<std::pair<int, bool>, std::vector<Op>> lanes;
    for (const Op& op : ops) lanes[{op.peer, op.send}].push_back(op);
    std::vector<std::vector<Op>> work;
    for (auto& [key, lane] : lanes) work.push_back(std::move(lane));
    return api_->LaunchHostWork(
        stream, [links = links_, work = std::move(work), nranks = nranks_, rank = rank_] {
          auto run = [&](const std::vector<Op>& lane) {
            for (const Op& op : lane) {
              absl::Status s = Move(*links, op, rank, nranks);
              if (!s.ok()) {
                links->Break(s);
                return;
              }
            }
          };
          std::vector<std::thread> threads;
          for (size_t i = 1; i < work.size(); ++i) threads.emplace_back(run, std::cref(work[i]));
          run(work[0]);
          for (std::thread& t : threads) t.join();
          return links->Broken();
        });
  }

  // One transfer: an 8-byte length, then the bytes.
  static absl::Status Move(Links& links, const Op& op, int rank, int nranks) {
    const std::string where =
        absl::StrCat(op.send ? "ncclSend to" : "ncclRecv from", " peer rank ", op.peer,
                     " (fake comm rank ", rank, " of ", nranks, ", ", op.bytes, " bytes)");
    if (absl::Status b = links.Broken(); !b.ok()) {
      return absl::Status(b.code(), absl::StrCat(where, ": ", b.message()));
    }
    const int fd = links.fds[op.peer];
    uint64_t n = op.bytes;
    absl::Status s;
    if (op.send) {
      s = WriteAll(fd, &n, sizeof(n));
      if (s.ok()) s = WriteAll(fd, op.view, op.bytes);
    } else {
      s = ReadAll(fd, &n, sizeof(n));
      if (s.ok() && n != op.bytes) {
        return absl::InvalidArgumentError(
            absl::StrCat(where, ": peer rank ", op.peer, " sent ", n, " bytes"));
      }
      if (s.ok()) s = ReadAll(fd, op.view, op.bytes);
    }
    if (s.ok()) return s;
    if (absl::Status b = links.Broken(); !b.ok()) {  // aborted here, or another lane failed
      return absl::Status(b.code(), absl::StrCat(where, ": ", b.message()));
    }
    return absl::UnavailableError(
        absl::StrCat(where, ": peer rank ", op.peer, " is gone (", s.message(), ")"));
  }

  FakeDeviceApi* const api_;
  const int nranks_;
  const int rank_;
  const int device_;
  std::shared_ptr<Links> links_;
  bool in_group_ = false;
  std::vector<Op> group_;
};


// What a rank joining a fake communicator knows while it waits for others.
struct Joining {
  const std::string& where;  // "ncclCommInitRank (fake comm rank R of N, ...)"
  const std::string& token;  // the id's secret: a hello without it is dropped
  const WaitLimit* limit;
  double timeout_s;
  int nranks;
};

// Accepts connections on `listener` until ranks [from, nranks) each said
// hello with the token, keeping each one's connection in links->fds (and
// its listening endpoint in `endpoints` when given); an outsider's
// connection is dropped.
absl::Status AcceptRanks(const Joining& j, int listener, int from, Links* links,
                         std::vector<Endpoint>* endpoints) {
  std::set<int> missing;
  for (int r = from; r < j.nranks; ++r) missing.insert(r);
  while (!missing.empty()) {
    absl::StatusOr<int> fd = Accept(listener, *j.limit);
    if (absl::IsCancelled(fd.status())) {
      return absl::CancelledError(absl::StrCat(j.where, ": cancelled while rank(s) ",
                                               absl::StrJoin(missing, ", "), " had not joined"));
    }
    if (!fd.ok()) {
      return absl::UnavailableError(absl::StrCat(j.where, ": rank(s) ",
                                                 absl::StrJoin(missing, ", "),
                                                 " never joined within ", j.timeout_s, " s (",
                                                 fd.status().message(), ")"));
    }
    Hello h{};
    absl::Status s = ReadAll(*fd, &h, sizeof(h), j.limit);
    const int r = static_cast<int>(h.rank);
    if (!s.ok() || std::string(h.token, kTokenBytes) != j.token || missing.count(r) == 0) {
      close(*fd);
      continue;
    }
    missing.erase(r);
    links->fds[r] = *fd;
    if (endpoints != nullptr) (*endpoints)[r] = Endpoint{h.ip, h.port, 0};
  }
  return absl::OkStatus();
}

}  // namespace

FakeCommFactory::FakeCommFactory(FakeDeviceApi* device, Options options)
    : device_(device), options_(std::move(options)) {}

FakeCommFactory::~FakeCommFactory() {
  for (auto& [id, fd] : listeners_) close(fd);
}

DeviceCommCapabilities FakeCommFactory::capabilities() const {
  DeviceCommCapabilities c;
  c.name = "fake";
  c.remote = true;
  return c;
}

absl::StatusOr<std::string> FakeCommFactory::NewId() {
  absl::StatusOr<std::pair<int, uint16_t>> l = Listen(options_.address);
  if (!l.ok()) return l.status();
  std::random_device rd;
  std::string token(kTokenBytes, '\0');
  for (char& c : token) c = static_cast<char>(rd() & 0xff);
  std::string id = absl::StrCat(kIdTag, " ", options_.address, " ", l->second, " ",
                                absl::BytesToHexString(token));
  std::lock_guard<std::mutex> g(mu_);
  listeners_[id] = l->first;
  return id;
}

absl::StatusOr<std::unique_ptr<DeviceComm>> FakeCommFactory::Init(
    const std::string& id, int nranks, int rank, int device, const std::function<bool()>& cancelled,
    Clock::time_point deadline) {
  const std::string where = absl::StrCat("ncclCommInitRank (fake comm rank ", rank, " of ",
                                         nranks, ", device ", device, ")");
  absl::StatusOr<ParsedId> p = ParseId(id);
  if (!p.ok()) return p.status();
  if (nranks < 1 || rank < 0 || rank >= nranks) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": rank out of range"));
  }
  if (device < 0 || device >= device_->capabilities().device_count) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": no such fake device"));
  }
  const auto start = Clock::now();
  if (deadline == kNoDeadline) deadline = start + options_.init_timeout;
  const WaitLimit limit{deadline, &cancelled};
  const double timeout_s =
      std::chrono::duration_cast<std::chrono::milliseconds>(deadline - start).count() / 1000.0;
  auto links = std::make_shared<Links>();
  links->fds.assign(static_cast<size_t>(nranks), -1);
  auto fail = [&](const std::string& what, const absl::Status& s) {
    return absl::Status(s.code(), absl::StrCat(where, ": ", what, ": ", s.message()));
  };
  in_addr listen_ip{};
  inet_pton(AF_INET, options_.address.c_str(), &listen_ip);
  const Joining joining{where, p->token, &limit, timeout_s, nranks};
  if (rank == 0) {
    int listener = -1;
    {
      std::lock_guard<std::mutex> g(mu_);
      auto it = listeners_.find(id);
      if (it == listeners_.end()) {
        return absl::FailedPreconditionError(
            absl::StrCat(where, ": rank 0 must join on the factory that made the id"));
      }
      listener = it->second;
      listeners_.erase(it);
    }
    std::vector<Endpoint> endpoints(static_cast<size_t>(nranks));
    absl::Status s = AcceptRanks(joining, listener, 1, links.get(), &endpoints);
    close(listener);
    if (!s.ok()) return s;
    for (int r = 1; r < nranks && s.ok(); ++r) {
      s = WriteAll(links->fds[r], endpoints.data(), endpoints.size() * sizeof(Endpoint), &limit);
      if (!s.ok()) return fail(absl::StrCat("telling rank ", r, " its peers"), s);
    }
  } else {
    int listener = -1;
    Hello hello{};
    std::memcpy(hello.token, p->token.data(), kTokenBytes);
    hello.rank = static_cast<uint32_t>(rank);
    hello.ip = listen_ip.s_addr;
    if (rank + 1 < nranks) {
      absl::StatusOr<std::pair<int, uint16_t>> l = Listen(options_.address);
      if (!l.ok()) return l.status();
      listener = l->first;
      hello.port = l->second;
    }
    auto close_listener = [&] {
      if (listener >= 0) close(listener);
    };
    absl::StatusOr<int> root = Connect(p->ip, p->port);
    if (!root.ok()) {
      close_listener();
      return fail("joining rank 0", root.status());
    }
    links->fds[0] = *root;
    std::vector<Endpoint> endpoints(static_cast<size_t>(nranks));
    absl::Status s = WriteAll(*root, &hello, sizeof(hello), &limit);
    if (s.ok()) s = ReadAll(*root, endpoints.data(), endpoints.size() * sizeof(Endpoint), &limit);
    if (!s.ok()) {
      close_listener();
      return fail("waiting for rank 0 (every rank joins first)", s);
    }
    for (int r = 1; r < rank; ++r) {
      absl::StatusOr<int> fd = Connect(endpoints[r].ip, endpoints[r].port);
      if (fd.ok()) {
        links->fds[r] = *fd;
        s = WriteAll(*fd, &hello, sizeof(hello), &limit);
      }
      if (!fd.ok() || !s.ok()) {
        close_listener();
        return fail(absl::StrCat("joining rank ", r), fd.ok() ? s : fd.status());
      }
    }
    if (listener >= 0) {
      s = AcceptRanks(joining, listener, rank + 1, links.get(), nullptr);
      close_listener();
      if (!s.ok()) return s;
    }
  }
  return std::unique_ptr<DeviceComm>(new FakeComm(device_, nranks, rank, device, std::move(links)));
}

}  // namespace reshard::agent
