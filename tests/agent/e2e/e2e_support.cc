#include "tests/agent/e2e/e2e_support.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <mutex>
#include <random>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/rpc/status.h"
#include "grpcpp/grpcpp.h"
#include "planner/layout.h"
#include "tests/support/process.h"
#include "verifier/model.h"

namespace reshard::agent::testing {
namespace {

std::unique_ptr<v1::WorkerService::Stub> WorkerStub(const std::string& socket) {
  return v1::WorkerService::NewStub(
      grpc::CreateChannel("unix:" + socket, grpc::InsecureChannelCredentials()));
}

void Deadline(grpc::ClientContext* ctx) {
  ctx->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
}

std::mutex& TokensMu() {
  static auto* mu = new std::mutex;
  return *mu;
}
std::map<std::string, std::string>& Tokens() {
  static auto* tokens = new std::map<std::string, std::string>;
  return *tokens;
}

// Maps `path` (read-write when `write`).
class Mapping {
 public:
  absl::Status Open(const std::string& path, int64_t size, bool write) {
    int fd = open(path.c_str(), write ? O_RDWR : O_RDONLY);
    if (fd < 0) return absl::NotFoundError(absl::StrCat(path, ": ", std::strerror(errno)));
    size_ = size;
    if (size_ > 0) {
      void* p = mmap(nullptr, size_, write ? PROT_READ | PROT_WRITE : PROT_READ, MAP_SHARED, fd, 0);
      close(fd);
      if (p == MAP_FAILED) return absl::InternalError(absl::StrCat("mmap ", path));
      data_ = static_cast<uint8_t*>(p);
    } else {
      close(fd);
    }
    return absl::OkStatus();
  }
  ~Mapping() {
    if (data_ != nullptr) munmap(data_, size_);
  }
  uint8_t* data() { return data_; }

