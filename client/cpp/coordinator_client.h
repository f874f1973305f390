// reshard::client::CoordinatorClient: typed calls of the coordinator's
// scheduler API (reshard.v1.CoordinatorService) for schedulers and tools.
//
// Every call returns the server's status code and message unchanged
// (absl::Status), has a deadline (Options::call_timeout, covering every
// retry of that call) and is retried, with exponential backoff and jitter
// (common/rpc/retry.h, CallKind::kClientCall), only when it ends UNAVAILABLE
// (when the deadline, not the attempt count, stops the retries, the call
// ends DEADLINE_EXCEEDED). Mutating calls carry an idempotency key: the
// request's own when it has one, else a fresh random key per logical call,
// reused by every retry of it, so a retried Resize starts one operation.
// CreateToken has no key and is never repeated (kUnkeyedMutation).
//
// Thread contract: thread-safe; one client may serve many threads.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <random>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "common/rpc/retry.h"
#include "common/tls.h"
#include "reshard/v1/coordinator.grpc.pb.h"
#include "reshard/v1/coordinator.pb.h"

namespace reshard::client {

/// True for COMMITTED, ABORTED and FAILED.
bool IsFinal(v1::OperationState state);

/// A fresh idempotency key: 32 random hex characters.
std::string NewIdempotencyKey();

class CoordinatorClient {
 public:
  struct Options {
    /// Deadline of one logical call, retries and backoff included.
    absl::Duration call_timeout = absl::Seconds(30);
    /// Attempts, backoff and jitter of every call and of a watch's reopening.
    rpc::RetryPolicy retry = rpc::DefaultPolicy(rpc::CallKind::kClientCall);
    /// Called after every attempt of every call (method name, 1-based
    /// attempt, its status), e.g. for logging. May be empty.
    std::function<void(absl::string_view method, int attempt, const absl::Status&)> on_attempt;
    /// Transport security (docs/security.md): the CA that the coordinator's
    /// certificate chains to, and this client's certificate and key for
    /// mutual TLS (services, agents), or `tls.insecure` for plaintext. With
    /// neither a CA nor `insecure`, every call fails InvalidArgument.
    TlsFiles tls;
    /// A bearer token (people, schedulers): sent as `authorization: Bearer
    /// <token>` with every call. Empty: none (the certificate identifies).
    std::string token;
  };

  /// A client of the coordinator at `target` (gRPC target: "host:port").
  /// Connects lazily: the first call reports an unreachable coordinator, or
  /// (InvalidArgument) TLS options that cannot work.
  explicit CoordinatorClient(const std::string& target) : CoordinatorClient(target, Options()) {}
  CoordinatorClient(const std::string& target, Options options);
  /// Over an existing channel (tests, custom credentials).
  CoordinatorClient(std::shared_ptr<grpc::Channel> channel, Options options);

  CoordinatorClient(const CoordinatorClient&) = delete;
  CoordinatorClient& operator=(const CoordinatorClient&) = delete;

  const Options& options() const { return options_; }

  // Jobs.
  [[nodiscard]] absl::StatusOr<v1::Job> RegisterJob(v1::RegisterJobRequest request);
  [[nodiscard]] absl::StatusOr<v1::Job> GetJob(const v1::GetJobRequest& request);
  [[nodiscard]] absl::StatusOr<v1::Job> GetJob(const std::string& job_id, bool include_ptc = false);
  /// The job's worker token (admin, or a scheduler of its tenant): give it
  /// to the job's workers (WorkerClient::Options::token). RegisterJob's
  /// reply carries the same token.
  [[nodiscard]] absl::StatusOr<std::string> GetWorkerToken(const std::string& job_id);
  /// One page; see ListAllJobs for every page.
  [[nodiscard]] absl::StatusOr<v1::ListJobsResponse> ListJobs(const v1::ListJobsRequest& request);
  /// Follows next_page_token to the end; the jobs of every page.
  [[nodiscard]] absl::StatusOr<v1::ListJobsResponse> ListAllJobs(v1::ListJobsRequest request);
  [[nodiscard]] absl::Status DeleteJob(v1::DeleteJobRequest request);
  [[nodiscard]] absl::Status DeleteJob(const std::string& job_id);

  // Operations. Each returns the operation as created (usually PENDING).
  [[nodiscard]] absl::StatusOr<v1::Operation> Resize(v1::ResizeRequest request);
  [[nodiscard]] absl::StatusOr<v1::Operation> Migrate(v1::MigrateRequest request);
  [[nodiscard]] absl::StatusOr<v1::Operation> RecoverFromFailure(
      v1::RecoverFromFailureRequest request);
  /// Opens generation current + 1 on the current layout for the job's
  /// workers to publish a step into (docs/coordinator.md, "Checkpoints").
  /// With `cut_over_operation_id` it is the cut-over of that prepared
  /// stop-free operation (needs `with_step`): its generation becomes the
  /// operation's source.
  [[nodiscard]] absl::StatusOr<v1::Operation> Checkpoint(v1::CheckpointRequest request);
  /// A stop-free operation (ResizeRequest/MigrateRequest.stop_free) is
  /// prepared: its new workers are warm, the old ones may cut over.
  /// FailedPrecondition unless it is stop-free and PLANNED; a repeat keeps
  /// the first time, so UNAVAILABLE is retried like every call.
  [[nodiscard]] absl::StatusOr<v1::Operation> MarkPrepared(const std::string& operation_id);
  /// Plans against the current generation; nothing is stored.
  [[nodiscard]] absl::StatusOr<v1::PreviewPlanResponse> PreviewPlan(
      const v1::PreviewPlanRequest& request);
  [[nodiscard]] absl::StatusOr<v1::Operation> GetOperation(const std::string& operation_id);
  /// The advisor's Pareto set for a job (docs/advisor.md); a read, retried.
  [[nodiscard]] absl::StatusOr<v1::AdviseResponse> Advise(const v1::AdviseRequest& request);

