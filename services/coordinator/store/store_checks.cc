// The Store's input checks (store_checks.h).
#include "services/coordinator/store/store_checks.h"

#include <algorithm>
#include <set>
#include <utility>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "common/rpc/enum_name.h"
#include "planner/validate.h"
#include "services/coordinator/store/state_memory.h"

namespace reshard::coordinator {

absl::Status CheckText(absl::string_view what, absl::string_view value) {
  if (value.find('\0') == absl::string_view::npos) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat(what, " \"", absl::CHexEscape(value), "\" contains a NUL byte"));
}

std::string CutUtf8(const std::string& text, size_t max) {
  if (text.size() <= max) return text;
  size_t end = max;
  // Do not cut a UTF-8 sequence: back off over continuation bytes.
  while (end > 0 && (static_cast<unsigned char>(text[end]) & 0xC0) == 0x80) --end;
  return text.substr(0, end);
}

std::string TruncateError(const std::string& text) { return CutUtf8(text, kMaxErrorBytes); }

std::string Storable(const std::string& text, size_t max_bytes) {
  std::string out;
  out.reserve(std::min(text.size(), max_bytes));
  for (char c : text) {
    if (c == '\0') {
      out += "\\0";
    } else {
      out += c;
    }
  }
  if (out.size() <= max_bytes) return out;
  return CutUtf8(out, max_bytes) + "...";
}

absl::Status CheckNewJob(const std::string& job_id, const v1::JobSpec& spec,
                         const Idempotency& idem) {
  if (job_id.empty()) return absl::InvalidArgumentError("job_id is empty");
  for (const auto& [what, value] : {std::pair<const char*, const std::string*>{"job id", &job_id},
                                    {"tenant", &spec.tenant()},
                                    {"job name", &spec.name()},
                                    {"idempotency key", &idem.key}}) {
    if (absl::Status s = CheckText(what, *value); !s.ok()) return s;
  }
  return CheckStateMemory(spec.state_memory());
}

absl::StatusOr<int64_t> CheckPtc(const v1::Ptc& ptc) {
  int64_t total = 0;
  for (const v1::TensorSpec& t : ptc.tensors()) {
    if (absl::Status s = CheckText("tensor name", t.name()); !s.ok()) return s;
    int64_t elements = 1;
    for (int64_t d : t.shape()) elements *= d;
    total += elements * planner::ElementBytes(t.dtype());
  }
  for (const v1::BlobSpec& b : ptc.blobs()) {
    if (absl::Status s = CheckText("blob name", b.name()); !s.ok()) return s;
    total += b.size_bytes();
  }
  return total;
}

absl::Status CheckHeartbeat(const HostHeartbeat& beat) {
  if (absl::Status s = CheckText("host id", beat.host_id); !s.ok()) return s;
  for (const std::string& job : beat.held_jobs) {
    if (absl::Status s = CheckText("held_jobs entry", job); !s.ok()) return s;
  }
  return absl::OkStatus();
}

absl::Status CheckNewHost(const v1::Host& host) {
  if (host.host_id().empty()) return absl::InvalidArgumentError("host_id is empty");
  if (absl::Status s = CheckText("host id", host.host_id()); !s.ok()) return s;
  return CheckText("host address", host.address());
}

absl::Status CheckNewToken(const TokenRecord& token) {
  for (const auto& [what, text] :
       {std::pair{"token id", &token.id}, std::pair{"token name", &token.name},
        std::pair{"token creator", &token.created_by}}) {
    if (absl::Status s = CheckText(what, *text); !s.ok()) return s;
  }
  for (const std::string& tenant : token.tenants) {
    if (absl::Status s = CheckText("tenant", tenant); !s.ok()) return s;
  }
  return absl::OkStatus();
}

absl::Status CheckNewOperation(const NewOperation& op) {
  if (op.operation_id.empty()) return absl::InvalidArgumentError("operation_id is empty");
  if (op.job_id.empty()) return absl::InvalidArgumentError("job_id is empty");
  if (op.kind == v1::OPERATION_KIND_UNSPECIFIED) {
    return absl::InvalidArgumentError(
        absl::StrCat("operation \"", op.operation_id, "\": kind is unspecified"));
  }
  for (const auto& [what, value] :
       {std::pair<const char*, const std::string*>{"operation id", &op.operation_id},
        {"job id", &op.job_id},
        {"idempotency key", &op.idempotency.key}}) {
    if (absl::Status s = CheckText(what, *value); !s.ok()) return s;
  }
  for (const std::string& host : op.lost_hosts) {
    if (absl::Status s = CheckText("lost host", host); !s.ok()) return s;
  }
  return absl::OkStatus();
}

