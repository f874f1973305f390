#include "agent/transfer/nccl_comm.h"

#include <atomic>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "agent/transfer/cuda_api.h"
#include "agent/transfer/cuda_libraries.h"

namespace reshard::agent {
namespace {

absl::Status NcclError(ncclResult_t rc, const std::string& where) {
  if (rc == ncclSuccess) return absl::OkStatus();
  return absl::UnavailableError(
      absl::StrCat(where, ": ", Nccl()->GetErrorString(rc), " (nccl ", rc, ")"));
}

class NcclComm : public DeviceComm {
 public:
  NcclComm(ncclComm_t comm, int nranks, int rank, int device)
      : comm_(comm), nranks_(nranks), rank_(rank), device_(device) {}
  ~NcclComm() override {
    // Destroy waits for work queued on the GPU; abort does not (contract).
    Abort();
  }
  int rank() const override { return rank_; }
  int nranks() const override { return nranks_; }
  int device() const override { return device_; }

  absl::Status Send(const void* data, size_t bytes, int peer, DeviceStream stream) override {
    if (absl::Status s = Check("ncclSend to", bytes, peer, stream); !s.ok() || bytes == 0) return s;
    return NcclError(Nccl()->Send(data, bytes, ncclUint8, peer, comm_,
                                  static_cast<cudaStream_t>(stream.impl)),
                     Where("ncclSend to", peer, bytes));
  }
  absl::Status Recv(void* data, size_t bytes, int peer, DeviceStream stream) override {
    if (absl::Status s = Check("ncclRecv from", bytes, peer, stream); !s.ok() || bytes == 0) {
      return s;
    }
    return NcclError(Nccl()->Recv(data, bytes, ncclUint8, peer, comm_,
                                  static_cast<cudaStream_t>(stream.impl)),
                     Where("ncclRecv from", peer, bytes));
  }
  absl::Status GroupStart() override {
    return NcclError(Nccl()->GroupStart(), Where("ncclGroupStart", -1, 0));
  }
  absl::Status GroupEnd() override {
    return NcclError(Nccl()->GroupEnd(), Where("ncclGroupEnd", -1, 0));
  }
  void Abort() override {
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

  std::atomic<ncclComm_t> comm_;  // null once aborted
  const int nranks_;
  const int rank_;
  const int device_;
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
  absl::StatusOr<std::unique_ptr<DeviceComm>> Init(const std::string& id, int nranks, int rank,
                                                   int device) override {
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
    if (absl::Status s = NcclError(Nccl()->CommInitRank(&comm, nranks, uid, rank), where);
        !s.ok()) {
      return s;
    }
    return std::unique_ptr<DeviceComm>(new NcclComm(comm, nranks, rank, device));
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
