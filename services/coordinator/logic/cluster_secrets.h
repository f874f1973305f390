// Secrets the coordinator derives from one random key kept in PostgreSQL
// (migrations/0006_worker_tokens.sql), so that none of them is stored
// (docs/security.md, "Worker tokens" and "Agent-to-agent transfers"):
//  - a job's worker token, `wt-<job id>.<MAC>` with MAC the base64url
//    HMAC-SHA256 of the job id under HMAC(key, "worker-token"): handed to a
//    job's workers by its scheduler, checked by agents (against its SHA-256)
//    and by the coordinator (the `worker` role);
//  - an operation's transfer secret, HMAC-SHA256 of the operation id under
//    HMAC(key, "transfer"): handed to the agents taking part with their
//    tasks. Operation ids are random and never reused, so each operation
//    (each attempt: a retry is a new operation) has its own.
// The key is read (or created, first replica wins) on first use.
// Thread-safe.
#pragma once

#include <memory>
#include <mutex>
#include <string>

#include "absl/status/statusor.h"
#include "services/coordinator/store/auth_store.h"

namespace reshard::coordinator {

class ClusterSecrets {
 public:
  static constexpr char kWorkerTokenPrefix[] = "wt-";

  explicit ClusterSecrets(std::shared_ptr<AuthStore> store) : store_(std::move(store)) {}

  /// The worker token of job `job_id`. Unavailable when the store is.
  [[nodiscard]] absl::StatusOr<std::string> WorkerToken(const std::string& job_id);
  /// The raw SHA-256 (32 bytes) of WorkerToken(job_id): what agents compare.
  [[nodiscard]] absl::StatusOr<std::string> WorkerTokenSha256(const std::string& job_id);
  /// The job a worker token is valid for. UNAUTHENTICATED (never quoting the
  /// token's MAC) when it is malformed or its MAC is wrong.
  [[nodiscard]] absl::StatusOr<std::string> VerifyWorkerToken(const std::string& token);
  /// The transfer secret (32 bytes) of operation `operation_id`.
  [[nodiscard]] absl::StatusOr<std::string> TransferSecret(const std::string& operation_id);

  /// Whether `token` looks like a worker token (its prefix).
  static bool IsWorkerToken(const std::string& token);
  /// The job id a worker token names (unverified); "" when malformed.
  static std::string WorkerTokenJob(const std::string& token);

 private:
  /// HMAC(key, label), the key read or created once.
  absl::StatusOr<std::string> SubKey(const char* label);

  std::shared_ptr<AuthStore> store_;
  std::mutex mu_;
  std::string key_;  // empty until loaded
};

/// HMAC-SHA256(key, data), raw 32 bytes.
std::string HmacSha256(const std::string& key, const std::string& data);

}  // namespace reshard::coordinator
