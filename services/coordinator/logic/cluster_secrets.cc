#include "services/coordinator/logic/cluster_secrets.h"

#include <openssl/crypto.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>

#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "services/coordinator/logic/tokens.h"

namespace reshard::coordinator {
namespace {

constexpr char kMasterKey[] = "master";
constexpr size_t kKeyBytes = 32;

}  // namespace

std::string HmacSha256(const std::string& key, const std::string& data) {
  unsigned char out[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  HMAC(EVP_sha256(), key.data(), static_cast<int>(key.size()),
       reinterpret_cast<const unsigned char*>(data.data()), data.size(), out, &len);
  return std::string(reinterpret_cast<const char*>(out), len);
}

absl::StatusOr<std::string> ClusterSecrets::SubKey(const char* label) {
  std::lock_guard<std::mutex> l(mu_);
  if (key_.empty()) {
    std::string candidate(kKeyBytes, '\0');
    if (RAND_bytes(reinterpret_cast<unsigned char*>(candidate.data()), kKeyBytes) != 1) {
      return absl::InternalError("RAND_bytes failed: no random cluster key");
    }
    absl::StatusOr<std::string> key = store_->GetOrCreateClusterSecret(kMasterKey, candidate);
    if (!key.ok()) return key.status();
    if (key->size() != kKeyBytes) {
      return absl::InternalError(absl::StrCat("cluster secret \"", kMasterKey, "\" has ",
                                              key->size(), " bytes, not ", kKeyBytes));
    }
    key_ = *std::move(key);
  }
  return HmacSha256(key_, label);
}

absl::StatusOr<std::string> ClusterSecrets::WorkerToken(const std::string& job_id) {
  absl::StatusOr<std::string> key = SubKey("worker-token");
  if (!key.ok()) return key.status();
  return absl::StrCat(kWorkerTokenPrefix, job_id, ".",
                      absl::WebSafeBase64Escape(HmacSha256(*key, job_id)));
}

absl::StatusOr<std::string> ClusterSecrets::WorkerTokenSha256(const std::string& job_id) {
  absl::StatusOr<std::string> token = WorkerToken(job_id);
  if (!token.ok()) return token.status();
  return Sha256(*token);
}

bool ClusterSecrets::IsWorkerToken(const std::string& token) {
  return absl::StartsWith(token, kWorkerTokenPrefix);
}

std::string ClusterSecrets::WorkerTokenJob(const std::string& token) {
  if (!IsWorkerToken(token)) return "";
  const size_t dot = token.rfind('.');
  const size_t start = sizeof(kWorkerTokenPrefix) - 1;
  if (dot == std::string::npos || dot <= start || dot + 1 >= token.size()) return "";
  return token.substr(start, dot - start);
}

absl::StatusOr<std::string> ClusterSecrets::VerifyWorkerToken(const std::string& token) {
  const std::string job_id = WorkerTokenJob(token);
  if (job_id.empty()) {
    return absl::UnauthenticatedError("the worker token is malformed (expected wt-JOB.MAC)");
  }
  absl::StatusOr<std::string> expected = WorkerToken(job_id);
  if (!expected.ok()) return expected.status();
  if (expected->size() != token.size() ||
      CRYPTO_memcmp(expected->data(), token.data(), token.size()) != 0) {
    return absl::UnauthenticatedError(
        absl::StrCat("the worker token for job \"", job_id, "\" is not valid"));
  }
  return job_id;
}

absl::StatusOr<std::string> ClusterSecrets::TransferSecret(const std::string& operation_id) {
  absl::StatusOr<std::string> key = SubKey("transfer");
  if (!key.ok()) return key.status();
  return HmacSha256(*key, operation_id);
}

}  // namespace reshard::coordinator
