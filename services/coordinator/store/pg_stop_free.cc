// PgStore: two-phase (stop-free) reconfiguration: marking an operation's
// workers prepared, and what CreateOperation reads and writes for a
// checkpoint that cuts one over (the rules: operation_create.h;
// docs/coordinator.md, "Stop-free reconfiguration").
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/rpc/enum_name.h"
#include "services/coordinator/store/pg_codec.h"
#include "services/coordinator/store/pg_prepare_statements.h"
#include "services/coordinator/store/pg_stop_free_statements.h"
#include "services/coordinator/store/pg_store.h"
#include "services/coordinator/store/pg_store_internal.h"

namespace reshard::coordinator {
namespace pg {

std::optional<CutOverTarget> ReadCutOverTarget(PgTx& tx, const NewOperation& op) {
  const std::string& target = op.cut_over_operation_id;
  const pqxx::result r = tx.Exec(kLockStopFreeOperation, target, op.job_id);
  if (r.empty()) return std::nullopt;
  CutOverTarget t;
  t.state = static_cast<v1::OperationState>(r[0][0].as<int>());
  t.stop_free = r[0][1].as<bool>();
  t.prepared = r[0][2].as<bool>();
  t.cutover_operation_id = r[0][3].c_str();
  t.workers_prepared = r[0][4].as<bool>();
  t.agents_prepared = r[0][5].as<bool>();
  t.prepared_from_generation = r[0][6].as<int64_t>();
  t.to_generation = r[0][7].as<int64_t>();
  for (const pqxx::row& h : tx.Exec(kHostsNotPrepared, target)) {
    t.hosts_not_prepared.emplace_back(h[0].c_str());
  }
  return t;
}

void WriteCutOver(PgTx& tx, const CutOverWrite& w) {
  tx.Exec(kCutOverOperation, w.operation_id, w.from_generation, w.to_generation, w.checkpoint_id);
}

}  // namespace pg

absl::StatusOr<v1::Operation> PgStore::MarkPrepared(const std::string& operation_id) {
  return pg::TransactFor<v1::Operation>(
      *pool_, "MarkPrepared", [&](pg::PgTx& tx) -> absl::StatusOr<v1::Operation> {
        const pqxx::result r = tx.Exec(pg::kMarkPrepared, operation_id);
        if (!r.empty()) tx.Exec(pg::kSettlePrepared, operation_id);
        absl::StatusOr<OperationRecord> record = pg::ReadOperation(tx, operation_id, false);
        if (!record.ok()) return record.status();
        if (r.empty()) {
          return absl::FailedPreconditionError(absl::StrCat(
              "operation \"", operation_id, "\" is ", rpc::EnumShortName(record->op.state()),
              record->op.stop_free() ? "" : " and not stop-free",
              ": only a stop-free operation in PLANNED can be marked prepared"));
        }
        pg::WriteAudit(tx, record->op.job_id(), operation_id);
        return record->op;
      });
}

}  // namespace reshard::coordinator