 private:
  uint8_t* data_ = nullptr;
  int64_t size_ = 0;
};

}  // namespace

void SetWorkerToken(const std::string& job_id, const std::string& token) {
  std::lock_guard<std::mutex> l(TokensMu());
  Tokens()[job_id] = token;
}

void AddWorkerToken(grpc::ClientContext* ctx, const std::string& job_id) {
  std::lock_guard<std::mutex> l(TokensMu());
  auto it = Tokens().find(job_id);
  if (it != Tokens().end()) ctx->AddMetadata("authorization", "Bearer " + it->second);
}

std::string AgentBinary() {
  // Another build of the agent may be tested with the same test binary.
  const char* other = std::getenv("RESHARD_TEST_AGENT_BIN");
  return other != nullptr && *other != '\0' ? other : RESHARD_AGENT_BIN;
}

absl::StatusOr<std::unique_ptr<AgentProcess>> AgentProcess::Start(const Options& options) {
  std::vector<std::string> args = options.wrapper;
  args.push_back(AgentBinary());
  for (const std::string& a :
       {std::string("--host-id"), options.host_id, std::string("--coordinator"),
        options.coordinator, std::string("--worker-socket"), options.worker_socket,
        std::string("--shm-dir"), options.shm_dir, std::string("--log-level"),
        std::string("info")}) {
    args.push_back(a);
  }
  args.insert(args.end(), options.extra_args.begin(), options.extra_args.end());
  mkdir(options.shm_dir.c_str(), 0700);

  test_support::SpawnOptions spawn;
  spawn.argv = std::move(args);  // wrapper[0] (e.g. ip) is looked up in PATH
  spawn.env = options.env;
  spawn.out = test_support::Stream::Pipe();
  spawn.err = test_support::Stream::SameAsOut();
  // No death signal: the agents live until the test kills them.
  absl::StatusOr<test_support::ChildProcess> child = test_support::ChildProcess::Spawn(spawn);
  if (!child.ok()) return child.status();
  std::unique_ptr<AgentProcess> p(new AgentProcess());
  p->options_ = options;
  p->pid_ = child->pid();
  const int out_fd = child->TakeOutFd();
  p->child_ = *std::move(child);

  auto mu = std::make_shared<std::mutex>();
  auto cv = std::make_shared<std::condition_variable>();
  auto ready = std::make_shared<int>(0);         // 1 ready, -1 closed
  auto metrics_port = std::make_shared<int>(0);  // logged before the ready line
  const std::string prefix = "[agent " + options.host_id + "] ";
  const std::string want = "reshard-agent " + options.host_id + " ready worker-socket ";
  const std::string metrics_line = "host " + options.host_id + ": /metrics on port ";
  p->reader_ = test_support::StartLineReader(
      out_fd,
      [mu, cv, ready, metrics_port, prefix, want, metrics_line](const std::string& line) {
        std::cerr << prefix << line << "\n";
        if (const size_t at = line.find(metrics_line); at != std::string::npos) {
          int port = 0;
          if (absl::SimpleAtoi(line.substr(at + metrics_line.size()), &port)) {
            std::lock_guard<std::mutex> l(*mu);
            *metrics_port = port;
          }
        }
        if (absl::StartsWith(line, want)) {
          std::lock_guard<std::mutex> l(*mu);
          *ready = 1;
          cv->notify_all();
        }
      },
      [mu, cv, ready] {
        std::lock_guard<std::mutex> l(*mu);
        if (*ready == 0) *ready = -1;
        cv->notify_all();
      });
  std::unique_lock<std::mutex> l(*mu);
  cv->wait_for(l, std::chrono::seconds(30), [&] { return *ready != 0; });
  if (*ready != 1) {
    l.unlock();
    p->Kill();
    return absl::InternalError(
        absl::StrCat("reshard-agent ", options.host_id, " did not print its start-up line"));
  }
  p->metrics_port_ = *metrics_port;
  return p;
}

AgentProcess::~AgentProcess() {
  Kill();
  if (reader_.joinable()) reader_.join();
}

void AgentProcess::Kill() {
  if (pid_ <= 0) return;
  (void)child_.Kill();
  pid_ = -1;
}

absl::StatusOr<int> AgentProcess::Terminate() {
  if (pid_ <= 0) return absl::FailedPreconditionError("not running");
  absl::StatusOr<int> status = child_.Terminate(absl::Seconds(15));
  pid_ = -1;
  if (!status.ok()) {
    return absl::DeadlineExceededError("reshard-agent did not exit on SIGTERM within 15 s");
  }
  return *status;
}

std::vector<std::string> RankHosts(const v1::Layout& layout) {
  std::vector<std::string> hosts;
  for (const v1::DeviceSlot& s : planner::ExpandPlacement(layout.placement())) {
    hosts.push_back(s.host());
  }
  return hosts;
}

namespace {

// Fills `to` from `model`'s new buffers, the element values taken from
// `values` (per item: num_ids x element bytes).
Contents Assemble(const verifier::Model& model, const std::vector<std::string>& values,
                  const v1::Layout& to, bool old_side) {
  Contents c;
  c.layout = to;
  const int world = old_side ? model.from.world : model.to.world;
  c.ranks.assign(world, std::vector<std::string>(model.items.size()));
  for (size_t i = 0; i < model.items.size(); ++i) {
    const verifier::ModelItem& it = model.items[i];
    const int eb = it.element_bytes;
    const auto& buffers = old_side ? it.old_buffers : it.new_buffers;
    for (int r = 0; r < world && r < static_cast<int>(buffers.size()); ++r) {
      std::string& out = c.ranks[r][i];
      out.assign(buffers[r].size() * eb, '\0');
      for (size_t p = 0; p < buffers[r].size(); ++p) {
        const int64_t id = buffers[r][p];
        if (id == verifier::kPadding) continue;
        std::memcpy(&out[p * eb], &values[i][id * eb], eb);
      }
    }
  }
  return c;
}

}  // namespace

absl::StatusOr<Contents> RandomContents(const v1::Ptc& ptc, const v1::Layout& layout,
                                        uint64_t seed) {
  absl::StatusOr<verifier::Model> model = verifier::BuildModel(ptc, layout, layout, {}, {});
  if (!model.ok()) return model.status();
  std::mt19937_64 rng(seed);
  std::vector<std::string> values;
  for (const verifier::ModelItem& it : model->items) {
    std::string v(it.num_ids * it.element_bytes, '\0');
    for (size_t k = 0; k < v.size(); k += 8) {
      uint64_t x = rng();
      std::memcpy(&v[k], &x, std::min<size_t>(8, v.size() - k));
    }
    values.push_back(std::move(v));
  }
  return Assemble(*model, values, layout, /*old_side=*/true);
}

absl::StatusOr<Contents> Reshard(const v1::Ptc& ptc, const Contents& from, const v1::Layout& to,
                                 const std::vector<std::string>& lost_hosts) {
  absl::StatusOr<verifier::Model> model =
      verifier::BuildModel(ptc, from.layout, to, lost_hosts, {});
  if (!model.ok()) return model.status();
  std::vector<std::string> values;
  for (size_t i = 0; i < model->items.size(); ++i) {
    const verifier::ModelItem& it = model->items[i];
    const int eb = it.element_bytes;
    std::string v(it.num_ids * eb, '\0');
    for (size_t r = 0; r < it.old_buffers.size(); ++r) {
      const std::string& src = from.ranks[r][i];
      for (size_t p = 0; p < it.old_buffers[r].size(); ++p) {
        const int64_t id = it.old_buffers[r][p];
        if (id != verifier::kPadding) std::memcpy(&v[id * eb], &src[p * eb], eb);
      }
    }
    values.push_back(std::move(v));
  }
  return Assemble(*model, values, to, /*old_side=*/false);
}

absl::Status Publish(const std::map<std::string, std::string>& sockets, const std::string& job_id,
                     int64_t generation, const Contents& c) {
  for (size_t r = 0; r < c.ranks.size(); ++r) {
    if (absl::Status s = PublishRank(sockets, job_id, generation, c, static_cast<int>(r));
        !s.ok()) {
      return s;
    }
  }
  return absl::OkStatus();
}

absl::Status PublishRank(const std::map<std::string, std::string>& sockets,
                         const std::string& job_id, int64_t generation, const Contents& c,
                         int rank) {
  const std::vector<std::string> hosts = RankHosts(c.layout);
  const size_t r = static_cast<size_t>(rank);
  auto stub = WorkerStub(sockets.at(hosts[r]));
  v1::PublishShardRequest req;
  req.set_job_id(job_id);
  req.set_generation(generation);
  req.set_rank(static_cast<int>(r));
  v1::PublishShardResponse resp;
  grpc::ClientContext ctx;
  Deadline(&ctx);
  AddWorkerToken(&ctx, job_id);
  absl::Status s = rpc::FromGrpc(stub->PublishShard(&ctx, req, &resp),
                                 absl::StrCat("PublishShard rank ", r, " on ", hosts[r]));
  if (!s.ok()) return s;
  if (resp.items_size() != static_cast<int>(c.ranks[r].size())) {
    return absl::InternalError(
        absl::StrCat("rank ", r, ": ", resp.items_size(), " items, expected ", c.ranks[r].size()));
  }
  Mapping m;
  if (s = m.Open(resp.path(), resp.size(), /*write=*/true); !s.ok()) return s;
  for (int i = 0; i < resp.items_size(); ++i) {
    const std::string& want = c.ranks[r][i];
    if (resp.items(i).bytes() != static_cast<int64_t>(want.size())) {
      return absl::InternalError(absl::StrCat("rank ", r, " item ", resp.items(i).name(), ": ",
                                              resp.items(i).bytes(), " bytes, reference has ",
                                              want.size()));
    }
    std::memcpy(m.data() + resp.items(i).offset(), want.data(), want.size());
  }
  v1::SealShardRequest seal;
  seal.set_job_id(job_id);
  seal.set_generation(generation);
  seal.set_rank(static_cast<int>(r));
  v1::SealShardResponse sealed;
  grpc::ClientContext ctx2;
  Deadline(&ctx2);
  AddWorkerToken(&ctx2, job_id);
  s = rpc::FromGrpc(stub->SealShard(&ctx2, seal, &sealed), absl::StrCat("SealShard rank ", r));
  if (!s.ok()) return s;
  return absl::OkStatus();
}

absl::Status Verify(const std::map<std::string, std::string>& sockets, const std::string& job_id,
                    int64_t generation, const Contents& c,
                    const std::vector<std::string>& skip_hosts) {
  const std::vector<std::string> hosts = RankHosts(c.layout);
  for (size_t r = 0; r < c.ranks.size(); ++r) {
    if (std::find(skip_hosts.begin(), skip_hosts.end(), hosts[r]) != skip_hosts.end()) continue;
    auto stub = WorkerStub(sockets.at(hosts[r]));
    v1::OpenGenerationRequest req;
    req.set_job_id(job_id);
    req.set_generation(generation);
    req.set_rank(static_cast<int>(r));
    v1::OpenGenerationResponse resp;
    grpc::ClientContext ctx;
    Deadline(&ctx);
    AddWorkerToken(&ctx, job_id);
    const std::string where =
        absl::StrCat("generation ", generation, " rank ", r, " on ", hosts[r]);
    absl::Status s =
        rpc::FromGrpc(stub->OpenGeneration(&ctx, req, &resp), "OpenGeneration " + where);
    if (!s.ok()) return s;
    if (resp.items_size() != static_cast<int>(c.ranks[r].size())) {
      return absl::InternalError(absl::StrCat(where, ": ", resp.items_size(), " items"));
    }
    Mapping m;
    if (s = m.Open(resp.path(), resp.size(), /*write=*/false); !s.ok()) return s;
    for (int i = 0; i < resp.items_size(); ++i) {
      const std::string& want = c.ranks[r][i];
      if (resp.items(i).bytes() != static_cast<int64_t>(want.size())) {
        return absl::DataLossError(absl::StrCat(where, " item ", i, ": ", resp.items(i).bytes(),
                                                " bytes, expected ", want.size()));
      }
      const uint8_t* got = m.data() + resp.items(i).offset();
      for (size_t b = 0; b < want.size(); ++b) {
        if (got[b] != static_cast<uint8_t>(want[b])) {
          return absl::DataLossError(absl::StrCat(where, " item ", i, " (", resp.items(i).name(),
                                                  "): byte ", b, " differs from the reference"));
        }
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace reshard::agent::testing
