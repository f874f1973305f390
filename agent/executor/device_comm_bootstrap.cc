#include "agent/executor/device_comm_bootstrap.h"

#include <algorithm>
#include <condition_variable>
#include <mutex>

#include "absl/strings/str_cat.h"
#include "agent/executor/peer_proof.h"
#include "agent/executor/transfer_tags.h"

namespace reshard::agent {
namespace {

constexpr size_t kMacBytes = 32;

std::string IdMac(const std::string& secret, const std::string& operation_id,
                  const std::string& sender, const std::string& id) {
  std::string data;
  AppendMacField(data, "reshard-device-comm");
  AppendMacField(data, operation_id);
  AppendMacField(data, sender);
  AppendMacField(data, id);
  return HmacSha256Of(secret, data);
}

uint32_t ReadLength(const std::string& m, size_t at) {
  uint32_t n = 0;
  for (int i = 0; i < 4; ++i) {
    n |= static_cast<uint32_t>(static_cast<uint8_t>(m[at + i])) << (8 * i);
  }
  return n;
}

// Waits until `done()` (checked under `mu`), `cancelled()`, or `deadline`.
// Returns false on the last two.
enum class Wait { kDone, kCancelled, kTimedOut };
Wait WaitFor(std::mutex& mu, std::condition_variable& cv, const std::function<bool()>& done,
             const std::function<bool()>& cancelled,
             std::chrono::steady_clock::time_point deadline) {
  std::unique_lock<std::mutex> l(mu);
  while (!done()) {
    if (cancelled && cancelled()) return Wait::kCancelled;
    if (std::chrono::steady_clock::now() >= deadline) return Wait::kTimedOut;
    cv.wait_for(l, std::chrono::milliseconds(100));
  }
  return Wait::kDone;
}

}  // namespace

uint64_t DeviceCommTag(uint32_t key) { return TransferTag(key, kProofStepIndex, 1).value(); }

absl::StatusOr<std::string> MakeDeviceCommIdMessage(const std::string& secret,
                                                    const std::string& operation_id,
                                                    const std::string& sender,
                                                    const std::string& id) {
  if (sender.size() > kMaxProofHostBytes ||
      8 + sender.size() + id.size() + kMacBytes > kDeviceCommIdMessageBytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "device communicator id message of host \"", sender, "\": the host id (", sender.size(),
        " bytes) and the id (", id.size(), " bytes) do not fit ", kDeviceCommIdMessageBytes,
        " bytes"));
  }
  std::string m;
  AppendMacField(m, sender);
  AppendMacField(m, id);
  m += IdMac(secret, operation_id, sender, id);
  m.resize(kDeviceCommIdMessageBytes, '\0');
  return m;
}

absl::StatusOr<DeviceCommIdMessage> CheckDeviceCommIdMessage(const std::string& secret,
                                                             const std::string& operation_id,
                                                             const std::string& message) {
  auto malformed = [&] {
    return absl::UnauthenticatedError(absl::StrCat(
        "operation ", operation_id, ": a malformed device communicator id message"));
  };
  if (message.size() != kDeviceCommIdMessageBytes) return malformed();
  const uint32_t sender_bytes = ReadLength(message, 0);
  if (sender_bytes == 0 || sender_bytes > kMaxProofHostBytes) return malformed();
  const uint32_t id_bytes = ReadLength(message, 4 + sender_bytes);
  if (8 + sender_bytes + id_bytes + kMacBytes > kDeviceCommIdMessageBytes || id_bytes == 0) {
    return malformed();
  }
  DeviceCommIdMessage out;
  out.sender = message.substr(4, sender_bytes);
  out.id = message.substr(8 + sender_bytes, id_bytes);
  const std::string mac = message.substr(8 + sender_bytes + id_bytes, kMacBytes);
  if (!ConstantTimeEqual(mac, IdMac(secret, operation_id, out.sender, out.id))) {
    return absl::PermissionDeniedError(absl::StrCat(
        "host \"", out.sender, "\" sent a device communicator id for operation ", operation_id,
        " that does not check with the operation's transfer secret"));
  }
  return out;
}