  // Bearer tokens (AuthService; admin only). CreateToken's reply carries
  // the token itself, which nothing shows again. CreateToken is never sent
  // twice: it has no idempotency key, and UNAVAILABLE may mean the token
  // was made and only the reply lost (ListTokens tells).
  [[nodiscard]] absl::StatusOr<v1::CreateTokenResponse> CreateToken(
      const v1::CreateTokenRequest& request);
  [[nodiscard]] absl::StatusOr<v1::Token> RevokeToken(const std::string& token_id);
  [[nodiscard]] absl::StatusOr<v1::ListTokensResponse> ListTokens();
  [[nodiscard]] absl::StatusOr<v1::Operation> CancelOperation(v1::CancelOperationRequest request);
  [[nodiscard]] absl::StatusOr<v1::Operation> CancelOperation(const std::string& operation_id);

  /// Hosts and their agents' state.
  [[nodiscard]] absl::StatusOr<v1::ListHostsResponse> ListHosts();
  /// Host `host_id` goes away at `leaves_unix_ms` (admin; docs/scheduler.md,
  /// "Host notices"): each job on it, moved off or why not. A key is made
  /// when the request has none, so that a retry gets the same operations.
  [[nodiscard]] absl::StatusOr<v1::NoticeHostResponse> NoticeHost(v1::NoticeHostRequest request);
  /// Sets (or, without one, clears) the job's elastic policy
  /// (docs/scheduler.md, "Elastic policies"); returns the job.
  [[nodiscard]] absl::StatusOr<v1::Job> SetPolicy(v1::SetPolicyRequest request);

  /// One page of the audit trail, newest first (docs/security.md, "Audit"):
  /// an admin sees every tenant, a scheduler or viewer its own.
  [[nodiscard]] absl::StatusOr<v1::ListAuditResponse> ListAudit(
      const v1::ListAuditRequest& request);

  /// Commits a step boundary's dataset cursor with the job's current
  /// generation (docs/data.md). A retried commit of the same step is a
  /// no-op, so UNAVAILABLE is retried like every call.
  [[nodiscard]] absl::StatusOr<v1::DatasetState> CommitStep(const v1::CommitStepRequest& request);

  /// Streams the operation to `on_update` every time it changes (state,
  /// bytes, or a stop-free operation's prepared / cut-over time), until it
  /// is final, and returns the final state. When the stream breaks with
  /// UNAVAILABLE (coordinator restarted, failover) it re-reads the operation
  /// with GetOperation and watches again, so no final state is missed; the
  /// callback may see an unchanged operation twice around a reconnect.
  /// A stream refused for the coordinator's watch limits (RESOURCE_EXHAUSTED)
  /// is opened again with backoff until a slot frees or `timeout` passes,
  /// not counted against retry.max_attempts.
  /// `timeout` bounds the whole watch (DEADLINE_EXCEEDED when it passes);
  /// absl::InfiniteDuration() waits as long as it takes. The callback runs
  /// on the calling thread.
  [[nodiscard]] absl::StatusOr<v1::Operation> WatchOperation(
      const std::string& operation_id, const std::function<void(const v1::Operation&)>& on_update,
      absl::Duration timeout = absl::InfiniteDuration());

  /// WatchOperation without a callback: the final operation, or
  /// DEADLINE_EXCEEDED after `timeout`.
  [[nodiscard]] absl::StatusOr<v1::Operation> WaitForOperation(const std::string& operation_id,
                                                               absl::Duration timeout);

 private:
  // Runs `attempt(context)` with the call's deadline, retrying what the
  // table retries for `kind`: kClientCall (a read, a keyed mutation, or one
  // whose repeat is a no-op) under options_.retry; kUnkeyedMutation (a
  // repeat after a lost reply would apply it twice) never.
  absl::Status Call(absl::string_view method,
                    const std::function<grpc::Status(grpc::ClientContext*)>& attempt,
                    rpc::CallKind kind = rpc::CallKind::kClientCall);
  absl::Duration NextBackoff(int attempt);
  void SleepFor(absl::Duration d);

  /// A fresh context with the call's deadline and the bearer token.
  void Prepare(grpc::ClientContext* context, absl::Time deadline) const;

  Options options_;
  absl::Status init_status_;  // why the channel could not be made (TLS files)
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::CoordinatorService::Stub> stub_;
  std::unique_ptr<v1::AuthService::Stub> auth_stub_;
  std::mutex rng_mu_;
  std::mt19937_64 rng_;  // guarded by rng_mu_
};

}  // namespace reshard::client
