// The one retry table of reshard: for each kind of call, which codes are
// retried, and the backoff between attempts (exponential, capped, jittered
// downwards). Call sites keep their own loops and the handling that belongs
// to them (a heartbeat answered NOT_FOUND registers again); the codes, the
// waits and the limits come from here. The Python SDK mirrors it in
// client/python/reshard/_rpc.py (tests/data/rpc_vectors.json ties the two).
// Pure apart from the random source passed in; thread-safe.
#pragma once

#include "absl/random/bit_gen_ref.h"
#include "absl/status/status.h"
#include "absl/time/time.h"

namespace reshard::rpc {

/// What a call is, as far as repeating it goes.
enum class CallKind {
  /// SDK / reshardctl unary call that is safe to repeat: reads, keyed
  /// mutations, naturally idempotent ones (CommitStep, MarkPrepared,
  /// ReportRankFailure, RevokeToken).
  kClientCall,
  /// CreateToken and any RPC without a key: never repeated (a repeat after a
  /// lost reply would do it twice).
  kUnkeyedMutation,
  /// Agent -> coordinator unary (GetTask, ReportProgress, Heartbeat,
  /// RegisterAgent).
  kAgentCall,
  /// WatchOperation / WatchJob reopened; the agent's WaitForTasks; the
  /// launcher's follow.
  kStreamReconnect,
  /// Worker -> agent PublishShard / PublishDeviceShard, refused UNAVAILABLE
  /// while the generation is not open yet.
  kWorkerPublish,
};

/// Retries with exponential backoff and jitter (docs/client.md, Retries).
struct RetryPolicy {
  /// Attempts per logical call, the first included; 1 disables retries;
  /// 0 = no limit (the deadline, or the call site, ends it).
  int max_attempts;
  absl::Duration initial_backoff;
  absl::Duration max_backoff;
  /// Growth of the wait per failed attempt (2 everywhere).
  double multiplier;
  /// Share of the wait drawn away at random (0.5 everywhere): the wait is
  /// uniform in [b * (1 - jitter), b), b the un-jittered backoff.
  double jitter;
};

/// The table's row for `kind`.
const RetryPolicy& DefaultPolicy(CallKind kind);

/// Whether a call of `kind` that ended with `code` may be sent again.
/// Codes not in the table are the server's answer and never retried.
bool IsRetryable(CallKind kind, absl::StatusCode code);

/// RESOURCE_EXHAUSTED on a watch: the caller's, its tenant's or the
/// replica's streams are all open. The watch waits for a slot with backoff,
/// uncounted against max_attempts (a busy coordinator is not a failure).
bool IsWatchRefusal(absl::StatusCode code);

/// UNAVAILABLE or DEADLINE_EXCEEDED: the peer is unreachable or silent, as
/// opposed to an answer.
bool IsSilence(absl::StatusCode code);

/// The un-jittered wait after failed attempt `attempt` (1-based):
/// min(max_backoff, initial_backoff * multiplier^(attempt - 1)), in whole
/// microseconds (rounded down).
absl::Duration BaseBackoff(const RetryPolicy& policy, int attempt);

/// BaseBackoff * (1 - jitter * u) for u in [0, 1), rounded down to whole
/// microseconds. Never above max_backoff, and never piling up on it.
absl::Duration BackoffAt(const RetryPolicy& policy, int attempt, double u);

/// BackoffAt with u drawn uniformly from [0, 1) out of `rng`.
absl::Duration Backoff(const RetryPolicy& policy, int attempt, absl::BitGenRef rng);

/// The deadline of one attempt: the earlier of the overall deadline and
/// now + per_attempt (an attempt never outlives the call).
absl::Time AttemptDeadline(absl::Time overall, absl::Time now, absl::Duration per_attempt);

}  // namespace reshard::rpc