absl::StatusOr<std::unique_ptr<DeviceComm>> BootstrapDeviceComm(
    Transport* transport, DeviceCommFactory* factory, const std::string& secret,
    const std::string& operation_id, const std::string& host_id, std::vector<std::string> hosts,
    int device, uint64_t tag, const std::function<bool()>& cancelled,
    std::chrono::milliseconds timeout) {
  std::sort(hosts.begin(), hosts.end());
  hosts.erase(std::unique(hosts.begin(), hosts.end()), hosts.end());
  const auto me = std::find(hosts.begin(), hosts.end(), host_id);
  if (me == hosts.end()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "operation ", operation_id, ": host \"", host_id,
        "\" is not among the hosts of its device communicator"));
  }
  const int nranks = static_cast<int>(hosts.size());
  const int rank = static_cast<int>(me - hosts.begin());
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  const std::string where =
      absl::StrCat("operation ", operation_id, ": device communicator of host \"", host_id,
                   "\" (rank ", rank, " of ", nranks, ")");
  // Outlives this call: a late callback after a failure touches only it.
  struct State {
    std::mutex mu;
    std::condition_variable cv;
    std::string message;
    size_t done = 0;
    absl::Status error;
  };
  auto state = std::make_shared<State>();
  auto fail = [&](absl::Status s) {
    transport->CancelTags(tag, ~uint64_t{0});
    return s;
  };
  auto waited = [&](Wait w, const std::string& what) {
    return w == Wait::kCancelled
               ? absl::CancelledError(absl::StrCat(where, ": cancelled while ", what))
               : absl::UnavailableError(absl::StrCat(where, ": ", what, " took more than ",
                                                     timeout.count() / 1000.0, " s"));
  };
  std::string id;
  if (rank == 0) {
    absl::StatusOr<std::string> made = factory->NewId();
    if (!made.ok()) return made.status();
    id = *std::move(made);
    absl::StatusOr<std::string> m = MakeDeviceCommIdMessage(secret, operation_id, host_id, id);
    if (!m.ok()) return m.status();
    state->message = *std::move(m);
    for (int r = 1; r < nranks; ++r) {
      const std::string peer = hosts[r];
      transport->Send(peer, tag, state->message.data(), state->message.size(),
                      [state, peer](absl::Status s) {
                        std::lock_guard<std::mutex> l(state->mu);
                        if (!s.ok() && state->error.ok()) {
                          state->error = absl::Status(
                              s.code(), absl::StrCat("sending the device communicator id to ",
                                                     "host \"", peer, "\": ", s.message()));
                        }
                        ++state->done;
                        state->cv.notify_all();
                      });
    }
    const size_t sends = static_cast<size_t>(nranks - 1);
    const Wait w = WaitFor(
        state->mu, state->cv, [&] { return state->done == sends; }, cancelled, deadline);
    if (w != Wait::kDone) return fail(waited(w, "sending the communicator id"));
    std::lock_guard<std::mutex> l(state->mu);
    if (!state->error.ok()) {
      return fail(absl::Status(state->error.code(),
                               absl::StrCat(where, ": ", state->error.message())));
    }
  } else {
    state->message.assign(kDeviceCommIdMessageBytes, '\0');
    transport->Receive(tag, state->message.data(), kDeviceCommIdMessageBytes,
                       [state](absl::Status s) {
                         std::lock_guard<std::mutex> l(state->mu);
                         state->error = std::move(s);
                         state->done = 1;
                         state->cv.notify_all();
                       });
    const Wait w =
        WaitFor(state->mu, state->cv, [&] { return state->done == 1; }, cancelled, deadline);
    if (w == Wait::kTimedOut) {
      return fail(absl::UnavailableError(absl::StrCat(
          where, ": host \"", hosts[0], "\" (rank 0) never sent the communicator id within ",
          timeout.count() / 1000.0, " s")));
    }
    if (w == Wait::kCancelled) return fail(waited(w, "waiting for the communicator id"));
    std::string message;
    {
      std::lock_guard<std::mutex> l(state->mu);
      if (!state->error.ok()) {
        return fail(absl::Status(state->error.code(),
                                 absl::StrCat(where, ": receiving the communicator id: ",
                                              state->error.message())));
      }
      message = state->message;
    }
    absl::StatusOr<DeviceCommIdMessage> checked =
        CheckDeviceCommIdMessage(secret, operation_id, message);
    if (!checked.ok()) return fail(checked.status());
    if (checked->sender != hosts[0]) {
      return fail(absl::PermissionDeniedError(absl::StrCat(
          where, ": host \"", checked->sender, "\" sent the communicator id, but host \"",
          hosts[0], "\" is rank 0")));
    }
    id = std::move(checked->id);
  }
  // A host that never joins (it failed before its bootstrap) must not hold
  // this one: Init gives up at the timeout, or on cancel.
  absl::StatusOr<std::unique_ptr<DeviceComm>> comm = factory->Init(
      id, nranks, rank, device, cancelled, std::chrono::steady_clock::now() + timeout);
  if (!comm.ok()) {
    return absl::Status(comm.status().code(), absl::StrCat(where, ": ", comm.status().message()));
  }
  return comm;
}

}  // namespace reshard::agent
