#include "agent/transfer/nccl_comm.h"

#include <atomic>
#include <chrono>
#include <cstring>
#include <mutex>
#include <thread>

#include "absl/strings/str_cat.h"
#include "agent/device/cuda_api.h"
#include "agent/device/cuda_libraries.h"
#include "common/log.h"

namespace reshard::agent {
namespace {

absl::Status NcclError(ncclResult_t rc, const std::string& where) {
  if (rc == ncclSuccess) return absl::OkStatus();
  return absl::UnavailableError(
      absl::StrCat(where, ": ", Nccl()->GetErrorString(rc), " (nccl ", rc, ")"));
}

constexpr auto kInitPoll = std::chrono::milliseconds(5);

class NcclComm : public DeviceComm {
 public:
  // `nonblocking`: made with config.blocking = 0 (calls may return
  // ncclInProgress; they are waited for here, Abort ending the wait).
  NcclComm(ncclComm_t comm, int nranks, int rank, int device, bool nonblocking)
      : comm_(comm), nranks_(nranks), rank_(rank), device_(device), nonblocking_(nonblocking) {}
  ~NcclComm() override {
    // Destroy waits for work queued on the GPU; abort does not (contract).
    Abort();
  }
  int rank() const override { return rank_; }
  int nranks() const override { return nranks_; }
  int device() const override { return device_; }

  absl::Status Send(const void* data, size_t bytes, int peer, DeviceStream stream) override {
    if (absl::Status s = Check("ncclSend to", bytes, peer, stream); !s.ok() || bytes == 0) return s;
    return Done(
        Nccl()->Send(data, bytes, ncclUint8, peer, comm_, static_cast<cudaStream_t>(stream.impl)),
        Where("ncclSend to", peer, bytes));
  }
  absl::Status Recv(void* data, size_t bytes, int peer, DeviceStream stream) override {
    if (absl::Status s = Check("ncclRecv from", bytes, peer, stream); !s.ok() || bytes == 0) {
      return s;
    }
    return Done(
        Nccl()->Recv(data, bytes, ncclUint8, peer, comm_, static_cast<cudaStream_t>(stream.impl)),
        Where("ncclRecv from", peer, bytes));
  }
  absl::Status GroupStart() override {
    return NcclError(Nccl()->GroupStart(), Where("ncclGroupStart", -1, 0));
  }
  absl::Status GroupEnd() override {
    return Done(Nccl()->GroupEnd(), Where("ncclGroupEnd", -1, 0));
  }
  void Abort() override {
    std::lock_guard<std::mutex> l(abort_mu_);
    if (ncclComm_t c = comm_.exchange(nullptr); c != nullptr) Nccl()->CommAbort(c);
  }

 private:
  std::string Where(const char* call, int peer, size_t bytes) const {
    return absl::StrCat(call, peer >= 0 ? absl::StrCat(" peer rank ", peer) : "", " (nccl rank ",
                        rank_, " of ", nranks_, ", CUDA device ", device_, ", ", bytes, " bytes)");
  }
  absl::Status Check(const char* call, size_t bytes, int peer, DeviceStream stream) const {
    if (comm_ == nullptr) return absl::AbortedError(Where(call, peer, bytes) + ": aborted");
    if (peer < 0 || peer >= nranks_) {
      return absl::InvalidArgumentError(Where(call, peer, bytes) + ": no such rank");
    }
    if (stream.device != device_) {
      return absl::InvalidArgumentError(absl::StrCat(Where(call, peer, bytes),
                                                     ": the stream is on device ", stream.device));
    }
    ncclResult_t async = ncclSuccess;
    if (Nccl()->CommGetAsyncError(comm_, &async) == ncclSuccess && async != ncclSuccess &&
        async != ncclInProgress) {
      return NcclError(async, Where(call, peer, bytes));
    }
    return absl::OkStatus();
  }

