// The schema's own operation state sets (migrations cannot change, so they
// are checked here against store/operation_machine.h, on the migrated
// database): the states column's CHECK allows exactly the table's stored
// states, and the one-active-operation-per-job index covers exactly the
// phases that hold their job alone (every active phase but QUEUED and
// AT_STEP_BOUNDARY, which wait for a checkpoint of the job, and the
// stop-free PLANNED phases, which share it with their cut-over checkpoint).
#include <pqxx/pqxx>

#include <set>
#include <string>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "services/coordinator/store/operation_machine.h"
#include "tests/coordinator/store/store_fixture.h"

namespace reshard::coordinator::store_test {
namespace {

class SchemaStatesTest : public PgStoreTest {
 protected:
  // The SQL text of catalog expression `sql` ($1: the name).
  std::string Catalog(const std::string& sql, const std::string& name) {
    pqxx::connection conn(dsn_);
    pqxx::nontransaction n(conn);
    const pqxx::result r = n.exec_params(sql, name);
    EXPECT_EQ(r.size(), 1u) << name;
    return r.empty() ? std::string() : r[0][0].c_str();
  }

  // Every combination of facts, as rows named like the operations columns,
  // tagged with its index in `facts`.
  std::string AllRows(std::vector<OpFacts>* facts) {
    std::string rows;
    for (int state = 1; state <= 6; ++state) {
      for (int bits = 0; bits < 64; ++bits) {
        OpFacts f;
        f.state = static_cast<v1::OperationState>(state);
        f.stop_free = bits & 1;
        f.prepare_started = bits & 2;
        f.agents_prepared = bits & 4;
        f.cut_over = bits & 8;
        f.queued = bits & 16;
        f.boundary_waiting = bits & 32;
        absl::StrAppend(&rows, rows.empty() ? "" : ", ", "(", facts->size(), ", ", state,
                        "::smallint, ", f.stop_free ? "true" : "false", ", ",
                        f.prepare_started ? 1 : 0, "::bigint, ",
                        f.agents_prepared ? "now()" : "NULL::timestamptz", ", ",
                        f.cut_over ? "'c'" : "NULL::text", ", ", f.queued ? "'q'" : "NULL::text",
                        ", ", f.boundary_waiting ? 1 : 0, "::smallint)");
        facts->push_back(f);
      }
    }
    return rows;
  }

  // Indexes into `facts` of the rows `predicate` (over operations' columns) selects.
  std::set<size_t> Selected(const std::string& predicate, std::vector<OpFacts>* facts) {
    const std::string rows = AllRows(facts);
    pqxx::connection conn(dsn_);
    pqxx::nontransaction n(conn);
    std::set<size_t> selected;
    for (const pqxx::row& row :
         n.exec(absl::StrCat("SELECT i FROM (VALUES ", rows,
                             ") AS operations(i, state, stop_free, prepared_from_generation, "
                             "agents_prepared_at, cutover_operation_id, "
                             "queued_behind_operation_id, step_boundary) WHERE ",
                             predicate))) {
      selected.insert(row[0].as<size_t>());
    }
    return selected;
  }
};

bool HoldsItsJobAlone(OpPhase p) {
  if (IsTerminal(p) || p == OpPhase::kQueued || p == OpPhase::kAtStepBoundary) return false;
  return !(StoredState(p) == v1::OPERATION_STATE_PLANNED && p != OpPhase::kPlanned);
}

TEST_F(SchemaStatesTest, TheOneActiveOperationIndexCoversThePhasesThatHoldTheirJob) {
  const std::string predicate = Catalog(
      "SELECT pg_get_expr(i.indpred, i.indrelid) FROM pg_index i JOIN pg_class c ON "
      "c.oid = i.indexrelid WHERE c.relname = $1",
      "operations_one_active_per_job");
  ASSERT_FALSE(predicate.empty());
  std::vector<OpFacts> facts;
  const std::set<size_t> selected = Selected(predicate, &facts);
  std::set<std::string> phases;
  for (size_t i = 0; i < facts.size(); ++i) {
    const OpPhase phase = PhaseOf(facts[i]);
    EXPECT_EQ(selected.count(i) == 1, HoldsItsJobAlone(phase))
        << PhaseName(phase) << " and the index predicate " << predicate << " disagree";
    if (selected.count(i) == 1) phases.insert(PhaseName(phase));
  }
  EXPECT_EQ(phases, (std::set<std::string>{"PENDING", "PLANNED", "TRANSFERRING",
                                           "PREPARED_TRANSFER"}));
}

TEST_F(SchemaStatesTest, TheStateColumnAllowsExactlyTheStoredStates) {
  const std::string check = Catalog(
      "SELECT pg_get_constraintdef(c.oid) FROM pg_constraint c WHERE c.conrelid = "
      "'operations'::regclass AND c.contype = 'c' AND pg_get_constraintdef(c.oid) LIKE "
      "'%' || $1 || '%'",
      "(state >=");
  ASSERT_FALSE(check.empty());
  pqxx::connection conn(dsn_);
  pqxx::nontransaction n(conn);
  uint32_t allowed = 0;
  for (const pqxx::row& row :
       n.exec(absl::StrCat("SELECT state FROM generate_series(-1, 40) AS operations(state) ",
                           "WHERE ", check.substr(check.find('(')), " ORDER BY state"))) {
    allowed |= StateBit(static_cast<v1::OperationState>(row[0].as<int>()));
  }
  EXPECT_EQ(allowed, ActiveStates() | TerminalStates()) << check;
}

// Heartbeats rewrite only the lease columns of hosts: no index may cover
// them (an indexed column makes every renewal a non-HOT update), and the
// table leaves room on its pages for the new versions (migration 0021).
TEST_F(SchemaStatesTest, HeartbeatColumnsAreInNoIndexOfHosts) {
  pqxx::connection conn(dsn_);
  pqxx::nontransaction n(conn);
  const pqxx::result indexes =
      n.exec("SELECT indexname, indexdef FROM pg_indexes WHERE tablename = 'hosts' ORDER BY 1");
  ASSERT_FALSE(indexes.empty());
  for (const pqxx::row& row : indexes) {
    const std::string def = row[1].c_str();
    EXPECT_EQ(def.find("lease_expires_unix_ms"), std::string::npos) << def;
    EXPECT_EQ(def.find("last_heartbeat_unix_ms"), std::string::npos) << def;
  }
  EXPECT_EQ(Catalog("SELECT array_to_string(reloptions, ',') FROM pg_class WHERE relname = $1",
                    "hosts"),
            "fillfactor=50");
}

}  // namespace
}  // namespace reshard::coordinator::store_test