absl::Status CheckAuditQuery(const AuditQuery& query) {
  if (query.page_size < 1 || query.page_size > kMaxAuditPageSize || query.before_id < 0) {
    return absl::InvalidArgumentError(absl::StrCat("audit query: page_size ", query.page_size,
                                                   " must be in [1, ", kMaxAuditPageSize,
                                                   "] and before_id ", query.before_id, " >= 0"));
  }
  for (const std::string& tenant : query.tenants) {
    if (absl::Status s = CheckText("tenant", tenant); !s.ok()) return s;
  }
  return CheckText("job id", query.job_id);
}

absl::Status CheckRetentionPolicy(const RetentionPolicy& policy) {
  if (policy.keep_retired_generations < 0 || policy.keep_operations < 0 || policy.batch_rows < 1 ||
      policy.retired_min_age_ms < 0 || policy.discarded_min_age_ms < 0 ||
      policy.operation_min_age_ms < 0 || policy.audit_min_age_ms < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "retention policy: keep counts and ages must be >= 0 and batch_rows >= 1 (keep_retired ",
        policy.keep_retired_generations, ", keep_operations ", policy.keep_operations,
        ", batch_rows ", policy.batch_rows, ", ages ms: retired ", policy.retired_min_age_ms,
        ", discarded ", policy.discarded_min_age_ms, ", operation ", policy.operation_min_age_ms,
        ", audit ", policy.audit_min_age_ms, ")"));
  }
  return absl::OkStatus();
}

absl::Status CheckCheckpointStep(const NewOperation& op, int64_t generation,
                                 const v1::DatasetState* committed) {
  if (committed == nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat("job \"", op.job_id,
                     "\" has no dataset state: a checkpoint with a step needs one "
                     "(RegisterJobRequest.dataset_state)"));
  }
  StepCommit commit = *op.step;
  commit.job_id = op.job_id;
  commit.generation = generation;
  StepCommitVerdict verdict;
  if (absl::Status s = CheckStepCommit(*committed, generation, commit, &verdict); !s.ok()) {
    return s;
  }
  if (verdict == StepCommitVerdict::kRetry) {
    return absl::FailedPreconditionError(
        absl::StrCat("job \"", op.job_id, "\": step ", commit.step,
                     " is committed already; a checkpoint carries a later step"));
  }
  return absl::OkStatus();
}

absl::Status CheckTransitionArgs(const std::string& operation_id, v1::OperationState from,
                                 v1::OperationState to, const OperationUpdate& update) {
  if (to == v1::OPERATION_STATE_TRANSFERRING || to == v1::OPERATION_STATE_COMMITTED) {
    return absl::InvalidArgumentError(
        absl::StrCat("operation \"", operation_id, "\": move to ", rpc::EnumShortName(to), " with ",
                     to == v1::OPERATION_STATE_COMMITTED ? "CommitOperation" : "StartTransfer",
                     ", not TransitionOperation"));
  }
  // The moves left to TransitionOperation, as the state machine has them
  // (operation_machine.h): PENDING -> PLANNED, and any active state ->
  // ABORTED / FAILED. A phase change within a stored state has its own
  // method; terminal states are never left.
  if (from == to || !StoredMoveAllowed(from, to)) {
    return absl::FailedPreconditionError(absl::StrCat(
        "operation \"", operation_id, "\": the operation state machine has no move from ",
        rpc::EnumShortName(from), " to ", rpc::EnumShortName(to)));
  }
  return CheckText("idempotency key", update.idempotency.key);
}

absl::Status OperationNotIn(const std::string& operation_id, v1::OperationState state,
                            v1::OperationState expected, absl::StatusCode code) {
  return absl::Status(
      code, absl::StrCat("operation \"", operation_id, "\" is ", rpc::EnumShortName(state),
                         ", not ", rpc::EnumShortName(expected)));
}

bool ValidTaskState(v1::HostTaskState s) {
  return s >= v1::HOST_TASK_STATE_ASSIGNED && s <= v1::HOST_TASK_STATE_FAILED;
}

absl::Status CheckTaskState(const std::string& host_id, v1::HostTaskState state) {
  if (ValidTaskState(state)) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat("host \"", host_id, "\": bad task state ", static_cast<int>(state)));
}

absl::StatusOr<bool> ProgressOfPrepare(const std::string& operation_id, v1::OperationState state,
                                       v1::HostTaskState reported) {
  const bool preparing =
      state == v1::OPERATION_STATE_PLANNED && reported != v1::HOST_TASK_STATE_DONE;
  if (state != v1::OPERATION_STATE_TRANSFERRING && !preparing) {
    return OperationNotIn(operation_id, state, v1::OPERATION_STATE_TRANSFERRING,
                          absl::StatusCode::kFailedPrecondition);
  }
  return preparing;
}

absl::Status HostNotInOperation(const std::string& operation_id, const std::string& host_id) {
  return absl::NotFoundError(
      absl::StrCat("host \"", host_id, "\" takes no part in operation \"", operation_id, "\""));
}