  // `rc` of a call; on a non-blocking communicator, ncclInProgress is waited
  // for (NCCL connects lazily inside GroupEnd): polled under abort_mu_, so
  // an Abort from another thread ends the wait (Aborted).
  absl::Status Done(ncclResult_t rc, const std::string& where) {
    while (rc == ncclInProgress && nonblocking_) {
      {
        std::lock_guard<std::mutex> l(abort_mu_);
        ncclComm_t c = comm_.load();
        if (c == nullptr) return absl::AbortedError(where + ": aborted");
        ncclResult_t state = ncclSuccess;
        rc = Nccl()->CommGetAsyncError(c, &state);
        if (rc == ncclSuccess) rc = state;
      }
      if (rc == ncclInProgress) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    return NcclError(rc, where);
  }

  std::atomic<ncclComm_t> comm_;  // null once aborted
  const int nranks_;
  const int rank_;
  const int device_;
  const bool nonblocking_;
  std::mutex abort_mu_;
};

class NcclCommFactory : public DeviceCommFactory {
 public:
  DeviceCommCapabilities capabilities() const override {
    DeviceCommCapabilities c;
    c.name = "nccl";
    c.remote = true;
    c.local = true;
    return c;
  }
  absl::StatusOr<std::string> NewId() override {
    ncclUniqueId id{};
    if (absl::Status s = NcclError(Nccl()->GetUniqueId(&id), "ncclGetUniqueId"); !s.ok()) return s;
    return std::string(id.internal, sizeof(id.internal));
  }
  using DeviceCommFactory::Init;
  absl::StatusOr<std::unique_ptr<DeviceComm>> Init(
      const std::string& id, int nranks, int rank, int device,
      const std::function<bool()>& cancelled,
      std::chrono::steady_clock::time_point deadline) override {
    const std::string where = absl::StrCat("ncclCommInitRank (rank ", rank, " of ", nranks,
                                           ", CUDA device ", device, ")");
    ncclUniqueId uid{};
    if (id.size() != sizeof(uid.internal)) {
      return absl::InvalidArgumentError(absl::StrCat(where, ": the id has ", id.size(),
                                                     " bytes, not ", sizeof(uid.internal)));
    }
    if (nranks < 1 || rank < 0 || rank >= nranks) {
      return absl::InvalidArgumentError(absl::StrCat(where, ": rank out of range"));
    }
    std::memcpy(uid.internal, id.data(), sizeof(uid.internal));
    if (int rc = Cudart()->SetDevice(device); rc != cudaSuccess) {
      Cudart()->GetLastError();
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": cudaSetDevice: ", Cudart()->GetErrorString(rc)));
    }
    ncclComm_t comm = nullptr;
    if (Nccl()->CommInitRankConfig == nullptr) {
      // NCCL < 2.14: only the blocking init (no deadline, no cancel).
      RESHARD_LOG(WARNING) << where
                           << ": ncclCommInitRankConfig missing (NCCL older than 2.14): "
                              "blocking ncclCommInitRank, which waits for every rank without "
                              "deadline or cancel";
      if (absl::Status s = NcclError(Nccl()->CommInitRank(&comm, nranks, uid, rank), where);
          !s.ok()) {
        return s;
      }
      return std::unique_ptr<DeviceComm>(new NcclComm(comm, nranks, rank, device, false));
    }
    // Non-blocking: returns at once (ncclInProgress); the join is polled
    // here so that a rank that never joins cannot hold this one forever.
    ncclConfig_v21400 config{};
    config.size = sizeof(config);
    config.magic = kNcclApiMagic;
    config.version = kNcclConfigVersion;
    config.blocking = 0;
    config.cgaClusterSize = config.minCTAs = config.maxCTAs = kNcclConfigUndefInt;
    config.netName = nullptr;
    ncclResult_t rc = Nccl()->CommInitRankConfig(&comm, nranks, uid, rank, &config);
    if (rc != ncclSuccess && rc != ncclInProgress) {
      if (comm != nullptr) Nccl()->CommAbort(comm);
      return NcclError(rc, where);
    }
    while (true) {
      ncclResult_t state = ncclSuccess;
      rc = Nccl()->CommGetAsyncError(comm, &state);
      if (rc == ncclSuccess && state == ncclSuccess) break;
      if (rc != ncclSuccess || state != ncclInProgress) {
        Nccl()->CommAbort(comm);
        return NcclError(rc != ncclSuccess ? rc : state, where);
      }
      if (cancelled && cancelled()) {
        Nccl()->CommAbort(comm);
        return absl::CancelledError(
            absl::StrCat(where, ": cancelled before every rank joined (NCCL does not say which)"));
      }
      if (std::chrono::steady_clock::now() >= deadline) {
        Nccl()->CommAbort(comm);
        return absl::UnavailableError(absl::StrCat(
            where, ": not every rank joined by the deadline (NCCL does not say which)"));
      }
      std::this_thread::sleep_for(kInitPoll);
    }
    return std::unique_ptr<DeviceComm>(new NcclComm(comm, nranks, rank, device, true));
  }
};

}  // namespace

std::unique_ptr<DeviceCommFactory> MakeNcclCommFactory(std::string* why_not) {
  const CudaLibraryState& s = CudaLibraries::Get().state();
  std::string why;
  if (!s.nccl_loaded || !s.cudart_loaded) {
    why = s.error;
  } else if (s.device_count <= 0) {
    why = absl::StrCat("NCCL not usable: no CUDA device (", CudaLibraries::Get().Describe(), ")");
  }
  if (!why.empty()) {
    if (why_not != nullptr) *why_not = why;
    return nullptr;
  }
  return std::make_unique<NcclCommFactory>();
}

}  // namespace reshard::agent
