#include "tests/coordinator/harness/test_pki.h"

#include <stdlib.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <optional>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "tests/support/process.h"

namespace reshard::coordinator::testing {
namespace {

// Runs openssl with `args` (no shell); its output goes to stderr.
absl::Status OpenSsl(const std::vector<std::string>& args) {
  test_support::SpawnOptions o;
  o.argv = {"openssl"};
  o.argv.insert(o.argv.end(), args.begin(), args.end());
  o.out = test_support::Stream::ParentFd(STDERR_FILENO);
  absl::StatusOr<test_support::ChildProcess> child = test_support::ChildProcess::Spawn(o);
  if (!child.ok()) {
    return absl::InternalError(
        absl::StrCat(child.status().message(), "; is Debian's openssl installed?"));
  }
  // Killed and reaped by `child` if it runs past the deadline.
  const std::optional<int> status = child->WaitExit(absl::Seconds(60));
  if (!status.has_value()) {
    return absl::DeadlineExceededError(
        absl::StrCat("`", absl::StrJoin(o.argv, " "), "` ran past 60 s"));
  }
  if (*status != 0) {
    return absl::InternalError(absl::StrCat("`", absl::StrJoin(o.argv, " "),
                                            "` failed (exit status ", *status,
                                            "); is Debian's openssl installed?"));
  }
  return absl::OkStatus();
}

// A file name for a common name ("agent:h0" -> "agent_h0").
std::string FileStem(const std::string& cn) {
  std::string out = cn;
  for (char& c : out) {
    if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
  }
  return out;
}

}  // namespace

absl::StatusOr<std::unique_ptr<TestPki>> TestPki::Create(const std::string& name) {
  const char* tmp = getenv("TMPDIR");
  std::string tmpl =
      absl::StrCat(tmp != nullptr && *tmp != '\0' ? tmp : "/tmp", "/", name, "-pki-XXXXXX");
  if (mkdtemp(tmpl.data()) == nullptr) return absl::InternalError("mkdtemp for the test CA");
  std::unique_ptr<TestPki> pki(new TestPki());
  pki->dir_ = tmpl;
  pki->ca_ = pki->dir_ + "/ca.pem";
  pki->ca_key_ = pki->dir_ + "/ca.key";
  if (absl::Status s =
          OpenSsl({"req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
                   "-nodes", "-keyout", pki->ca_key_, "-out", pki->ca_, "-days", "2", "-subj",
                   absl::StrCat("/CN=", name, "-ca")});
      !s.ok()) {
    return s;
  }
  return pki;
}

TestPki::~TestPki() {
  std::error_code ec;
  std::filesystem::remove_all(dir_, ec);
}

absl::StatusOr<CertFiles> TestPki::Issue(const std::string& common_name) {
  std::lock_guard<std::mutex> lock(mu_);
  if (auto it = issued_.find(common_name); it != issued_.end()) return it->second;
  return IssueLocked(common_name);
}

absl::StatusOr<CertFiles> TestPki::Reissue(const std::string& common_name) {
  std::lock_guard<std::mutex> lock(mu_);
  return IssueLocked(common_name);
}

absl::StatusOr<CertFiles> TestPki::IssueLocked(const std::string& common_name) {
  const std::string stem = absl::StrCat(dir_, "/", FileStem(common_name));
  const std::string tag = absl::StrCat(".", ++serial_);
  const std::string ext = stem + tag + ".ext";
  {
    std::ofstream out(ext);
    out << "basicConstraints=CA:FALSE\n"
           "keyUsage=digitalSignature,keyEncipherment\n"
           "extendedKeyUsage=serverAuth,clientAuth\n"
           "subjectAltName=DNS:localhost,IP:127.0.0.1\n";
  }
  const std::string key = stem + tag + ".key", csr = stem + tag + ".csr",
                    cert = stem + tag + ".pem";
  if (absl::Status s =
          OpenSsl({"req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
                   "-keyout", key, "-out", csr, "-subj", absl::StrCat("/CN=", common_name)});
      !s.ok()) {
    return s;
  }
  if (absl::Status s =
          OpenSsl({"x509", "-req", "-in", csr, "-CA", ca_, "-CAkey", ca_key_, "-set_serial",
                   absl::StrCat(serial_ + 1000), "-days", "2", "-extfile", ext, "-out", cert});
      !s.ok()) {
    return s;
  }
  // The stable names are replaced atomically: a reader never sees a key
  // that does not match its certificate... except between the two renames,
  // which the file watcher tolerates (it retries on a mismatch).
  CertFiles files{stem + ".pem", stem + ".key"};
  std::filesystem::rename(key, files.key);
  std::filesystem::rename(cert, files.cert);
  issued_[common_name] = files;
  return files;
}

TestPki& SharedTestPki() {
  // Destroyed at exit, which removes its directory.
  static const std::unique_ptr<TestPki> pki = [] {
    absl::StatusOr<std::unique_ptr<TestPki>> p = TestPki::Create();
    if (!p.ok()) {
      std::fprintf(stderr, "test CA: %s\n", std::string(p.status().message()).c_str());
      std::abort();
    }
    return *std::move(p);
  }();
  return *pki;
}

std::vector<std::string> TestTlsFlags() {
  absl::StatusOr<CertFiles> server = SharedTestPki().Issue("coordinator");
  if (!server.ok()) {
    std::fprintf(stderr, "test CA: %s\n", std::string(server.status().message()).c_str());
    std::abort();
  }
  return {"--tls-cert", server->cert, "--tls-key", server->key, "--tls-ca", SharedTestPki().ca()};
}

}  // namespace reshard::coordinator::testing
