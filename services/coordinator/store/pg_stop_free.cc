// PgStore: two-phase (stop-free) reconfiguration: marking an operation's
// workers prepared, and the cut-over checks CreateOperation runs for a
// checkpoint that names one (docs/coordinator.md, "Stop-free reconfiguration").
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/rpc/enum_name.h"
#include "services/coordinator/store/pg_codec.h"
#include "services/coordinator/store/pg_prepare_statements.h"
#include "services/coordinator/store/pg_stop_free_statements.h"
#include "services/coordinator/store/pg_store.h"
#include "services/coordinator/store/pg_store_internal.h"

namespace reshard::coordinator {
namespace pg {

absl::StatusOr<int64_t> CheckCutOver(PgTx& tx, const NewOperation& op, const pqxx::result& active,
                                     int64_t current_generation) {
  const std::string& target = op.cut_over_operation_id;
  // Active operations in creation order: the stop-free one comes first.
  if (active.empty() || target != active[0][0].c_str()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "cut_over_operation_id \"", target, "\": not the active operation of job \"", op.job_id,
        "\"",
        active.empty() ? " (it has none)" : absl::StrCat(" (\"", active[0][0].c_str(), "\" is)")));
  }
  if (active.size() > 1) {
    return absl::FailedPreconditionError(absl::StrCat("cut_over_operation_id \"", target,
                                                      "\": it was cut over already (checkpoint \"",
                                                      active[1][0].c_str(), "\" is running)"));
  }
  const pqxx::result r = tx.Exec(kLockStopFreeOperation, target, op.job_id);
  if (r.empty()) return OperationNotFound(target);
  const auto state = static_cast<v1::OperationState>(r[0][0].as<int>());
  std::string why;
  if (!r[0][1].as<bool>()) {
    why = "it is not stop-free";
  } else if (state != v1::OPERATION_STATE_PLANNED) {
    why = "it is not PLANNED";
  } else if (!std::string(r[0][3].c_str()).empty()) {
    why = "it was cut over already";
  } else if (!r[0][2].as<bool>()) {
    // Not prepared: name what is missing (docs/coordinator.md, "Agents prepare").
    std::vector<std::string> missing;
    if (!r[0][4].as<bool>())
      missing.push_back("its new workers are not prepared yet (MarkPrepared)");
    if (!r[0][5].as<bool>()) {
      if (r[0][6].as<int64_t>() == 0) {
        missing.push_back("its agents have not started preparing yet");
      } else {
        std::vector<std::string> hosts;
        for (const pqxx::row& h : tx.Exec(kHostsNotPrepared, target)) {
          hosts.push_back(absl::StrCat("\"", h[0].c_str(), "\""));
        }
        missing.push_back(
            absl::StrCat("hosts not prepared yet (not PREPARED): ", absl::StrJoin(hosts, ", ")));
      }
    }
    why = absl::StrJoin(missing, "; ");
  }
  if (!why.empty()) {
    return absl::FailedPreconditionError(absl::StrCat("cut_over_operation_id \"", target, "\" (",
                                                      rpc::EnumShortName(state), "): ", why));
  }
  // The checkpoint takes the number the operation reserved below its own;
  // an operation created before migration 0011 reserved none (0: the next).
  const int64_t reserved = r[0][7].as<int64_t>() - 1;
  return reserved > current_generation ? reserved : 0;
}

void CutOver(PgTx& tx, const NewOperation& op, int64_t checkpoint_generation) {
  tx.Exec(kCutOverOperation, op.cut_over_operation_id, checkpoint_generation, op.operation_id);
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
