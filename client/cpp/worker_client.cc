#include "client/cpp/worker_client.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "absl/container/flat_hash_map.h"
#include "absl/random/random.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "client/cpp/fd_wire.h"
#include "common/rpc/retry.h"
#include "common/rpc/status.h"
#include "grpcpp/grpcpp.h"

namespace reshard::client {
namespace {

// The deadline and the worker token (when there is one) of a call.
void Prepare(grpc::ClientContext* context, absl::Time deadline, const std::string& token) {
  if (deadline != absl::InfiniteFuture()) context->set_deadline(absl::ToChronoTime(deadline));
  if (!token.empty()) context->AddMetadata("authorization", absl::StrCat("Bearer ", token));
}

void Prepare(grpc::ClientContext* context, absl::Duration timeout, const std::string& token) {
  Prepare(context, absl::Now() + timeout, token);  // infinite: InfiniteFuture()
}

std::string Describe(const std::string& job_id, int64_t generation, int rank) {
  return absl::StrCat("job \"", job_id, "\" generation ", generation, " rank ", rank);
}

// The items of a PublishShard / OpenGeneration reply, checked against the
// file size so that no span reaches past the mapping.
absl::StatusOr<std::vector<ShardItem>> ToItems(
    const google::protobuf::RepeatedPtrField<v1::WorkerItem>& items, int64_t size,
    const std::string& path) {
  std::vector<ShardItem> out;
  out.reserve(items.size());
  for (const v1::WorkerItem& item : items) {
    if (item.offset() < 0 || item.bytes() < 0 || item.offset() > size ||
        item.bytes() > size - item.offset()) {
      return absl::InternalError(absl::StrCat("agent says item \"", item.name(), "\" lies at [",
                                              item.offset(), ", +", item.bytes(), ") of \"", path,
                                              "\", which has ", size, " bytes"));
    }
    ShardItem s;
    s.name = item.name();
    s.offset = item.offset();
    s.bytes = item.bytes();
    s.local_shape.assign(item.local_shape().begin(), item.local_shape().end());
    s.regenerated = item.regenerated();
    out.push_back(std::move(s));
  }
  return out;
}

absl::StatusOr<size_t> FindItem(const std::vector<ShardItem>& items, absl::string_view name,
                                const std::string& path) {
  for (size_t i = 0; i < items.size(); ++i) {
    if (items[i].name == name) return i;
  }
  return absl::NotFoundError(absl::StrCat("no item \"", name, "\" in \"", path, "\""));
}

}  // namespace

absl::StatusOr<Mapping> Mapping::Open(const std::string& path, int64_t size, bool writable) {
  const int fd = ::open(path.c_str(), (writable ? O_RDWR : O_RDONLY) | O_CLOEXEC);
  if (fd < 0) {
    const int err = errno;
    return absl::ErrnoToStatus(err, absl::StrCat("cannot open \"", path, "\""));
  }
  return FromFd(fd, size, writable, path);
}

absl::StatusOr<Mapping> Mapping::FromFd(int fd, int64_t size, bool writable,
                                        const std::string& path) {
  Mapping m;
  if (size > 0) {
    void* p = ::mmap(nullptr, static_cast<size_t>(size),
                     writable ? PROT_READ | PROT_WRITE : PROT_READ, MAP_SHARED, fd, 0);
    const int err = errno;
    ::close(fd);
    if (p == MAP_FAILED) {
      return absl::ErrnoToStatus(err,
                                 absl::StrCat("cannot map ", size, " bytes of \"", path, "\""));
    }
    m.data_ = static_cast<uint8_t*>(p);
    m.size_ = size;
  } else {
    ::close(fd);
  }
  return m;
}

Mapping& Mapping::operator=(Mapping&& other) noexcept {
  if (this != &other) {
    if (data_ != nullptr) ::munmap(data_, static_cast<size_t>(size_));
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
  }
  return *this;
}

Mapping::~Mapping() {
  if (data_ != nullptr) ::munmap(data_, static_cast<size_t>(size_));
}

absl::Span<uint8_t> ShardWriter::item_data(size_t index) const {
  const ShardItem& item = items_.at(index);
  if (item.bytes == 0) return {};
  return absl::Span<uint8_t>(mapping_.data() + item.offset, static_cast<size_t>(item.bytes));
}

absl::StatusOr<absl::Span<uint8_t>> ShardWriter::item_data(absl::string_view name) const {
  absl::StatusOr<size_t> i = FindItem(items_, name, path_);
  if (!i.ok()) return i.status();
  return item_data(*i);
}

absl::StatusOr<std::vector<uint64_t>> ShardWriter::Seal(const std::vector<uint64_t>& expected) {
  v1::SealShardRequest request;
  request.set_job_id(job_id_);
  request.set_generation(generation_);
  request.set_rank(rank_);
  for (uint64_t c : expected) request.add_expected_checksums(c);
  v1::SealShardResponse response;
  grpc::ClientContext context;
  Prepare(&context, timeout_, token_);
  absl::Status s = rpc::FromGrpc(stub_->SealShard(&context, request, &response));
  if (!s.ok()) {
    return rpc::WithContext(s, absl::StrCat("sealing ", Describe(job_id_, generation_, rank_)));
  }
  return std::vector<uint64_t>(response.checksums().begin(), response.checksums().end());
}

absl::Span<const uint8_t> LoadedShard::item_data(size_t index) const {
  const ShardItem& item = items_.at(index);
  if (item.bytes == 0) return {};
  return absl::Span<const uint8_t>(mapping_.data() + item.offset, static_cast<size_t>(item.bytes));
}

std::vector<std::string> LoadedShard::regenerated() const {
  std::vector<std::string> out;
  for (const ShardItem& item : items_) {
    if (item.regenerated) out.push_back(item.name);
  }
  return out;
}

absl::StatusOr<absl::Span<const uint8_t>> LoadedShard::item_data(absl::string_view name) const {
  absl::StatusOr<size_t> i = FindItem(items_, name, path_);
  if (!i.ok()) return i.status();
  return item_data(*i);
}

WorkerClient::WorkerClient(const std::string& socket_path, Options options)
    : options_(options),
      fd_socket_path_(socket_path + ".fds"),
      stub_(v1::WorkerService::NewStub(grpc::CreateChannel(absl::StrCat("unix:", socket_path),
                                                           grpc::InsecureChannelCredentials()))) {
  if (options_.token.empty()) {
    const char* env = std::getenv("RESHARD_WORKER_TOKEN");
    if (env != nullptr) options_.token = env;
  }
}

absl::StatusOr<int> WorkerClient::ShardFd(const std::string& job_id, int64_t generation, int rank,
                                          v1::WorkerFdRequest::Access access,
                                          int64_t size) const {
  const std::string where = Describe(job_id, generation, rank);
  v1::WorkerFdRequest request;
  request.set_worker_token(options_.token);
  request.set_job_id(job_id);
  request.set_generation(generation);
  request.set_rank(rank);
  request.set_access(access);
  const std::string wire = fd_wire::Framed(request.SerializeAsString());
  auto unavailable = [&](const std::string& what) {
    return absl::UnavailableError(absl::StrCat(where, ": the agent's descriptor socket ",
                                               fd_socket_path_, ": ", what));
  };
  sockaddr_un addr{};
  if (fd_socket_path_.size() >= sizeof(addr.sun_path)) return unavailable("path too long");
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, fd_socket_path_.data(), fd_socket_path_.size());
  const int sock = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (sock < 0) return unavailable(std::strerror(errno));
  const int64_t ms = options_.call_timeout == absl::InfiniteDuration()
                         ? 0
                         : absl::ToInt64Milliseconds(options_.call_timeout);
  const timeval tv{static_cast<time_t>(ms / 1000), static_cast<suseconds_t>(ms % 1000 * 1000)};
  (void)::setsockopt(sock, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  (void)::setsockopt(sock, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
  std::string data;
  std::vector<int> fds;
  absl::Status s;
  if (::connect(sock, reinterpret_cast<const sockaddr*>(&addr), sizeof(addr)) != 0 ||
      ::send(sock, wire.data(), wire.size(), MSG_NOSIGNAL) != static_cast<ssize_t>(wire.size())) {
    s = unavailable(std::strerror(errno));
  }
  auto complete = [&] {
    if (data.size() < 4) return false;
    uint32_t n = 0;
    for (int i = 0; i < 4; ++i) n |= static_cast<uint32_t>(static_cast<uint8_t>(data[i])) << (8 * i);
    return data.size() >= 4 + size_t{n};
  };
  while (s.ok() && !complete()) {
    const ssize_t got = fd_wire::Receive(sock, &data, &fds);
    if (got < 0) s = unavailable(std::strerror(errno));
    if (got == 0) s = unavailable("closed before answering");
  }
  ::close(sock);
  int fd = -1;  // the last descriptor sent; any before it are closed
  for (int f : fds) {
    if (fd >= 0) ::close(fd);
    fd = f;
  }
  v1::WorkerFdResponse response;
  if (s.ok() && !response.ParseFromArray(data.data() + 4, static_cast<int>(data.size() - 4))) {
    s = absl::InternalError(absl::StrCat(where, ": the agent's descriptor socket answered "
                                         "something that is not a WorkerFdResponse"));
  }
  if (s.ok()) s = rpc::FromWireCode(response.code(), response.message());
  if (s.ok() && fd < 0) {
    s = absl::InternalError(absl::StrCat(where, ": the agent sent no descriptor"));
  }
  struct stat st {};
  if (s.ok() && ::fstat(fd, &st) != 0) s = absl::ErrnoToStatus(errno, where);
  if (s.ok() && st.st_size != size) {
    s = absl::DataLossError(absl::StrCat(where, ": its shard file has ", st.st_size, " bytes, ",
                                         size, " expected (truncated or replaced)"));
  }
  if (!s.ok()) {
    if (fd >= 0) ::close(fd);
    return s;
  }
  return fd;
}

absl::StatusOr<ShardWriter> WorkerClient::BeginPublish(const std::string& job_id,
                                                       int64_t generation, int rank) {
  v1::PublishShardRequest request;
  request.set_job_id(job_id);
  request.set_generation(generation);
  request.set_rank(rank);
  v1::PublishShardResponse response;
  // UNAVAILABLE: a checkpoint's generation is not open on this agent yet
  // (its task arrives with the next heartbeat); retried with backoff
  // (common/rpc/retry.h, kWorkerPublish) within call_timeout, each attempt
  // given the time left, as the Python Worker does.
  const rpc::RetryPolicy& policy = rpc::DefaultPolicy(rpc::CallKind::kWorkerPublish);
  const absl::Time deadline = absl::Now() + options_.call_timeout;
  absl::BitGen rng;
  absl::Status s;
  for (int attempt = 1;; ++attempt) {
    grpc::ClientContext context;
    Prepare(&context, rpc::AttemptDeadline(deadline, absl::Now(), options_.call_timeout),
            options_.token);
    s = rpc::FromGrpc(stub_->PublishShard(&context, request, &response));
    if (!rpc::IsRetryable(rpc::CallKind::kWorkerPublish, s.code())) break;
    const absl::Duration wait = rpc::Backoff(policy, attempt, rng);
    if (absl::Now() + wait > deadline) break;
    absl::SleepFor(wait);
  }
  if (!s.ok()) {
    return rpc::WithContext(s, absl::StrCat("publishing ", Describe(job_id, generation, rank)));
  }
  absl::StatusOr<std::vector<ShardItem>> items =
      ToItems(response.items(), response.size(), response.path());
  if (!items.ok()) return items.status();
  absl::StatusOr<int> fd = ShardFd(job_id, generation, rank, v1::WorkerFdRequest::ACCESS_PUBLISH,
                                   response.size());
  if (!fd.ok()) return rpc::WithContext(fd.status(), "publishing");
  absl::StatusOr<Mapping> mapping = Mapping::FromFd(*fd, response.size(), true, response.path());
  if (!mapping.ok()) return mapping.status();
  ShardWriter writer;
  writer.stub_ = stub_;
  writer.timeout_ = options_.call_timeout;
  writer.token_ = options_.token;
  writer.job_id_ = job_id;
  writer.generation_ = generation;
  writer.rank_ = rank;
  writer.path_ = response.path();
  writer.mapping_ = std::move(*mapping);
  writer.items_ = std::move(*items);
  return writer;
}

absl::StatusOr<std::vector<uint64_t>> WorkerClient::Publish(
    const std::string& job_id, int64_t generation, int rank,
    const std::vector<std::pair<std::string, absl::Span<const uint8_t>>>& items) {
  absl::StatusOr<ShardWriter> writer = BeginPublish(job_id, generation, rank);
  if (!writer.ok()) return writer.status();
  const std::string where = Describe(job_id, generation, rank);
  // Check everything before writing a byte.
  absl::flat_hash_map<std::string, size_t> given;
  for (size_t i = 0; i < items.size(); ++i) {
    absl::StatusOr<size_t> index = FindItem(writer->items(), items[i].first, writer->path());
    if (!index.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": the job has no item \"", items[i].first, "\""));
    }
    const ShardItem& item = writer->items()[*index];
    if (static_cast<int64_t>(items[i].second.size()) != item.bytes) {
      return absl::InvalidArgumentError(absl::StrCat(where, ": item \"", item.name, "\" has ",
                                                     items[i].second.size(), " bytes, expected ",
                                                     item.bytes));
    }
    if (!given.emplace(item.name, *index).second) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": item \"", item.name, "\" given twice"));
    }
  }
  for (const ShardItem& item : writer->items()) {
    if (item.bytes > 0 && !given.contains(item.name)) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": item \"", item.name, "\" (", item.bytes, " bytes) is missing"));
    }
  }
  for (const auto& [name, bytes] : items) {
    if (bytes.empty()) continue;
    absl::Span<uint8_t> dst = writer->item_data(given.at(name));
    std::memcpy(dst.data(), bytes.data(), bytes.size());
  }
  return writer->Seal();
}

