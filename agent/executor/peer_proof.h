// Proofs that a data-plane peer belongs to an operation (issue 11 item 4;
// docs/security.md, "Agent-to-agent transfers"). The coordinator hands each
// host taking part in an operation the operation's transfer secret with its
// task (over mutual TLS). From it both ends derive
//  - the operation's transfer tag key (so that an outsider cannot guess the
//    tags of its messages), and
//  - for each (sender, receiver) pair, a proof HMAC-SHA256(secret,
//    "reshard-peer-proof" | operation | sender | receiver) that the sender
//    sends first and the receiver checks before it posts any receive of that
//    sender's data.
// Also the SHA-256 and constant-time comparison the worker service uses for
// worker tokens. Pure; thread-safe.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <set>
#include <string>

#include "absl/status/statusor.h"
#include "agent/executor/peer_wait.h"
#include "agent/transfer/transport.h"

namespace reshard::agent {

/// Raw SHA-256 (32 bytes) and HMAC-SHA256 (32 bytes).
std::string Sha256Of(const std::string& data);
std::string HmacSha256Of(const std::string& key, const std::string& data);
/// Equal length and bytes, in time independent of where they differ.
bool ConstantTimeEqual(const std::string& a, const std::string& b);
/// Appends `field` length-prefixed (4 bytes, little endian) to `out`: the
/// encoding of every MAC input, so that ("ab", "c") and ("a", "bc") differ.
void AppendMacField(std::string& out, const std::string& field);

/// The proof message `sender` sends to `receiver`: fixed kPeerProofBytes,
/// the sender's host id (length-prefixed, at most kMaxProofHostBytes) and
/// the MAC. InvalidArgument for a host id that does not fit.
inline constexpr size_t kPeerProofBytes = 320;
inline constexpr size_t kMaxProofHostBytes = 256;
[[nodiscard]] absl::StatusOr<std::string> MakePeerProof(const std::string& secret,
                                                        const std::string& operation_id,
                                                        const std::string& sender,
                                                        const std::string& receiver);

/// Checks a proof message received by `receiver`: returns the sender host it
/// proves. UNAUTHENTICATED for a malformed message; PERMISSION_DENIED naming
/// the claimed sender host when its MAC is wrong (another secret: not a peer
/// of this operation).
[[nodiscard]] absl::StatusOr<std::string> CheckPeerProof(const std::string& secret,
                                                         const std::string& operation_id,
                                                         const std::string& receiver,
                                                         const std::string& message);

/// The proof exchange of one task on `host_id`: sends a proof (message
/// `tag`) to every host of `send_to`, receives one (message `tag`, from any
/// peer) for every host of `receive_from`, and returns once every proof
/// received is checked and every send completed. The caller posts no receive
/// of a peer's data before this returns OK. A proof that does not check, one
/// from a host that is not in `receive_from`, or two from one host fail with
/// PERMISSION_DENIED naming that host; a transport failure with its status;
/// `cancelled()` (polled) with CANCELLED; proofs still missing after
/// `timeout` (peer_wait.h: time the coordinator did not answer is not
/// counted) with DEADLINE_EXCEEDED naming the operation, the hosts they
/// should come from and the wait (a peer without the operation's secret
/// sends on tags nobody posts, so its proof never arrives; so does the proof
/// of a peer that has not got its task yet). On failure the exchange's pending transfers are
/// cancelled (CancelTags(tag, all bits)).
[[nodiscard]] absl::Status ExchangePeerProofs(Transport* transport, const std::string& secret,
                                              const std::string& operation_id,
                                              const std::string& host_id, uint64_t tag,
                                              const std::set<std::string>& send_to,
                                              const std::set<std::string>& receive_from,
                                              const std::function<bool()>& cancelled,
                                              PeerWaitBudget timeout);

}  // namespace reshard::agent
