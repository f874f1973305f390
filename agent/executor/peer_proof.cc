#include "agent/executor/peer_proof.h"

#include <openssl/crypto.h>
#include <openssl/hmac.h>
#include <openssl/sha.h>

#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <vector>

#include "absl/strings/str_cat.h"
#include "agent/executor/transfer_tags.h"

namespace reshard::agent {
namespace {

constexpr size_t kMacBytes = 32;

std::string ProofMac(const std::string& secret, const std::string& operation_id,
                     const std::string& sender, const std::string& receiver) {
  std::string data;
  AppendMacField(data, "reshard-peer-proof-v1");
  AppendMacField(data, operation_id);
  AppendMacField(data, sender);
  AppendMacField(data, receiver);
  return HmacSha256Of(secret, data);
}

}  // namespace

std::string Sha256Of(const std::string& data) {
  unsigned char digest[SHA256_DIGEST_LENGTH];
  SHA256(reinterpret_cast<const unsigned char*>(data.data()), data.size(), digest);
  return std::string(reinterpret_cast<const char*>(digest), sizeof(digest));
}

std::string HmacSha256Of(const std::string& key, const std::string& data) {
  unsigned char out[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  HMAC(EVP_sha256(), key.data(), static_cast<int>(key.size()),
       reinterpret_cast<const unsigned char*>(data.data()), data.size(), out, &len);
  return std::string(reinterpret_cast<const char*>(out), len);
}

void AppendMacField(std::string& out, const std::string& field) {
  const uint32_t n = static_cast<uint32_t>(field.size());
  for (int i = 0; i < 4; ++i) out.push_back(static_cast<char>((n >> (8 * i)) & 0xff));
  out += field;
}

bool ConstantTimeEqual(const std::string& a, const std::string& b) {
  return a.size() == b.size() && CRYPTO_memcmp(a.data(), b.data(), a.size()) == 0;
}

absl::StatusOr<std::string> MakePeerProof(const std::string& secret,
                                          const std::string& operation_id,
                                          const std::string& sender, const std::string& receiver) {
  if (sender.size() > kMaxProofHostBytes) {
    return absl::InvalidArgumentError(absl::StrCat("host id \"", sender.substr(0, 64),
                                                   "...\" is longer than ", kMaxProofHostBytes,
                                                   " bytes: it does not fit a peer proof"));
  }
  std::string out;
  AppendMacField(out, sender);
  out += ProofMac(secret, operation_id, sender, receiver);
  out.resize(kPeerProofBytes, '\0');
  return out;
}

absl::StatusOr<std::string> CheckPeerProof(const std::string& secret,
                                           const std::string& operation_id,
                                           const std::string& receiver,
                                           const std::string& message) {
  if (message.size() != kPeerProofBytes) {
    return absl::UnauthenticatedError(
        absl::StrCat("a peer proof of ", message.size(), " bytes, not ", kPeerProofBytes));
  }
  uint32_t n = 0;
  for (int i = 3; i >= 0; --i) n = n << 8 | static_cast<uint8_t>(message[i]);
  if (n == 0 || n > kMaxProofHostBytes) {
    return absl::UnauthenticatedError(
        absl::StrCat("a malformed peer proof (host id of ", n, " bytes)"));
  }
  const std::string sender = message.substr(4, n);
  const std::string mac = message.substr(4 + n, kMacBytes);
  if (!ConstantTimeEqual(mac, ProofMac(secret, operation_id, sender, receiver))) {
    return absl::PermissionDeniedError(
        absl::StrCat("peer host \"", sender, "\" sent a wrong proof for operation ", operation_id,
                     " (not made with this operation's transfer secret): its data is refused"));
  }
  return sender;
}

absl::Status ExchangePeerProofs(Transport* transport, const std::string& secret,
                                const std::string& operation_id, const std::string& host_id,
                                uint64_t tag, const std::set<std::string>& send_to,
                                const std::set<std::string>& receive_from,
                                const std::function<bool()>& cancelled, PeerWaitBudget timeout) {
  const PeerWait wait(timeout);
  // Outlives this call: a late callback after a failure touches only it.
  struct State {
    std::mutex mu;
    std::condition_variable cv;
    std::vector<std::string> received;  // sized before any receive is posted
    std::vector<std::string> sent;
    std::vector<absl::Status> receive_status;
    std::vector<bool> receive_done;
    size_t sends_done = 0;
    absl::Status send_error;
  };
  const size_t n = receive_from.size();
  auto state = std::make_shared<State>();
  state->received.assign(n, std::string(kPeerProofBytes, '\0'));
  state->receive_status.assign(n, absl::OkStatus());
  state->receive_done.assign(n, false);
  for (const std::string& peer : send_to) {
    absl::StatusOr<std::string> proof = MakePeerProof(secret, operation_id, host_id, peer);
    if (!proof.ok()) return proof.status();
    state->sent.push_back(*std::move(proof));
  }
  for (size_t i = 0; i < n; ++i) {
    transport->Receive(tag, state->received[i].data(), kPeerProofBytes, [state, i](absl::Status s) {
      std::lock_guard<std::mutex> l(state->mu);
      state->receive_status[i] = std::move(s);
      state->receive_done[i] = true;
      state->cv.notify_all();
    });
  }
  size_t k = 0;
  for (const std::string& peer : send_to) {
    transport->Send(
        peer, tag, state->sent[k++].data(), kPeerProofBytes, [state, peer](absl::Status s) {
          std::lock_guard<std::mutex> l(state->mu);
          if (!s.ok() && state->send_error.ok()) {
            state->send_error = absl::Status(
                s.code(),
                absl::StrCat("sending the transfer proof to host \"", peer, "\": ", s.message()));
          }
          ++state->sends_done;
          state->cv.notify_all();
        });
  }
  std::set<std::string> proven;
  std::vector<bool> checked(n, false);
  size_t checked_count = 0;
  absl::Status error;
  {
    std::unique_lock<std::mutex> l(state->mu);
    while (error.ok()) {
      if (!state->send_error.ok()) {
        error = state->send_error;
        break;
      }
      for (size_t i = 0; i < n && error.ok(); ++i) {
        if (!state->receive_done[i] || checked[i]) continue;
        checked[i] = true;
        ++checked_count;
        const absl::Status& s = state->receive_status[i];
        if (!s.ok()) {
          error = absl::Status(s.code(), absl::StrCat("receiving a transfer proof: ", s.message()));
          break;
        }
        absl::StatusOr<std::string> sender =
            CheckPeerProof(secret, operation_id, host_id, state->received[i]);
        if (!sender.ok()) {
          error = sender.status();
        } else if (receive_from.count(*sender) == 0) {
          error = absl::PermissionDeniedError(
              absl::StrCat("host \"", *sender, "\" sent a transfer proof for operation ",
                           operation_id, " but sends nothing to host \"", host_id, "\" in it"));
        } else if (!proven.insert(*sender).second) {
          error = absl::PermissionDeniedError(absl::StrCat(
              "host \"", *sender, "\" sent two transfer proofs for operation ", operation_id));
        }
      }
      if (!error.ok()) break;
      if (checked_count == n && state->sends_done == send_to.size()) break;
      if (cancelled && cancelled()) {
        error = absl::CancelledError(absl::StrCat("operation ", operation_id,
                                                  " cancelled while exchanging transfer proofs"));
        break;
      }
      if (wait.Expired()) {
        std::string missing;
        for (const std::string& peer : receive_from) {
          if (proven.count(peer) == 0)
            absl::StrAppend(&missing, missing.empty() ? "" : ", ", "\"", peer, "\"");
        }
        error = absl::DeadlineExceededError(absl::StrCat(
            "operation ", operation_id, ": host \"", host_id, "\" got no transfer proof from host ",
            missing, " within ", wait.Waited(),
            " (a peer that never started its task, failed, or lacks the operation's transfer "
            "secret)"));
        if (missing.empty()) {
          error = absl::DeadlineExceededError(absl::StrCat(
              "operation ", operation_id, ": host \"", host_id,
              "\": the transfer proofs sent were not delivered within ", wait.Waited()));
        }
        break;
      }
      state->cv.wait_for(l, std::chrono::milliseconds(200));
    }
  }
  if (!error.ok()) transport->CancelTags(tag, ~uint64_t{0});
  return error;
}

}  // namespace reshard::agent
