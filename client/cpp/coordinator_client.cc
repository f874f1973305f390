#include "client/cpp/coordinator_client.h"

#include <algorithm>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/rpc/status.h"
#include "grpcpp/grpcpp.h"

namespace reshard::client {
namespace {

absl::StatusOr<std::shared_ptr<grpc::Channel>> MakeChannel(
    const std::string& target, const CoordinatorClient::Options& options) {
  absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> credentials =
      MakeChannelCredentials(options.tls);
  if (!credentials.ok()) return credentials.status();
  grpc::ChannelArguments args;
  // gRPC's own reconnect backoff (default 1 s growing to 120 s) would keep
  // the channel failing fast long after the coordinator is back; follow ours.
  const int initial_ms = static_cast<int>(
      std::max<int64_t>(1, absl::ToInt64Milliseconds(options.retry.initial_backoff)));
  const int max_ms = static_cast<int>(
      std::max<int64_t>(initial_ms, absl::ToInt64Milliseconds(options.retry.max_backoff)));
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, initial_ms);
  // Not GRPC_ARG_MIN_RECONNECT_BACKOFF_MS: gRPC also uses it as the connect
  // timeout, and a TLS handshake on a loaded machine outlasts our backoff.
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, max_ms);
  // Retries are ours (UNAVAILABLE only, with one idempotency key).
  args.SetInt(GRPC_ARG_ENABLE_RETRIES, 0);
  return grpc::CreateCustomChannel(target, *credentials, args);
}

absl::Time DeadlineAfter(absl::Duration timeout) {
  return timeout == absl::InfiniteDuration() ? absl::InfiniteFuture() : absl::Now() + timeout;
}

void SetDeadline(grpc::ClientContext* context, absl::Time deadline) {
  if (deadline != absl::InfiniteFuture()) context->set_deadline(absl::ToChronoTime(deadline));
}

template <typename Request>
void EnsureKey(Request* request) {
  if (request->idempotency_key().empty()) request->set_idempotency_key(NewIdempotencyKey());
}

// What a watcher acts on: the state, the bytes, and a stop-free operation's
// phases (workers and agents prepared, the agents' pre-copy, prepared, cut
// over: the coordinator streams those in PLANNED; scheduler_api.cc's Follow
// key lists the same fields).
bool SameProgress(const v1::Operation& a, const v1::Operation& b) {
  return a.state() == b.state() && a.bytes_done() == b.bytes_done() &&
         a.bytes_total() == b.bytes_total() && a.prepared_unix_ms() == b.prepared_unix_ms() &&
         a.cutover_unix_ms() == b.cutover_unix_ms() &&
         a.workers_prepared_unix_ms() == b.workers_prepared_unix_ms() &&
         a.agents_prepared_unix_ms() == b.agents_prepared_unix_ms() &&
         a.bytes_precopied() == b.bytes_precopied();
}

}  // namespace

bool IsFinal(v1::OperationState state) {
  return state == v1::OPERATION_STATE_COMMITTED || state == v1::OPERATION_STATE_ABORTED ||
         state == v1::OPERATION_STATE_FAILED;
}

std::string NewIdempotencyKey() {
  thread_local std::mt19937_64 rng{std::random_device{}()};
  return absl::StrFormat("%016x%016x", rng(), rng());
}

CoordinatorClient::CoordinatorClient(const std::string& target, Options options)
    : options_(std::move(options)), rng_(std::random_device{}()) {
  absl::StatusOr<std::shared_ptr<grpc::Channel>> channel = MakeChannel(target, options_);
  if (channel.ok()) {
    channel_ = *std::move(channel);
  } else {
    // Every call reports it; the stub is never used.
    init_status_ = channel.status();
    channel_ = grpc::CreateChannel(target, grpc::InsecureChannelCredentials());
  }
  stub_ = v1::CoordinatorService::NewStub(channel_);
  auth_stub_ = v1::AuthService::NewStub(channel_);
}

void CoordinatorClient::Prepare(grpc::ClientContext* context, absl::Time deadline) const {
  SetDeadline(context, deadline);
  if (!options_.token.empty()) context->AddMetadata("authorization", "Bearer " + options_.token);
}

