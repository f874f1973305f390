// PgStore: the audit trail (migrations/0005_audit.sql; audit.h).
#include "absl/strings/str_cat.h"
#include "services/coordinator/store/pg_audit_statements.h"
#include "services/coordinator/store/pg_codec.h"
#include "services/coordinator/store/pg_store.h"
#include "services/coordinator/store/pg_store_internal.h"
#include "services/coordinator/store/store_checks.h"

namespace reshard::coordinator {
namespace {

// Inserts `r` with its result; fills its id, time, tenant and job id.
void InsertAudit(pg::PgTx& tx, AuditRecord& r) {
  auto field = [](const std::string& s) { return Storable(s, kMaxAuditFieldBytes); };
  const pqxx::result row =
      tx.Exec(pg::kInsertAudit, field(r.identity), field(r.role), field(r.tenant), field(r.method),
              field(r.job_id), field(r.operation_id), field(r.target), field(r.idempotency_key),
              field(r.code), Storable(r.message, kMaxAuditMessageBytes));
  r.id = row[0][0].as<int64_t>();
  r.at_unix_ms = row[0][1].as<int64_t>();
}

AuditRecord AuditFromRow(const pqxx::row& row) {
  AuditRecord r;
  r.id = row[0].as<int64_t>();
  r.at_unix_ms = row[1].as<int64_t>();
  r.identity = row[2].c_str();
  r.role = row[3].c_str();
  r.tenant = row[4].c_str();
  r.method = row[5].c_str();
  r.job_id = row[6].c_str();
  r.operation_id = row[7].c_str();
  r.target = row[8].c_str();
  r.idempotency_key = row[9].c_str();
  r.code = row[10].c_str();
  r.message = row[11].c_str();
  r.committed = true;
  return r;
}

}  // namespace

namespace pg {

void WriteAudit(PgTx& tx, const std::string& job_id, const std::string& operation_id,
                const std::string& target) {
  AuditRecord* current = AuditScope::Current();
  if (current == nullptr) return;
  // The body may run again (PgPool::Transact): work on a copy each time.
  AuditRecord r = SucceededAudit(*current, job_id, operation_id, target);
  InsertAudit(tx, r);
  tx.OnCommit([current, r] {
    *current = r;
    current->committed = true;
  });
}

}  // namespace pg

absl::Status PgStore::AppendAudit(const AuditRecord& record) {
  return pool_->Transact("AppendAudit", [&](pg::PgTx& tx) -> absl::Status {
    AuditRecord r = record;
    InsertAudit(tx, r);
    return absl::OkStatus();
  });
}

absl::StatusOr<AuditPage> PgStore::ListAudit(const AuditQuery& query) {
  if (absl::Status s = CheckAuditQuery(query); !s.ok()) return s;
  return pg::TransactFor<AuditPage>(
      *pool_, "ListAudit", [&](pg::PgTx& tx) -> absl::StatusOr<AuditPage> {
        // One row more than the page tells whether another page follows.
        const pqxx::result rows =
            tx.Exec(pg::kListAudit, pg::TextArray(query.tenants), query.job_id, query.since_unix_ms,
                    query.before_id, query.page_size + 1);
        AuditPage page;
        for (const pqxx::row& row : rows) {
          if (static_cast<int>(page.records.size()) == query.page_size) {
            page.next_before_id = page.records.back().id;
            break;
          }
          page.records.push_back(AuditFromRow(row));
        }
        return page;
      });
}

}  // namespace reshard::coordinator
