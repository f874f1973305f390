// The Store's input checks and storage limits, one copy for both
// implementations (PgStore and MemoryStore), so that they refuse the same
// requests with the same codes and texts. Internal to the store component.
// Pure functions (no database); thread-safe.
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "reshard/v1/coordinator.pb.h"
#include "reshard/v1/ptc.pb.h"
#include "services/coordinator/store/operation_machine.h"
#include "services/coordinator/store/store.h"

namespace reshard::coordinator {

/// Longest error text kept on an operation or a host row.
inline constexpr size_t kMaxErrorBytes = 4096;
/// Longest identifier kept in an audit row: ids come from the network and
/// may be anything (the message's limit is audit.h's kMaxAuditMessageBytes).
inline constexpr size_t kMaxAuditFieldBytes = 256;
/// Largest AuditQuery::page_size.
inline constexpr int kMaxAuditPageSize = 10000;

/// InvalidArgument when `value` holds a NUL byte, which PostgreSQL text
/// cannot store: "<what> \"...\" contains a NUL byte".
[[nodiscard]] absl::Status CheckText(absl::string_view what, absl::string_view value);
/// `text` cut to at most `max` bytes on a UTF-8 character boundary.
std::string CutUtf8(const std::string& text, size_t max);
/// An error as stored: cut to kMaxErrorBytes on a UTF-8 character boundary.
std::string TruncateError(const std::string& text);
/// `text` storable and bounded: NUL bytes become "\0", and it is cut at
/// `max_bytes` on a UTF-8 character boundary (then "..." follows).
std::string Storable(const std::string& text, size_t max_bytes);

/// CreateJob's arguments before any lookup: a non-empty job id, no NUL
/// byte in the job id, tenant, name or idempotency key, and a known
/// spec.state_memory.
[[nodiscard]] absl::Status CheckNewJob(const std::string& job_id, const v1::JobSpec& spec,
                                       const Idempotency& idem);
/// A job's PTC storable: InvalidArgument for a NUL byte in a tensor or a
/// blob name. Its total bytes: the tensors' elements times their element
/// size, plus the blobs' sizes.
[[nodiscard]] absl::StatusOr<int64_t> CheckPtc(const v1::Ptc& ptc);
/// RegisterHost's host: a non-empty id, no NUL byte in the id or address.
[[nodiscard]] absl::Status CheckNewHost(const v1::Host& host);
/// One beat of a heartbeat batch storable: no NUL byte in its host id or
/// any of its held_jobs. Its refusal is that beat's own result, never the
/// batch's (Store::HeartbeatHosts).
[[nodiscard]] absl::Status CheckHeartbeat(const HostHeartbeat& beat);
/// CreateToken's token: no NUL byte in its id, name, creator or tenants.
[[nodiscard]] absl::Status CheckNewToken(const TokenRecord& token);
/// CreateOperation's arguments before any lookup: ids non-empty, a kind,
/// and no NUL byte in the ids, the idempotency key or the lost hosts.
[[nodiscard]] absl::Status CheckNewOperation(const NewOperation& op);
/// ListAudit's query: page_size in [1, kMaxAuditPageSize], before_id >= 0,
/// storable tenants and job id.
[[nodiscard]] absl::Status CheckAuditQuery(const AuditQuery& query);
/// PruneRetention's policy: counts and ages >= 0, batch_rows >= 1.
[[nodiscard]] absl::Status CheckRetentionPolicy(const RetentionPolicy& policy);
/// A checkpoint's step boundary (`op.step`, set) must follow `committed`,
/// the dataset state of the job's current generation `generation`, as a
/// CommitStep would (dataset_commit.h): FailedPrecondition when the job has
/// none (null) or the step is committed already.
[[nodiscard]] absl::Status CheckCheckpointStep(const NewOperation& op, int64_t generation,
                                               const v1::DatasetState* committed);
/// TransitionOperation's arguments before the row is read: InvalidArgument
/// for a move to TRANSFERRING or COMMITTED (their own methods) or a NUL
/// byte in the idempotency key; FailedPrecondition when no transition of
/// the state machine moves stored state `from` to `to`.
[[nodiscard]] absl::Status CheckTransitionArgs(const std::string& operation_id,
                                               v1::OperationState from, v1::OperationState to,
                                               const OperationUpdate& update);

/// "operation "x" is ABORTED, not TRANSFERRING" with `code`: the operation
/// is in `state` where the call needs `expected`.
absl::Status OperationNotIn(const std::string& operation_id, v1::OperationState state,
                            v1::OperationState expected, absl::StatusCode code);
/// A task state a transfer's host row may start in or report: ASSIGNED..
/// FAILED (PREPARED goes through RecordHostPrepared).
bool ValidTaskState(v1::HostTaskState s);

/// A task state a host reports (RecordHostProgress) or starts a transfer in:
/// InvalidArgument "host "h": bad task state 9" unless ValidTaskState.
[[nodiscard]] absl::Status CheckTaskState(const std::string& host_id, v1::HostTaskState state);
/// Whether operation `operation_id`, in `state`, takes a progress report
/// of a host task in `reported`: a TRANSFERRING operation's rows take
/// every report; a stop-free operation's prepare rows (PLANNED) take all
/// but DONE (PREPARED goes through RecordHostPrepared). True for a prepare
/// row (its bytes count in bytes_precopied, not bytes_done);
/// FailedPrecondition "... is X, not TRANSFERRING" otherwise.
[[nodiscard]] absl::StatusOr<bool> ProgressOfPrepare(const std::string& operation_id,
                                                     v1::OperationState state,
                                                     v1::HostTaskState reported);
/// NotFound: `host_id` has no task row in the operation.
absl::Status HostNotInOperation(const std::string& operation_id, const std::string& host_id);
/// InvalidArgument: a host reported checksums for `reported` ranks, of
/// which only `exist` are ranks of the operation's new generation.
absl::Status ChecksumRanksMissing(const std::string& host_id, size_t reported, size_t exist,
                                  int64_t generation, const std::string& job_id);

/// The host rows a transfer (StartTransfer: `check_states`) or a prepare
/// (StartPrepare, StartPreparedTransfer: states unchecked) starts with: ids
/// non-empty, storable and listed once, and with `check_states` each state
/// a ValidTaskState. InvalidArgument naming the operation or the host.
[[nodiscard]] absl::Status CheckHostRows(const std::string& operation_id,
                                         const std::vector<HostProgress>& hosts, bool check_states);

/// RecordHostPrepared's rules. The operation must be in its prepare phase:
/// FailedPrecondition unless `state` is PLANNED.
[[nodiscard]] absl::Status CheckPreparePhase(const std::string& operation_id,
                                             v1::OperationState state);
/// Whether a host row in `state` records a PREPARED report (ASSIGNED or
/// RUNNING; PgStore's prepare_host matches the same states).
bool RecordsPrepared(v1::HostTaskState state);
/// The answer to a PREPARED report that a host row does not record (`row`:
/// its state, not one RecordsPrepared takes; nullopt when the host has no
/// row): OK for a resent report (PREPARED: nothing changes), NotFound
/// without a row, FailedPrecondition naming the state it reported.
[[nodiscard]] absl::Status UnrecordedPrepared(const std::string& operation_id,
                                              const std::string& host_id,
                                              std::optional<v1::HostTaskState> row);
/// StartPreparedTransfer's invariants, which the operation's prepare set
/// up (Internal when broken): its job has the pending generation
/// `to_generation`, and every one of the `hosts` to transfer has a row
/// (`prepared` of them do).
absl::Status MissingPendingGeneration(const std::string& operation_id, const std::string& job_id,
                                      int64_t to_generation);
absl::Status HostsNotPrepared(const std::string& operation_id, size_t hosts, size_t prepared);

/// The to_generation a new operation is created with: 0 while it is queued
/// behind another (its numbers are fixed when it is released), the one a
/// cut-over reserved, else the next unused number (`next_generation`), one
/// more for a stop-free operation (which reserves the one below for its
/// checkpoint).
int64_t NewOperationToGeneration(bool queued, int64_t reserved_generation, bool stop_free,
                                 int64_t next_generation);

/// The audit row a successful call writes: the thread's `scope` record
/// (audit.h) with code OK, naming `job_id`, `operation_id` and `target`
/// where it does not already; its message is the note the call's logic left
/// on the scope (an accepted degradation of a recovery), usually none.
AuditRecord SucceededAudit(const AuditRecord& scope, const std::string& job_id,
                           const std::string& operation_id, const std::string& target);

/// Whether operation `operation_id`, whose row reads `facts`, may move to
/// phase `to` by one transition of the state machine (operation_machine.h).
/// Aborted "operation "x" is ABORTED, not PLANNED" when its stored state is
/// not one `to` is reached from (it moved: a race); FailedPrecondition naming
/// both phases when the stored state fits but the phase does not.
[[nodiscard]] absl::Status CheckMoveFrom(absl::string_view operation_id, const OpFacts& facts,
                                         OpPhase to);

}  // namespace reshard::coordinator