CoordinatorClient::CoordinatorClient(std::shared_ptr<grpc::Channel> channel, Options options)
    : options_(std::move(options)),
      channel_(std::move(channel)),
      stub_(v1::CoordinatorService::NewStub(channel_)),
      auth_stub_(v1::AuthService::NewStub(channel_)),
      rng_(std::random_device{}()) {}

absl::Duration CoordinatorClient::NextBackoff(int attempt) {
  std::lock_guard<std::mutex> lock(rng_mu_);
  return rpc::Backoff(options_.retry, attempt, rng_);
}

void CoordinatorClient::SleepFor(absl::Duration d) {
  if (d <= absl::ZeroDuration()) return;
  if (channel_->GetState(/*try_to_connect=*/true) == GRPC_CHANNEL_READY) {
    std::this_thread::sleep_for(absl::ToChronoNanoseconds(d));
    return;
  }
  // Not connected: wait on the channel instead of sleeping. Waiting drives
  // its reconnection (a TLS handshake needs several polls, which otherwise
  // only gRPC's 5 s backup poller would make) and ends once it is ready.
  (void)channel_->WaitForConnected(absl::ToChronoTime(absl::Now() + d));
}

absl::Status CoordinatorClient::Call(
    absl::string_view method, const std::function<grpc::Status(grpc::ClientContext*)>& attempt,
    rpc::CallKind kind) {
  if (!init_status_.ok()) return init_status_;
  // Every attempt's deadline is the call's: the time left of it.
  const absl::Time deadline = DeadlineAfter(options_.call_timeout);
  const int max_attempts = kind == rpc::CallKind::kClientCall
                               ? options_.retry.max_attempts
                               : rpc::DefaultPolicy(kind).max_attempts;
  for (int i = 1;; ++i) {
    grpc::ClientContext context;
    Prepare(&context, deadline);
    const absl::Status status = rpc::FromGrpc(attempt(&context));
    if (options_.on_attempt) options_.on_attempt(method, i, status);
    if (status.ok() || !rpc::IsRetryable(kind, status.code()) ||
        (max_attempts > 0 && i >= max_attempts)) {
      return status;
    }
    const absl::Duration wait = NextBackoff(i);
    // The deadline, not the attempt count, ends the retries.
    if (absl::Now() + wait >= deadline) {
      return absl::DeadlineExceededError(absl::StrCat(
          method, ": deadline of ", absl::FormatDuration(options_.call_timeout), " passed after ",
          i, " attempts; last: ", rpc::CodeName(status.code()), ": ", status.message()));
    }
    SleepFor(wait);
  }
}

absl::StatusOr<v1::Job> CoordinatorClient::RegisterJob(v1::RegisterJobRequest request) {
  EnsureKey(&request);
  v1::RegisterJobResponse response;
  absl::Status s = Call("RegisterJob", [&](grpc::ClientContext* c) {
    return stub_->RegisterJob(c, request, &response);
  });
  if (!s.ok()) return s;
  return std::move(*response.mutable_job());
}

absl::StatusOr<v1::Job> CoordinatorClient::GetJob(const v1::GetJobRequest& request) {
  v1::Job job;
  absl::Status s =
      Call("GetJob", [&](grpc::ClientContext* c) { return stub_->GetJob(c, request, &job); });
  if (!s.ok()) return s;
  return job;
}

absl::StatusOr<v1::Job> CoordinatorClient::GetJob(const std::string& job_id, bool include_ptc) {
  v1::GetJobRequest request;
  request.set_job_id(job_id);
  request.set_include_ptc(include_ptc);
  return GetJob(request);
}

absl::StatusOr<std::string> CoordinatorClient::GetWorkerToken(const std::string& job_id) {
  v1::GetWorkerTokenRequest request;
  request.set_job_id(job_id);
  v1::GetWorkerTokenResponse response;
  absl::Status s = Call("GetWorkerToken", [&](grpc::ClientContext* c) {
    return stub_->GetWorkerToken(c, request, &response);
  });
  if (!s.ok()) return s;
  return response.worker_token();
}