absl::Status ChecksumRanksMissing(const std::string& host_id, size_t reported, size_t exist,
                                  int64_t generation, const std::string& job_id) {
  return absl::InvalidArgumentError(absl::StrCat(
      "host \"", host_id, "\" reported checksums for ", reported, " ranks, of which only ", exist,
      " exist in generation ", generation, " of job \"", job_id, "\""));
}

absl::Status CheckHostRows(const std::string& operation_id, const std::vector<HostProgress>& hosts,
                           bool check_states) {
  std::set<std::string> seen;
  for (const HostProgress& h : hosts) {
    if (h.host_id.empty()) {
      return absl::InvalidArgumentError(check_states ? "StartTransfer: empty host id"
                                                     : "empty host id");
    }
    if (absl::Status s = CheckText("host id", h.host_id); !s.ok()) return s;
    if (!seen.insert(h.host_id).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("operation \"", operation_id, "\": host \"", h.host_id, "\" listed twice"));
    }
    if (check_states) {
      if (absl::Status s = CheckTaskState(h.host_id, h.state); !s.ok()) return s;
    }
  }
  return absl::OkStatus();
}

absl::Status CheckPreparePhase(const std::string& operation_id, v1::OperationState state) {
  if (state == v1::OPERATION_STATE_PLANNED) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrCat(
      "operation \"", operation_id, "\" is ", rpc::EnumShortName(state),
      ", not PLANNED: ", "PREPARED reports belong to a stop-free operation's prepare phase"));
}

bool RecordsPrepared(v1::HostTaskState state) {
  return state == v1::HOST_TASK_STATE_ASSIGNED || state == v1::HOST_TASK_STATE_RUNNING;
}

absl::Status UnrecordedPrepared(const std::string& operation_id, const std::string& host_id,
                                std::optional<v1::HostTaskState> row) {
  if (!row.has_value()) return HostNotInOperation(operation_id, host_id);
  if (*row == v1::HOST_TASK_STATE_PREPARED) return absl::OkStatus();  // a resent report
  return absl::FailedPreconditionError(absl::StrCat("host \"", host_id, "\" already reported ",
                                                    v1::HostTaskState_Name(*row),
                                                    " for operation \"", operation_id, "\""));
}

absl::Status MissingPendingGeneration(const std::string& operation_id, const std::string& job_id,
                                      int64_t to_generation) {
  return absl::InternalError(absl::StrCat("operation \"", operation_id, "\": job \"", job_id,
                                          "\" has no pending generation ", to_generation,
                                          " (its prepare inserts it)"));
}

absl::Status HostsNotPrepared(const std::string& operation_id, size_t hosts, size_t prepared) {
  return absl::InternalError(absl::StrCat("operation \"", operation_id, "\": ", hosts,
                                          " hosts to transfer, ", prepared, " of them prepared"));
}

int64_t NewOperationToGeneration(bool queued, int64_t reserved_generation, bool stop_free,
                                 int64_t next_generation) {
  if (queued) return 0;
  if (reserved_generation > 0) return reserved_generation;
  return stop_free ? next_generation + 1 : next_generation;
}

AuditRecord SucceededAudit(const AuditRecord& scope, const std::string& job_id,
                           const std::string& operation_id, const std::string& target) {
  AuditRecord r = scope;
  if (r.job_id.empty()) r.job_id = job_id;
  if (r.operation_id.empty()) r.operation_id = operation_id;
  if (r.target.empty()) r.target = target;
  r.code = "OK";
  // A status message is a refusal's; a success keeps only a note its logic
  // left on the scope (an accepted degradation of a recovery), else none.
  return r;
}

absl::Status CheckMoveFrom(absl::string_view operation_id, const OpFacts& facts, OpPhase to) {
  const OpPhase from = PhaseOf(facts);
  std::vector<v1::OperationState> sources;  // stored states `to` is reached from
  for (const OpTransition& t : AllTransitions()) {
    if (t.to != to) continue;
    if (t.from == from) return absl::OkStatus();
    if (std::find(sources.begin(), sources.end(), StoredState(t.from)) == sources.end()) {
      sources.push_back(StoredState(t.from));
    }
  }
  if (std::find(sources.begin(), sources.end(), facts.state) == sources.end()) {
    return absl::AbortedError(
        absl::StrCat("operation \"", operation_id, "\" is ", rpc::EnumShortName(facts.state),
                     ", not ", sources.empty() ? "?" : rpc::EnumShortName(sources.front())));
  }
  return absl::FailedPreconditionError(
      absl::StrCat("operation \"", operation_id, "\" is ", PhaseName(from),
                   ": the operation state machine has no move from it to ", PhaseName(to)));
}

}  // namespace reshard::coordinator
