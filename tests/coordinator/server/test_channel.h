// gRPC channels of the coordinator's tests, as a given identity of the
// shared test CA (tests/coordinator/harness/test_pki.h).
//
// Thread-safe.
#pragma once

#include <memory>
#include <string>

namespace grpc {
class Channel;
class ChannelCredentials;
}  // namespace grpc

namespace reshard::coordinator::testing {

/// Plaintext (for a coordinator started with --insecure).
inline constexpr char kInsecureIdentity[] = "insecure";
/// TLS that verifies the server but presents no client certificate.
inline constexpr char kAnonymousIdentity[] = "anonymous";
/// The certificate tests use for scheduler calls.
inline constexpr char kAdminIdentity[] = "admin:test";

/// Credentials for `identity`: kInsecureIdentity, kAnonymousIdentity or a
/// certificate common name ("agent:h0", "admin:test") issued on demand.
std::shared_ptr<grpc::ChannelCredentials> TestCredentials(const std::string& identity);

/// A channel to `address` (64 MiB messages) as `identity`.
std::shared_ptr<grpc::Channel> TestChannel(const std::string& address, const std::string& identity);

/// The identity that clients made without one use (CoordinatorClient,
/// FakeAgent): kAdminIdentity, or kInsecureIdentity in fixtures whose
/// coordinators run --insecure. Set by the fixture in SetUp.
void SetDefaultTestSecurity(bool insecure);
bool DefaultTestInsecure();

}  // namespace reshard::coordinator::testing
