// The operation state machine's table (store/operation_machine.h), walked:
// phases partition every row, every phase is reachable, terminal phases
// have no exits, every active one can end, the stored moves the store
// allows are exactly the table's, and the SQL fragments are the table's sets.
#include "services/coordinator/store/operation_machine.h"

#include <algorithm>
#include <map>
#include <queue>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "gtest/gtest.h"

namespace reshard::coordinator {
namespace {

constexpr v1::OperationState kStored[] = {
    v1::OPERATION_STATE_PENDING,   v1::OPERATION_STATE_PLANNED, v1::OPERATION_STATE_TRANSFERRING,
    v1::OPERATION_STATE_COMMITTED, v1::OPERATION_STATE_ABORTED, v1::OPERATION_STATE_FAILED};

// Every combination of facts, for every stored state.
std::vector<OpFacts> AllFacts() {
  std::vector<OpFacts> all;
  for (v1::OperationState state : kStored) {
    for (int bits = 0; bits < 64; ++bits) {
      OpFacts f;
      f.state = state;
      f.stop_free = bits & 1;
      f.prepare_started = bits & 2;
      f.agents_prepared = bits & 4;
      f.cut_over = bits & 8;
      f.queued = bits & 16;
      f.boundary_waiting = bits & 32;
      all.push_back(f);
    }
  }
  return all;
}

std::vector<OpPhase> AllPhases() {
  std::vector<OpPhase> all;
  for (const OpPhaseDef& d : kOpPhases) all.push_back(d.phase);
  return all;
}

constexpr OpEvent kEvents[] = {
    OpEvent::kReleased,        OpEvent::kReleasedToBoundary, OpEvent::kBoundaryNamed,
    OpEvent::kBoundaryTimedOut, OpEvent::kPlanned,           OpEvent::kPlannedStopFree,
    OpEvent::kPlannedLegacy,   OpEvent::kPrepareStarted,     OpEvent::kAgentsPrepared,
    OpEvent::kCutOver,         OpEvent::kCutOverCommitted,   OpEvent::kTransferStarted,
    OpEvent::kCommitted,       OpEvent::kAborted,            OpEvent::kCancelled,
    OpEvent::kFailed};
static_assert(sizeof(kEvents) / sizeof(kEvents[0]) == kOpEventCount);

TEST(OperationMachineTest, EveryRowIsInExactlyOnePhaseOfItsStoredState) {
  for (const OpFacts& f : AllFacts()) {
    std::vector<OpPhase> matching;
    for (const OpPhaseDef& d : kOpPhases) {
      if (Matches(d.where, f)) matching.push_back(d.phase);
    }
    ASSERT_EQ(matching.size(), 1u) << "state " << f.state << " stop_free " << f.stop_free
                                   << " prepare_started " << f.prepare_started
                                   << " agents_prepared " << f.agents_prepared << " cut_over "
                                   << f.cut_over << " queued " << f.queued;
    EXPECT_EQ(PhaseOf(f), matching[0]);
    EXPECT_EQ(StoredState(matching[0]), f.state) << PhaseName(matching[0]);
  }
}

TEST(OperationMachineTest, PhasesReadFromAnOperation) {
  v1::Operation op;
  op.set_state(v1::OPERATION_STATE_PLANNED);
  EXPECT_EQ(PhaseOf(op), OpPhase::kPlanned);
  op.set_stop_free(true);
  EXPECT_EQ(PhaseOf(op), OpPhase::kToPrepare);
  op.set_prepared_from_generation(3);
  EXPECT_EQ(PhaseOf(op), OpPhase::kPreparing);
  op.set_agents_prepared_unix_ms(1000);
  EXPECT_EQ(PhaseOf(op), OpPhase::kPrepared);
  op.set_cutover_operation_id("op-cut");
  EXPECT_EQ(PhaseOf(op), OpPhase::kCuttingOver);
  op.set_state(v1::OPERATION_STATE_TRANSFERRING);
  EXPECT_EQ(PhaseOf(op), OpPhase::kPreparedTransfer);
  op.set_state(v1::OPERATION_STATE_COMMITTED);
  EXPECT_EQ(PhaseOf(op), OpPhase::kCommitted);

  v1::Operation pending;
  pending.set_state(v1::OPERATION_STATE_PENDING);
  pending.set_step_boundary(v1::STEP_BOUNDARY_WAITING);
  EXPECT_EQ(PhaseOf(pending), OpPhase::kAtStepBoundary);
  pending.set_queued_behind_operation_id("op-ckpt");
  EXPECT_EQ(PhaseOf(pending), OpPhase::kQueued);
  pending.clear_queued_behind_operation_id();
  pending.set_step_boundary(v1::STEP_BOUNDARY_TIMED_OUT);
  EXPECT_EQ(PhaseOf(pending), OpPhase::kPending);
}

TEST(OperationMachineTest, TheTableIsAFunctionOfPhaseAndEvent) {
  std::set<std::pair<OpPhase, OpEvent>> seen;
  for (const OpTransition& t : AllTransitions()) {
    EXPECT_TRUE(seen.insert({t.from, t.event}).second)
        << PhaseName(t.from) << " on " << EventName(t.event) << " listed twice";
    OpPhase to;
    ASSERT_TRUE(NextPhase(t.from, t.event, &to));
    EXPECT_EQ(to, t.to);
    EXPECT_NE(t.from, t.to) << PhaseName(t.from);
  }
}

TEST(OperationMachineTest, EveryPhaseIsReachable) {
  std::set<OpPhase> reached(std::begin(kOpInitialPhases), std::end(kOpInitialPhases));
  reached.insert(std::begin(kOpMigratedPhases), std::end(kOpMigratedPhases));
  std::queue<OpPhase> todo;
  for (OpPhase p : reached) todo.push(p);
  const std::vector<OpTransition> all = AllTransitions();
  while (!todo.empty()) {
    const OpPhase p = todo.front();
    todo.pop();
    for (const OpTransition& t : all) {
      if (t.from == p && reached.insert(t.to).second) todo.push(t.to);
    }
  }
  for (OpPhase p : AllPhases()) EXPECT_TRUE(reached.count(p)) << PhaseName(p) << " unreachable";
}

TEST(OperationMachineTest, TerminalPhasesHaveNoExitsAndEveryOtherCanEnd) {
  std::vector<std::string> terminal;
  for (OpPhase p : AllPhases()) {
    if (!IsTerminal(p)) {
      for (OpEvent e : {OpEvent::kAborted, OpEvent::kCancelled, OpEvent::kFailed}) {
        OpPhase to;
        ASSERT_TRUE(NextPhase(p, e, &to)) << PhaseName(p) << " cannot end by " << EventName(e);
        EXPECT_TRUE(IsTerminal(to));
      }
      continue;
    }
    terminal.push_back(PhaseName(p));
    for (OpEvent e : kEvents) {
      OpPhase to;
      EXPECT_FALSE(NextPhase(p, e, &to)) << PhaseName(p) << " leaves on " << EventName(e);
    }
  }
  EXPECT_EQ(terminal, (std::vector<std::string>{"COMMITTED", "ABORTED", "FAILED"}));
  EXPECT_EQ(ActiveStates(), StateBit(v1::OPERATION_STATE_PENDING) |
                                StateBit(v1::OPERATION_STATE_PLANNED) |
                                StateBit(v1::OPERATION_STATE_TRANSFERRING));
  EXPECT_EQ(TerminalStates(), StateBit(v1::OPERATION_STATE_COMMITTED) |
                                  StateBit(v1::OPERATION_STATE_ABORTED) |
                                  StateBit(v1::OPERATION_STATE_FAILED));
}

TEST(OperationMachineTest, PathsOnlyGoForward) {
  for (OpPhase p : AllPhases()) {
    EXPECT_TRUE(PathExists(p, p));
    if (!IsTerminal(p)) {
      EXPECT_TRUE(PathExists(p, OpPhase::kAborted)) << PhaseName(p);
      EXPECT_TRUE(PathExists(p, OpPhase::kCommitted)) << PhaseName(p) << " can never commit";
    }
  }
  EXPECT_TRUE(PathExists(OpPhase::kQueued, OpPhase::kPreparedTransfer));
  EXPECT_FALSE(PathExists(OpPhase::kTransferring, OpPhase::kPending));
  EXPECT_FALSE(PathExists(OpPhase::kPrepared, OpPhase::kPreparing));
  // A prepared operation never falls back to moving the whole plan, and an
  // unprepared one never skips steps.
  EXPECT_FALSE(PathExists(OpPhase::kToPrepare, OpPhase::kTransferring));
  EXPECT_FALSE(PathExists(OpPhase::kLegacyPrepared, OpPhase::kPreparedTransfer));
  EXPECT_FALSE(PathExists(OpPhase::kPlanned, OpPhase::kPreparing));
  EXPECT_FALSE(PathExists(OpPhase::kAborted, OpPhase::kCommitted));
}

TEST(OperationMachineTest, StoredMovesAreTheTables) {
  std::set<std::pair<v1::OperationState, v1::OperationState>> allowed;
  for (v1::OperationState from : kStored) {
    for (v1::OperationState to : kStored) {
      if (StoredMoveAllowed(from, to)) allowed.insert({from, to});
    }
  }
  using S = std::pair<v1::OperationState, v1::OperationState>;
  const std::set<S> expected = {
      {v1::OPERATION_STATE_PENDING, v1::OPERATION_STATE_PENDING},  // released, boundary
      {v1::OPERATION_STATE_PENDING, v1::OPERATION_STATE_PLANNED},
      {v1::OPERATION_STATE_PLANNED, v1::OPERATION_STATE_PLANNED},  // prepare, cut-over
      {v1::OPERATION_STATE_PLANNED, v1::OPERATION_STATE_TRANSFERRING},
      {v1::OPERATION_STATE_TRANSFERRING, v1::OPERATION_STATE_COMMITTED},
      {v1::OPERATION_STATE_PENDING, v1::OPERATION_STATE_ABORTED},
      {v1::OPERATION_STATE_PENDING, v1::OPERATION_STATE_FAILED},
      {v1::OPERATION_STATE_PLANNED, v1::OPERATION_STATE_ABORTED},
      {v1::OPERATION_STATE_PLANNED, v1::OPERATION_STATE_FAILED},
      {v1::OPERATION_STATE_TRANSFERRING, v1::OPERATION_STATE_ABORTED},
      {v1::OPERATION_STATE_TRANSFERRING, v1::OPERATION_STATE_FAILED},
  };
  EXPECT_EQ(allowed, expected);
}

TEST(OperationMachineTest, NamedSetsAreExactlyTheirPhases) {
  for (const OpPhaseSet& set : NamedPhaseSets()) {
    const std::set<OpPhase> phases(set.phases.begin(), set.phases.end());
    ASSERT_FALSE(phases.empty()) << set.name;
    for (const OpFacts& f : AllFacts()) {
      EXPECT_EQ(Matches(set.where, f), phases.count(PhaseOf(f)) == 1)
          << set.name << ": " << PhaseName(PhaseOf(f));
    }
  }
}

TEST(OperationMachineTest, SqlFragmentsAreTheTablesSets) {
  std::map<std::string, OpSelector> sets;
  for (const OpPhaseSet& set : NamedPhaseSets()) sets[set.name] = set.where;
  EXPECT_EQ(OpSqlList(ActiveStates()), RESHARD_SQL_OP_ACTIVE_LIST);
  EXPECT_EQ(OpSqlList(TerminalStates()), RESHARD_SQL_OP_TERMINAL_LIST);
  EXPECT_EQ(OpSql(sets.at("active"), "o."), RESHARD_SQL_OP_ACTIVE("o."));
  EXPECT_EQ(OpSql(sets.at("active")), "state IN (1, 2, 3)");
  EXPECT_EQ(OpSql(sets.at("terminal"), "c."), RESHARD_SQL_OP_TERMINAL("c."));
  EXPECT_EQ(OpSql(sets.at("stop-free planned")), RESHARD_SQL_OP_STOP_FREE_PLANNED(""));
  EXPECT_EQ(OpSql(sets.at("queued")), RESHARD_SQL_OP_QUEUED(""));
  EXPECT_EQ(OpSql(sets.at("at step boundary")), RESHARD_SQL_OP_AT_STEP_BOUNDARY(""));
  EXPECT_EQ(OpSql(sets.at("to prepare")), RESHARD_SQL_OP_TO_PREPARE(""));
  EXPECT_EQ(OpSql(sets.at("agents prepare"), "o."), RESHARD_SQL_OP_AGENTS_PREPARE("o."));
  EXPECT_EQ(OpSql(sets.at("to prepare")),
            "state = 2 AND stop_free AND prepared_from_generation = 0 AND agents_prepared_at "
            "IS NULL AND cutover_operation_id IS NULL");
  EXPECT_EQ(OpSql(Where(v1::OPERATION_STATE_PENDING)), RESHARD_SQL_OP_IS_PENDING(""));
  EXPECT_EQ(OpSql(Where(v1::OPERATION_STATE_PLANNED)), RESHARD_SQL_OP_IS_PLANNED(""));
  EXPECT_EQ(OpSql(Where(v1::OPERATION_STATE_TRANSFERRING)), RESHARD_SQL_OP_IS_TRANSFERRING(""));
  EXPECT_EQ(OpSqlList(StateBit(v1::OPERATION_STATE_COMMITTED)), "(" RESHARD_SQL_OP_COMMITTED ")");
}

TEST(OperationMachineTest, NamesAreDistinct) {
  std::set<std::string> names;
  for (OpPhase p : AllPhases()) EXPECT_TRUE(names.insert(PhaseName(p)).second) << PhaseName(p);
  std::set<std::string> events;
  for (OpEvent e : kEvents) EXPECT_TRUE(events.insert(EventName(e)).second) << EventName(e);
}

}  // namespace
}  // namespace reshard::coordinator