absl::StatusOr<v1::ListJobsResponse> CoordinatorClient::ListJobs(
    const v1::ListJobsRequest& request) {
  v1::ListJobsResponse response;
  absl::Status s = Call(
      "ListJobs", [&](grpc::ClientContext* c) { return stub_->ListJobs(c, request, &response); });
  if (!s.ok()) return s;
  return response;
}

absl::StatusOr<v1::ListJobsResponse> CoordinatorClient::ListAllJobs(v1::ListJobsRequest request) {
  v1::ListJobsResponse all;
  for (;;) {
    absl::StatusOr<v1::ListJobsResponse> page = ListJobs(request);
    if (!page.ok()) return page.status();
    for (v1::Job& job : *page->mutable_jobs()) *all.add_jobs() = std::move(job);
    if (page->next_page_token().empty() || page->next_page_token() == request.page_token()) {
      return all;
    }
    request.set_page_token(page->next_page_token());
  }
}

absl::Status CoordinatorClient::DeleteJob(v1::DeleteJobRequest request) {
  EnsureKey(&request);
  v1::DeleteJobResponse response;
  return Call("DeleteJob",
              [&](grpc::ClientContext* c) { return stub_->DeleteJob(c, request, &response); });
}

absl::Status CoordinatorClient::DeleteJob(const std::string& job_id) {
  v1::DeleteJobRequest request;
  request.set_job_id(job_id);
  return DeleteJob(std::move(request));
}

absl::StatusOr<v1::Operation> CoordinatorClient::Resize(v1::ResizeRequest request) {
  EnsureKey(&request);
  v1::Operation op;
  absl::Status s =
      Call("Resize", [&](grpc::ClientContext* c) { return stub_->Resize(c, request, &op); });
  if (!s.ok()) return s;
  return op;
}

absl::StatusOr<v1::Operation> CoordinatorClient::Migrate(v1::MigrateRequest request) {
  EnsureKey(&request);
  v1::Operation op;
  absl::Status s =
      Call("Migrate", [&](grpc::ClientContext* c) { return stub_->Migrate(c, request, &op); });
  if (!s.ok()) return s;
  return op;
}

absl::StatusOr<v1::Operation> CoordinatorClient::RecoverFromFailure(
    v1::RecoverFromFailureRequest request) {
  EnsureKey(&request);
  v1::Operation op;
  absl::Status s = Call("RecoverFromFailure", [&](grpc::ClientContext* c) {
    return stub_->RecoverFromFailure(c, request, &op);
  });
  if (!s.ok()) return s;
  return op;
}

absl::StatusOr<v1::Operation> CoordinatorClient::Checkpoint(v1::CheckpointRequest request) {
  EnsureKey(&request);
  v1::Operation op;
  absl::Status s = Call("Checkpoint",
                        [&](grpc::ClientContext* c) { return stub_->Checkpoint(c, request, &op); });
  if (!s.ok()) return s;
  return op;
}

absl::StatusOr<v1::Operation> CoordinatorClient::MarkPrepared(const std::string& operation_id) {
  v1::MarkPreparedRequest request;
  request.set_operation_id(operation_id);
  v1::Operation op;
  absl::Status s = Call(
      "MarkPrepared", [&](grpc::ClientContext* c) { return stub_->MarkPrepared(c, request, &op); });
  if (!s.ok()) return s;
  return op;
}

absl::StatusOr<v1::PreviewPlanResponse> CoordinatorClient::PreviewPlan(
    const v1::PreviewPlanRequest& request) {
  v1::PreviewPlanResponse response;
  absl::Status s = Call("PreviewPlan", [&](grpc::ClientContext* c) {
    return stub_->PreviewPlan(c, request, &response);
  });
  if (!s.ok()) return s;
  return response;
}

absl::StatusOr<v1::AdviseResponse> CoordinatorClient::Advise(const v1::AdviseRequest& request) {
  v1::AdviseResponse response;
  absl::Status s =
      Call("Advise", [&](grpc::ClientContext* c) { return stub_->Advise(c, request, &response); });
  if (!s.ok()) return s;
  return response;
}

