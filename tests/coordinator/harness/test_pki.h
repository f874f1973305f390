// A throwaway certificate authority for tests, made with Debian's openssl in
// a fresh temporary directory: a CA and certificates issued on demand, each
// with a common name (the reshard identity, e.g. "agent:h0") and SANs
// localhost / 127.0.0.1 so that any of them can serve on loopback. The
// directory is removed when the TestPki is destroyed.
//
// Thread contract: thread-safe; SharedTestPki() is one per test binary.
#pragma once

#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace reshard::coordinator::testing {

/// A certificate and its key, as files.
struct CertFiles {
  std::string cert;
  std::string key;
};

class TestPki {
 public:
  /// Makes the CA (Internal naming the openssl command on failure).
  static absl::StatusOr<std::unique_ptr<TestPki>> Create(const std::string& name = "reshard-test");
  ~TestPki();

  /// The CA certificate (PEM).
  const std::string& ca() const { return ca_; }
  /// A certificate for `common_name` signed by this CA; the same files for
  /// the same name (issued once).
  absl::StatusOr<CertFiles> Issue(const std::string& common_name);
  /// Issues `common_name` again (new key, new serial) over the same files,
  /// atomically (rename), as a rotation does.
  absl::StatusOr<CertFiles> Reissue(const std::string& common_name);
  const std::string& dir() const { return dir_; }

 private:
  TestPki() = default;
  absl::StatusOr<CertFiles> IssueLocked(const std::string& common_name);

  std::string dir_;
  std::string ca_;
  std::string ca_key_;
  std::mutex mu_;
  std::map<std::string, CertFiles> issued_;
  int serial_ = 0;
};

/// The CA shared by one test binary (created on first use; fails the
/// process with a message when openssl is missing).
TestPki& SharedTestPki();

/// The coordinator flags for TLS with the shared CA: --tls-cert, --tls-key
/// (the certificate "coordinator" of SharedTestPki) and --tls-ca.
std::vector<std::string> TestTlsFlags();

}  // namespace reshard::coordinator::testing
