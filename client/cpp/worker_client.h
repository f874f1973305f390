// reshard::client::WorkerClient: the training worker's side of a host's
// reshard-agent (reshard.v1.WorkerService on a unix socket). A worker
// publishes its rank's tensors into the shared-memory rank buffer the agent
// creates (copying them in, or writing in place), seals them so the agent
// checksums them, and after a reconfiguration loads the new generation's
// buffer by mapping it read-only. Shard files are the agent's alone: the
// client maps file descriptors the agent hands it over the worker socket's
// companion `<socket>.fds` (reshard.v1.WorkerFdRequest), never a path. See
// docs/agent.md, "Worker interface", and docs/security.md, "Workers".
//
// Thread contract: WorkerClient is thread-safe. ShardWriter and LoadedShard
// own a mapping and are thread-compatible; they stay valid after the client
// is destroyed.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "reshard/v1/worker.grpc.pb.h"
#include "reshard/v1/worker.pb.h"

namespace reshard::client {

/// A read-only or read-write mapping of a file; unmapped on destruction.
class Mapping {
 public:
  /// Maps the whole `size` bytes of `path` (MAP_SHARED).
  [[nodiscard]] static absl::StatusOr<Mapping> Open(const std::string& path, int64_t size,
                                                    bool writable);
  /// Maps the whole `size` bytes of the open file `fd` (MAP_SHARED); closes
  /// `fd` either way (`what` names it in errors).
  [[nodiscard]] static absl::StatusOr<Mapping> FromFd(int fd, int64_t size, bool writable,
                                                      const std::string& what);
  Mapping() = default;
  Mapping(Mapping&& other) noexcept { *this = std::move(other); }
  Mapping& operator=(Mapping&& other) noexcept;
  Mapping(const Mapping&) = delete;
  Mapping& operator=(const Mapping&) = delete;
  ~Mapping();

  uint8_t* data() const { return data_; }
  int64_t size() const { return size_; }

 private:
  uint8_t* data_ = nullptr;
  int64_t size_ = 0;
};

/// One PTC item of a rank buffer (tensors in PTC order, then blobs).
struct ShardItem {
  std::string name;
  int64_t offset = 0;  // in the file
  int64_t bytes = 0;   // 0: the rank does not hold this item
  std::vector<int64_t> local_shape;
  uint64_t checksum = 0;  // XXH3-64 of the bytes; set for loaded (sealed) buffers
  /// Loaded buffers only: the bytes are zeros, not the job's state. No
  /// surviving rank held this item's value after a loss (a regenerable blob,
  /// e.g. an RNG state), so the worker must regenerate it before use.
  bool regenerated = false;
};

/// A rank buffer being published: write each item in place, then Seal().
class ShardWriter {
 public:
  const std::vector<ShardItem>& items() const { return items_; }
  /// The writable bytes of item `index` / named `name`; NotFound for an
  /// unknown name.
  absl::Span<uint8_t> item_data(size_t index) const;
  [[nodiscard]] absl::StatusOr<absl::Span<uint8_t>> item_data(absl::string_view name) const;
  const std::string& path() const { return path_; }

  /// Asks the agent to checksum and record the bytes; returns one checksum
  /// per item. With `expected` (one per item) a mismatch is DATA_LOSS.
  /// The buffer must not be written afterwards.
  [[nodiscard]] absl::StatusOr<std::vector<uint64_t>> Seal(
      const std::vector<uint64_t>& expected = {});

 private:
  friend class WorkerClient;
  ShardWriter() = default;

  std::shared_ptr<v1::WorkerService::Stub> stub_;
  absl::Duration timeout_;
  std::string token_;
  std::string job_id_;
  int64_t generation_ = 0;
  int rank_ = 0;
  std::string path_;
  Mapping mapping_;
  std::vector<ShardItem> items_;
};

/// A sealed generation's rank buffer, mapped read-only.
class LoadedShard {
 public:
  const std::vector<ShardItem>& items() const { return items_; }
  absl::Span<const uint8_t> item_data(size_t index) const;
  [[nodiscard]] absl::StatusOr<absl::Span<const uint8_t>> item_data(absl::string_view name) const;
  const std::string& path() const { return path_; }
  /// Names of the items the worker must regenerate (ShardItem::regenerated),
  /// in item order; empty when every item is the job's state.
  std::vector<std::string> regenerated() const;

 private:
  friend class WorkerClient;
  std::string path_;
  Mapping mapping_;
  std::vector<ShardItem> items_;
};

class WorkerClient {
 public:
  struct Options {
    absl::Duration call_timeout = absl::Seconds(30);
    /// The job's worker token (RegisterJob's `worker_token`, or
    /// `reshardctl jobs worker-token JOB`), sent as `authorization: Bearer
    /// <token>` on every call; empty: $RESHARD_WORKER_TOKEN. The agent
    /// serves only the job the token is for (docs/security.md).
    std::string token;
  };

  /// `socket_path`: the agent's --worker-socket (without "unix:").
  explicit WorkerClient(const std::string& socket_path) : WorkerClient(socket_path, Options()) {}
  WorkerClient(const std::string& socket_path, Options options);

  /// Zero-copy publishing: creates (or reopens) the rank buffer of
  /// (job, generation, rank) and maps it for writing in place. While the
  /// agent answers UNAVAILABLE (a checkpoint's generation not open there
  /// yet) it retries with backoff within Options::call_timeout.
  [[nodiscard]] absl::StatusOr<ShardWriter> BeginPublish(const std::string& job_id,
                                                         int64_t generation, int rank);

  /// Copying publishing: every item the rank holds (bytes > 0) must be
  /// given by name with exactly its size (InvalidArgument naming the item
  /// otherwise, before anything is sealed); items it does not hold may be
  /// omitted or given empty. Seals and returns the checksums.
  [[nodiscard]] absl::StatusOr<std::vector<uint64_t>> Publish(
      const std::string& job_id, int64_t generation, int rank,
      const std::vector<std::pair<std::string, absl::Span<const uint8_t>>>& items);

  /// The sealed buffer of (job, generation, rank): NotFound when this host
  /// has none, FailedPrecondition when it is not sealed.
  [[nodiscard]] absl::StatusOr<LoadedShard> Load(const std::string& job_id, int64_t generation,
                                                 int rank);

 private:
  /// A descriptor of the rank buffer (job, generation, rank) from the
  /// agent's descriptor socket, checked to hold `size` bytes (DataLoss naming
  /// job, generation and rank otherwise); the caller closes it.
  [[nodiscard]] absl::StatusOr<int> ShardFd(const std::string& job_id, int64_t generation, int rank,
                                            v1::WorkerFdRequest::Access access, int64_t size) const;

  Options options_;
  std::string fd_socket_path_;
  std::shared_ptr<v1::WorkerService::Stub> stub_;
};

}  // namespace reshard::client
