// Transport security shared by every reshard binary: the certificate, key
// and CA files a process is configured with, the gRPC server and channel
// credentials made from them (files re-read when they change, so
// certificates rotate without a restart), and the identity a verified
// client certificate carries. See docs/security.md.
//
// Pure functions apart from reading the files; thread-safe.
#pragma once

#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/config_table.h"  // ParseBool, which the TLS variables use

namespace grpc {
class AuthContext;
class ChannelCredentials;
class ServerCredentials;
}  // namespace grpc

namespace reshard {

/// The TLS files of one process. `insecure` is the explicit choice of
/// plaintext; then no file may be named.
struct TlsFiles {
  std::string cert;  ///< PEM certificate chain of this process
  std::string key;   ///< PEM private key of `cert`
  std::string ca;    ///< PEM CA bundle that peers' certificates must chain to
  bool insecure = false;
  /// How often the files are checked for changes (certificate rotation).
  unsigned reload_seconds = 10;
};

/// What a binary calls its TLS flags in error messages ("--tls-cert
/// (RESHARD_TLS_CERT)"), so that every binary names them the same way.
inline constexpr const char* kTlsCertFlag = "--tls-cert (RESHARD_TLS_CERT)";
inline constexpr const char* kTlsKeyFlag = "--tls-key (RESHARD_TLS_KEY)";
inline constexpr const char* kTlsCaFlag = "--tls-ca (RESHARD_TLS_CA)";
inline constexpr const char* kInsecureFlag = "--insecure (RESHARD_INSECURE)";

/// Checks a configuration: with `insecure` no file is named; without it the
/// CA is required, cert and key come together (`need_identity`: both are
/// required, as for a server) and every named file is readable.
/// InvalidArgument naming the flag and the path.
[[nodiscard]] absl::Status ValidateTlsFiles(const TlsFiles& files, bool need_identity);

/// Server credentials: plaintext when `insecure`; else TLS with this
/// process's certificate, requesting a client certificate and verifying it
/// against the CA when one is sent (clients without one, e.g. token
/// holders, still get a server-authenticated channel).
[[nodiscard]] absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> MakeServerCredentials(
    const TlsFiles& files);

/// Channel credentials: plaintext when `insecure`; else TLS verifying the
/// server against the CA, presenting `cert`/`key` when given (mutual TLS).
[[nodiscard]] absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> MakeChannelCredentials(
    const TlsFiles& files);

/// The common name of the peer's verified certificate; empty when the peer
/// sent none (or the channel is plaintext).
std::string PeerCertificateName(const grpc::AuthContext& context);

/// The TLS files named by RESHARD_TLS_CERT, RESHARD_TLS_KEY, RESHARD_TLS_CA
/// and RESHARD_INSECURE (a value that is not a boolean counts as false),
/// as the SDK examples and tools without a config table read them.
TlsFiles TlsFilesFromEnvironment();

}  // namespace reshard
