// PgStore: rank failures (pg_rank_failures.h).
#include "services/coordinator/store/pg_rank_failures.h"

#include "absl/strings/str_cat.h"
#include "services/coordinator/store/pg_codec.h"
#include "services/coordinator/store/pg_statements.h"
#include "services/coordinator/store/pg_store.h"
#include "services/coordinator/store/pg_store_internal.h"
#include "services/coordinator/store/store_checks.h"

namespace reshard::coordinator {
namespace pg {
namespace {

v1::RankFailure RankFailureFromRow(const pqxx::row& row) {
  v1::RankFailure f;
  f.set_rank(row[0].as<int>());
  f.set_reason(row[1].c_str());
  f.set_generation(row[2].as<int64_t>());
  f.set_reported_unix_ms(row[3].as<int64_t>());
  f.set_reported_by(row[4].c_str());
  return f;
}

}  // namespace

void ReadRankFailures(PgTx& tx, const std::string& job_id, int64_t generation, v1::Job* job) {
  for (const pqxx::row& row : tx.Exec(kSelectRankFailures, job_id, generation)) {
    *job->add_failed_ranks() = RankFailureFromRow(row);
  }
}

}  // namespace pg

absl::StatusOr<v1::RankFailure> PgStore::RecordRankFailure(const RankFailureReport& report) {
  if (absl::Status s = pg::CheckText("job id", report.job_id); !s.ok()) return s;
  if (absl::Status s = pg::CheckText("reason", report.reason); !s.ok()) return s;
  return pg::TransactFor<v1::RankFailure>(
      *pool_, "RecordRankFailure", [&](pg::PgTx& tx) -> absl::StatusOr<v1::RankFailure> {
        // Under the job's row lock: an operation's commit (which takes it
        // too) cannot move the generation between the check and the insert.
        const pqxx::result job = tx.Exec(pg::kLockJob, report.job_id);
        if (job.empty()) return pg::JobNotFound(report.job_id);
        const int64_t current = job[0][0].as<int64_t>();
        if (current != report.generation) {
          return absl::AbortedError(absl::StrCat("job \"", report.job_id, "\" is at generation ",
                                                 current, ", not ", report.generation,
                                                 " any more; retry"));
        }
        pg::WriteAudit(tx, report.job_id, "",
                       absl::StrCat("rank ", report.rank, ": ", CutUtf8(report.reason, 200)));
        const pqxx::result r = tx.Exec(pg::kUpsertRankFailure, report.job_id, report.generation,
                                       report.rank, report.reason, report.reported_by);
        return pg::RankFailureFromRow(r[0]);
      });
}

}  // namespace reshard::coordinator