absl::StatusOr<LoadedShard> WorkerClient::Load(const std::string& job_id, int64_t generation,
                                               int rank) {
  v1::OpenGenerationRequest request;
  request.set_job_id(job_id);
  request.set_generation(generation);
  request.set_rank(rank);
  v1::OpenGenerationResponse response;
  grpc::ClientContext context;
  Prepare(&context, options_.call_timeout, options_.token);
  absl::Status s = rpc::FromGrpc(stub_->OpenGeneration(&context, request, &response));
  if (!s.ok())
    return rpc::WithContext(s, absl::StrCat("loading ", Describe(job_id, generation, rank)));
  absl::StatusOr<std::vector<ShardItem>> items =
      ToItems(response.items(), response.size(), response.path());
  if (!items.ok()) return items.status();
  if (response.checksums_size() != static_cast<int>(items->size())) {
    return absl::InternalError(absl::StrCat("loading ", Describe(job_id, generation, rank), ": ",
                                            response.checksums_size(), " checksums for ",
                                            items->size(), " items"));
  }
  for (size_t i = 0; i < items->size(); ++i) (*items)[i].checksum = response.checksums(i);
  absl::StatusOr<int> fd =
      ShardFd(job_id, generation, rank, v1::WorkerFdRequest::ACCESS_LOAD, response.size());
  if (!fd.ok()) return rpc::WithContext(fd.status(), "loading");
  absl::StatusOr<Mapping> mapping = Mapping::FromFd(*fd, response.size(), false, response.path());
  if (!mapping.ok()) return mapping.status();
  LoadedShard shard;
  shard.path_ = response.path();
  shard.mapping_ = std::move(*mapping);
  shard.items_ = std::move(*items);
  return shard;
}

}  // namespace reshard::client
