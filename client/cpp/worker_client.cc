#include "client/cpp/worker_client.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "client/cpp/grpc_status.h"
#include "grpcpp/grpcpp.h"

namespace reshard::client {
namespace {

// The deadline and the worker token (when there is one) of a call.
void Prepare(grpc::ClientContext* context, absl::Duration timeout, const std::string& token) {
  if (timeout != absl::InfiniteDuration()) {
    context->set_deadline(absl::ToChronoTime(absl::Now() + timeout));
  }
  if (!token.empty()) context->AddMetadata("authorization", absl::StrCat("Bearer ", token));
}

absl::Status WithContext(const absl::Status& status, absl::string_view what) {
  return absl::Status(status.code(), absl::StrCat(what, ": ", status.message()));
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
  const int fd = ::open(path.c_str(), writable ? O_RDWR : O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    const int err = errno;
    return absl::ErrnoToStatus(err, absl::StrCat("cannot open \"", path, "\""));
  }
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
  absl::Status s = FromGrpcStatus(stub_->SealShard(&context, request, &response));
  if (!s.ok()) {
    return WithContext(s, absl::StrCat("sealing ", Describe(job_id_, generation_, rank_)));
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
      stub_(v1::WorkerService::NewStub(grpc::CreateChannel(absl::StrCat("unix:", socket_path),
                                                           grpc::InsecureChannelCredentials()))) {
  if (options_.token.empty()) {
    const char* env = std::getenv("RESHARD_WORKER_TOKEN");
    if (env != nullptr) options_.token = env;
  }
}

absl::StatusOr<ShardWriter> WorkerClient::BeginPublish(const std::string& job_id,
                                                       int64_t generation, int rank) {
  v1::PublishShardRequest request;
  request.set_job_id(job_id);
  request.set_generation(generation);
  request.set_rank(rank);
  v1::PublishShardResponse response;
  // UNAVAILABLE: a checkpoint's generation is not open on this agent yet
  // (its task arrives with the next heartbeat); retried with backoff within
  // call_timeout, as the Python Worker does.
  const absl::Time deadline = absl::Now() + options_.call_timeout;
  absl::Duration delay = absl::Milliseconds(20);
  absl::Status s;
  while (true) {
    grpc::ClientContext context;
    Prepare(&context, options_.call_timeout, options_.token);
    s = FromGrpcStatus(stub_->PublishShard(&context, request, &response));
    if (s.code() != absl::StatusCode::kUnavailable || absl::Now() + delay > deadline) break;
    absl::SleepFor(delay);
    delay = std::min(delay * 2, absl::Milliseconds(500));
  }
  if (!s.ok()) {
    return WithContext(s, absl::StrCat("publishing ", Describe(job_id, generation, rank)));
  }
  absl::StatusOr<std::vector<ShardItem>> items =
      ToItems(response.items(), response.size(), response.path());
  if (!items.ok()) return items.status();
  absl::StatusOr<Mapping> mapping = Mapping::Open(response.path(), response.size(), true);
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
  absl::Status s = FromGrpcStatus(stub_->OpenGeneration(&context, request, &response));
  if (!s.ok()) return WithContext(s, absl::StrCat("loading ", Describe(job_id, generation, rank)));
  absl::StatusOr<std::vector<ShardItem>> items =
      ToItems(response.items(), response.size(), response.path());
  if (!items.ok()) return items.status();
  if (response.checksums_size() != static_cast<int>(items->size())) {
    return absl::InternalError(absl::StrCat("loading ", Describe(job_id, generation, rank), ": ",
                                            response.checksums_size(), " checksums for ",
                                            items->size(), " items"));
  }
  for (size_t i = 0; i < items->size(); ++i) (*items)[i].checksum = response.checksums(i);
  absl::StatusOr<Mapping> mapping = Mapping::Open(response.path(), response.size(), false);
  if (!mapping.ok()) return mapping.status();
  LoadedShard shard;
  shard.path_ = response.path();
  shard.mapping_ = std::move(*mapping);
  shard.items_ = std::move(*items);
  return shard;
}

}  // namespace reshard::client