absl::StatusOr<v1::Operation> CoordinatorClient::GetOperation(const std::string& operation_id) {
  v1::GetOperationRequest request;
  request.set_operation_id(operation_id);
  v1::Operation op;
  absl::Status s = Call(
      "GetOperation", [&](grpc::ClientContext* c) { return stub_->GetOperation(c, request, &op); });
  if (!s.ok()) return s;
  return op;
}

absl::StatusOr<v1::Operation> CoordinatorClient::CancelOperation(
    v1::CancelOperationRequest request) {
  EnsureKey(&request);
  v1::Operation op;
  absl::Status s = Call("CancelOperation", [&](grpc::ClientContext* c) {
    return stub_->CancelOperation(c, request, &op);
  });
  if (!s.ok()) return s;
  return op;
}

absl::StatusOr<v1::Operation> CoordinatorClient::CancelOperation(const std::string& operation_id) {
  v1::CancelOperationRequest request;
  request.set_operation_id(operation_id);
  return CancelOperation(std::move(request));
}

absl::StatusOr<v1::ListHostsResponse> CoordinatorClient::ListHosts() {
  v1::ListHostsRequest request;
  v1::ListHostsResponse response;
  absl::Status s = Call(
      "ListHosts", [&](grpc::ClientContext* c) { return stub_->ListHosts(c, request, &response); });
  if (!s.ok()) return s;
  return response;
}

absl::StatusOr<v1::Job> CoordinatorClient::SetPolicy(v1::SetPolicyRequest request) {
  EnsureKey(&request);
  v1::Job job;
  absl::Status s =
      Call("SetPolicy", [&](grpc::ClientContext* c) { return stub_->SetPolicy(c, request, &job); });
  if (!s.ok()) return s;
  return job;
}

absl::StatusOr<v1::NoticeHostResponse> CoordinatorClient::NoticeHost(
    v1::NoticeHostRequest request) {
  EnsureKey(&request);  // a retry gets the same operations
  v1::NoticeHostResponse response;
  absl::Status s = Call("NoticeHost", [&](grpc::ClientContext* c) {
    return stub_->NoticeHost(c, request, &response);
  });
  if (!s.ok()) return s;
  return response;
}

absl::StatusOr<v1::ListAuditResponse> CoordinatorClient::ListAudit(
    const v1::ListAuditRequest& request) {
  v1::ListAuditResponse response;
  absl::Status s = Call(
      "ListAudit", [&](grpc::ClientContext* c) { return stub_->ListAudit(c, request, &response); });
  if (!s.ok()) return s;
  return response;
}

absl::StatusOr<v1::DatasetState> CoordinatorClient::CommitStep(
    const v1::CommitStepRequest& request) {
  v1::DatasetState response;
  absl::Status s = Call("CommitStep", [&](grpc::ClientContext* c) {
    return stub_->CommitStep(c, request, &response);
  });
  if (!s.ok()) return s;
  return response;
}

absl::StatusOr<v1::CreateTokenResponse> CoordinatorClient::CreateToken(
    const v1::CreateTokenRequest& request) {
  v1::CreateTokenResponse response;
  // No idempotency key: a repeat after a lost reply would mint a second
  // token, so an UNAVAILABLE is the caller's to judge (ListTokens shows
  // whether it was made).
  absl::Status s = Call(
      "CreateToken",
      [&](grpc::ClientContext* c) { return auth_stub_->CreateToken(c, request, &response); },
      rpc::CallKind::kUnkeyedMutation);
  if (!s.ok()) return s;
  return response;
}

absl::StatusOr<v1::Token> CoordinatorClient::RevokeToken(const std::string& token_id) {
  v1::RevokeTokenRequest request;
  request.set_token_id(token_id);
  v1::Token token;
  absl::Status s = Call("RevokeToken", [&](grpc::ClientContext* c) {
    return auth_stub_->RevokeToken(c, request, &token);
  });
  if (!s.ok()) return s;
  return token;
}

