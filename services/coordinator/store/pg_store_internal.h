// Helpers shared by the files that implement PgStore (pg_jobs.cc,
// pg_operations.cc, pg_transfer.cc, pg_hosts.cc). Internal to the store.
#pragma once

#include <optional>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "reshard/v1/coordinator.pb.h"
#include "reshard/v1/ptc.pb.h"
#include "services/coordinator/store/operation_create.h"
#include "services/coordinator/store/operation_machine.h"
#include "services/coordinator/store/pg_pool.h"
#include "services/coordinator/store/store.h"
#include "services/coordinator/store/store_checks.h"

namespace reshard::coordinator::pg {

/// Runs `body` (PgTx& -> absl::StatusOr<T>) in one transaction; commits only
/// when it returns a value.
template <typename T, typename Body>
absl::StatusOr<T> TransactFor(PgPool& pool, absl::string_view what, Body&& body) {
  std::optional<T> result;
  absl::Status status = pool.Transact(what, [&](PgTx& tx) -> absl::Status {
    result.reset();  // the body may run twice (PgPool::Transact)
    absl::StatusOr<T> r = body(tx);
    if (!r.ok()) return r.status();
    result.emplace(*std::move(r));
    return absl::OkStatus();
  });
  if (!status.ok()) return status;
  return *std::move(result);
}

absl::Status JobNotFound(absl::string_view job_id);
absl::Status OperationNotFound(absl::string_view operation_id);
/// An error as stored (store_checks.h).
using ::reshard::coordinator::TruncateError;

/// The job (RESHARD_PG_JOB_COLUMNS) or NotFound.
absl::StatusOr<v1::Job> ReadJob(PgTx& tx, const std::string& job_id);
/// The job's PTC or NotFound.
absl::StatusOr<v1::Ptc> ReadPtc(PgTx& tx, const std::string& job_id);
/// The phase of operation `operation_id` (operation_machine.h) may move to
/// `to` by one transition of the table; call with its row locked. NotFound;
/// Aborted "operation "x" is ABORTED, not PLANNED" when its stored state is
/// not one `to` is reached from (it moved: a race); FailedPrecondition naming
/// both phases when the stored state fits but the phase does not.
absl::Status CheckMove(PgTx& tx, const std::string& operation_id, OpPhase to);
/// The operation or NotFound.
absl::StatusOr<OperationRecord> ReadOperation(PgTx& tx, const std::string& operation_id,
                                              bool include_plan);

/// Looks up an idempotency key (non-empty). The first call's resource id
/// when the key was used for the same method and request; nullopt when the
/// key is unused; InvalidArgument when it was used for another request.
absl::StatusOr<std::optional<std::string>> FindIdempotentResource(PgTx& tx,
                                                                  const Idempotency& idem);
/// Records the key for `resource_id` (with `job_id`, whose deletion removes
/// it). Aborted when a concurrent call took the key first.
absl::Status ClaimIdempotencyKey(PgTx& tx, const Idempotency& idem, const std::string& resource_id,
                                 const std::string& job_id);

/// A layout as generation rows: rank -> (host, device) arrays and the
/// config. InvalidArgument when the placement's rank count is not tp x pp x dp.
struct GenerationRows {
  std::string hosts;    // text[] literal, rank order
  std::string devices;  // integer[] literal, rank order
  int tp = 0, pp = 0, dp = 0, world = 0;
};
absl::StatusOr<GenerationRows> ToGenerationRows(const v1::Layout& layout, absl::string_view what);

/// Writes the current thread's audit record (audit.h), if any, as a
/// successful call in `tx`, naming `job_id`, `operation_id` and `target`
/// where the record does not already; marks it committed when `tx` commits.
void WriteAudit(PgTx& tx, const std::string& job_id, const std::string& operation_id,
                const std::string& target = "");

/// Inserts a generation and its rank rows.
void InsertGeneration(PgTx& tx, const std::string& job_id, int64_t generation,
                      const std::string& layout_bytes, const GenerationRows& rows,
                      GenerationState state, const std::string& operation_id);

/// The operation a checkpoint's cut_over_operation_id names, of the
/// checkpoint's job, as CheckCutOver (operation_create.h) reads it; its row
/// locked (pg_stop_free.cc). None when the job has no operation by that id.
std::optional<CutOverTarget> ReadCutOverTarget(PgTx& tx, const NewOperation& op);
/// Makes the checkpoint's generation the stop-free operation's source.
void WriteCutOver(PgTx& tx, const CutOverWrite& w);

}  // namespace reshard::coordinator::pg
