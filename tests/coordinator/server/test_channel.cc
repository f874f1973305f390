#include "tests/coordinator/server/test_channel.h"

#include <atomic>
#include <cstdio>
#include <cstdlib>

#include "common/tls.h"
#include "grpcpp/grpcpp.h"
#include "tests/coordinator/harness/test_pki.h"

namespace reshard::coordinator::testing {
namespace {
std::atomic<bool> default_insecure{false};
}  // namespace

std::shared_ptr<grpc::ChannelCredentials> TestCredentials(const std::string& identity) {
  TlsFiles files;
  if (identity == kInsecureIdentity) {
    files.insecure = true;
  } else {
    files.ca = SharedTestPki().ca();
    if (identity != kAnonymousIdentity) {
      absl::StatusOr<CertFiles> cert = SharedTestPki().Issue(identity);
      if (!cert.ok()) {
        std::fprintf(stderr, "test CA: %s\n", std::string(cert.status().message()).c_str());
        std::abort();
      }
      files.cert = cert->cert;
      files.key = cert->key;
    }
  }
  absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> creds = MakeChannelCredentials(files);
  if (!creds.ok()) {
    std::fprintf(stderr, "test credentials: %s\n", std::string(creds.status().message()).c_str());
    std::abort();
  }
  return *creds;
}

std::shared_ptr<grpc::Channel> TestChannel(const std::string& address,
                                           const std::string& identity) {
  grpc::ChannelArguments args;
  args.SetMaxSendMessageSize(64 << 20);
  args.SetMaxReceiveMessageSize(64 << 20);
  return grpc::CreateCustomChannel(address, TestCredentials(identity), args);
}

void SetDefaultTestSecurity(bool insecure) { default_insecure.store(insecure); }
bool DefaultTestInsecure() { return default_insecure.load(); }

}  // namespace reshard::coordinator::testing