absl::StatusOr<v1::ListTokensResponse> CoordinatorClient::ListTokens() {
  v1::ListTokensResponse response;
  absl::Status s = Call("ListTokens", [&](grpc::ClientContext* c) {
    return auth_stub_->ListTokens(c, v1::ListTokensRequest(), &response);
  });
  if (!s.ok()) return s;
  return response;
}

absl::StatusOr<v1::Operation> CoordinatorClient::WatchOperation(
    const std::string& operation_id, const std::function<void(const v1::Operation&)>& on_update,
    absl::Duration timeout) {
  if (!init_status_.ok()) return init_status_;
  const absl::Time deadline = DeadlineAfter(timeout);
  const int max_attempts = options_.retry.max_attempts;  // 0: the deadline only
  v1::Operation last;
  bool have_last = false;
  auto deliver = [&](const v1::Operation& op) {
    if (on_update) on_update(op);
    last = op;
    have_last = true;
  };
  int failures = 0;  // consecutive broken streams without an update
  int refusals = 0;  // consecutive refusals for the watch limits
  for (;;) {
    grpc::ClientContext context;
    Prepare(&context, deadline);
    v1::WatchOperationRequest request;
    request.set_operation_id(operation_id);
    // A reopened stream starts after the last version seen (the change feed).
    if (have_last) request.set_from_version(last.version());
    std::unique_ptr<grpc::ClientReader<v1::Operation>> reader =
        stub_->WatchOperation(&context, request);
    v1::Operation op;
    while (reader->Read(&op)) {
      failures = refusals = 0;
      if (!have_last || !SameProgress(last, op) || IsFinal(op.state())) deliver(op);
      if (IsFinal(op.state())) break;
    }
    absl::Status status = rpc::FromGrpc(reader->Finish());
    if (options_.on_attempt) options_.on_attempt("WatchOperation", failures + 1, status);
    if (have_last && IsFinal(last.state())) return last;
    if (status.ok()) {
      status = absl::UnavailableError(
          absl::StrCat("watch of operation \"", operation_id, "\" ended before a final state"));
    }
    if (status.code() == absl::StatusCode::kDeadlineExceeded) {
      return absl::DeadlineExceededError(absl::StrCat(
          "operation \"", operation_id, "\" not final before the watch's deadline",
          have_last ? absl::StrCat(" (now ", v1::OperationState_Name(last.state()), ")") : ""));
    }
    if (rpc::IsWatchRefusal(status.code())) {
      // No slot now: wait for one as long as the deadline allows.
      const absl::Duration wait = NextBackoff(std::min(++refusals, 32));
      if (absl::Now() + wait >= deadline) {
        return absl::DeadlineExceededError(
            absl::StrCat("operation \"", operation_id,
                         "\" not final before the watch's deadline: ", status.message()));
      }
      SleepFor(wait);
      continue;
    }
    // DEADLINE_EXCEEDED is the watch's own deadline (above), RESOURCE_EXHAUSTED
    // a refusal: what is left to reopen on is UNAVAILABLE.
    if (!rpc::IsRetryable(rpc::CallKind::kStreamReconnect, status.code())) return status;
    if (++failures >= max_attempts && max_attempts > 0) return status;
    const absl::Duration wait = NextBackoff(failures);
    if (absl::Now() + wait >= deadline) {
      return absl::DeadlineExceededError(
          absl::StrCat("operation \"", operation_id,
                       "\" not final before the watch's deadline: ", status.message()));
    }
    SleepFor(wait);
    // What happened while the stream was down; a final state ends the watch.
    absl::StatusOr<v1::Operation> now = GetOperation(operation_id);
    if (now.ok()) {
      if (!have_last || !SameProgress(last, *now) || IsFinal(now->state())) deliver(*now);
      if (IsFinal(now->state())) return *now;
    } else if (!rpc::IsRetryable(rpc::CallKind::kClientCall, now.status().code())) {
      return now.status();
    }
  }
}

absl::StatusOr<v1::Operation> CoordinatorClient::WaitForOperation(const std::string& operation_id,
                                                                  absl::Duration timeout) {
  return WatchOperation(operation_id, nullptr, timeout);
}

}  // namespace reshard::client
