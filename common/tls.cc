#include "common/tls.h"

#include <cstdlib>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "grpc/grpc_security_constants.h"
#include "grpcpp/security/auth_context.h"
#include "grpcpp/security/credentials.h"
#include "grpcpp/security/server_credentials.h"
#include "grpcpp/security/tls_certificate_provider.h"
#include "grpcpp/security/tls_credentials_options.h"

namespace reshard {
namespace {

absl::Status Readable(const char* flag, const std::string& path) {
  std::ifstream in(path);
  if (!in.good()) {
    return absl::InvalidArgumentError(absl::StrCat(flag, " = \"", path, "\": cannot read it"));
  }
  return absl::OkStatus();
}

std::shared_ptr<grpc::experimental::FileWatcherCertificateProvider> Provider(
    const TlsFiles& files) {
  if (files.cert.empty()) {
    return std::make_shared<grpc::experimental::FileWatcherCertificateProvider>(
        files.ca, files.reload_seconds);
  }
  return std::make_shared<grpc::experimental::FileWatcherCertificateProvider>(
      files.key, files.cert, files.ca, files.reload_seconds);
}

}  // namespace

TlsFiles TlsFilesFromEnvironment() {
  auto env = [](const char* name) -> std::string {
    const char* v = std::getenv(name);
    return v == nullptr ? "" : v;
  };
  TlsFiles files;
  files.cert = env("RESHARD_TLS_CERT");
  files.key = env("RESHARD_TLS_KEY");
  files.ca = env("RESHARD_TLS_CA");
  if (!ParseBool(env("RESHARD_INSECURE"), &files.insecure).ok()) files.insecure = false;
  return files;
}

absl::Status ValidateTlsFiles(const TlsFiles& files, bool need_identity) {
  if (files.insecure) {
    for (const auto& [flag, path] :
         {std::pair{kTlsCertFlag, &files.cert}, std::pair{kTlsKeyFlag, &files.key},
          std::pair{kTlsCaFlag, &files.ca}}) {
      if (!path->empty()) {
        return absl::InvalidArgumentError(
            absl::StrCat(kInsecureFlag, " and ", flag, " = \"", *path, "\" contradict each other"));
      }
    }
    return absl::OkStatus();
  }
  if (files.ca.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(kTlsCaFlag, " is required: the CA that peers' certificates chain to (or ",
                     kInsecureFlag, " for plaintext)"));
  }
  if (need_identity && (files.cert.empty() || files.key.empty())) {
    return absl::InvalidArgumentError(absl::StrCat(kTlsCertFlag, " and ", kTlsKeyFlag,
                                                   " are required (or ", kInsecureFlag,
                                                   " for plaintext)"));
  }
  if (files.cert.empty() != files.key.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(kTlsCertFlag, " and ", kTlsKeyFlag, " go together: give both or neither"));
  }
  if (files.reload_seconds < 1) {
    return absl::InvalidArgumentError("TLS reload interval must be at least 1 second");
  }
  for (const auto& [flag, path] :
       {std::pair{kTlsCertFlag, &files.cert}, std::pair{kTlsKeyFlag, &files.key},
        std::pair{kTlsCaFlag, &files.ca}}) {
    if (path->empty()) continue;
    if (absl::Status s = Readable(flag, *path); !s.ok()) return s;
  }
  return absl::OkStatus();
}

absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> MakeServerCredentials(
    const TlsFiles& files) {
  if (absl::Status s = ValidateTlsFiles(files, /*need_identity=*/true); !s.ok()) return s;
  if (files.insecure) return grpc::InsecureServerCredentials();
  grpc::experimental::TlsServerCredentialsOptions options(Provider(files));
  options.watch_root_certs();
  options.watch_identity_key_cert_pairs();
  options.set_cert_request_type(GRPC_SSL_REQUEST_CLIENT_CERTIFICATE_AND_VERIFY);
  return grpc::experimental::TlsServerCredentials(options);
}

absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> MakeChannelCredentials(
    const TlsFiles& files) {
  if (absl::Status s = ValidateTlsFiles(files, /*need_identity=*/false); !s.ok()) return s;
  if (files.insecure) return grpc::InsecureChannelCredentials();
  grpc::experimental::TlsChannelCredentialsOptions options;
  options.set_certificate_provider(Provider(files));
  options.watch_root_certs();
  if (!files.cert.empty()) options.watch_identity_key_cert_pairs();
  options.set_verify_server_certs(true);
  return grpc::experimental::TlsCredentials(options);
}

std::string PeerCertificateName(const grpc::AuthContext& context) {
  const std::vector<grpc::string_ref> names =
      context.FindPropertyValues(GRPC_X509_CN_PROPERTY_NAME);
  if (names.empty()) return "";
  return std::string(names.front().data(), names.front().size());
}

}  // namespace reshard
