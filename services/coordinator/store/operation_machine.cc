// The operation state machine's table read (operation_machine.h), and the
// compile-time proof that the SQL fragments are the table's.
#include "services/coordinator/store/operation_machine.h"

#include <algorithm>
#include <string>
#include <string_view>

namespace reshard::coordinator {
namespace {

// ---- constexpr readings of the table (also used by the static_asserts) ----

// Text built at compile time (this standard library's std::string is not
// usable in constant expressions).
struct SqlText {
  char data[512] = {};
  size_t size = 0;
  constexpr SqlText& operator+=(std::string_view s) {
    for (char c : s) data[size++] = c;  // overflow: not a constant expression
    return *this;
  }
  constexpr SqlText& operator+=(char c) {
    data[size++] = c;
    return *this;
  }
  constexpr std::string_view view() const { return {data, size}; }
};

constexpr bool LeavesByOwnMove(OpPhase p) {
  for (const OpTransition& t : kOpTransitions) {
    if (t.from == p) return true;
  }
  return false;
}

constexpr uint32_t StatesOf(bool terminal) {
  uint32_t states = 0;
  for (const OpPhaseDef& d : kOpPhases) {
    if (LeavesByOwnMove(d.phase) != terminal) states |= StateBit(d.stored);
  }
  return states;
}

constexpr SqlText RenderList(uint32_t states) {
  SqlText out;
  out += '(';
  bool first = true;
  for (int s = 0; s < 32; ++s) {
    if ((states & (uint32_t{1} << s)) == 0) continue;
    if (!first) out += ", ";
    first = false;
    if (s >= 10) out += static_cast<char>('0' + s / 10);
    out += static_cast<char>('0' + s % 10);
  }
  out += ')';
  return out;
}

constexpr int PopCount(uint32_t v) {
  int n = 0;
  for (; v != 0; v &= v - 1) ++n;
  return n;
}

constexpr void AppendFact(SqlText& out, std::string_view alias, Tri want,
                          std::string_view yes, std::string_view no) {
  if (want == Tri::kAny) return;
  out += " AND ";
  out += alias;
  out += want == Tri::kYes ? yes : no;
}

constexpr SqlText Render(const OpSelector& s, std::string_view alias) {
  SqlText out;
  out += alias;
  if (PopCount(s.states) == 1) {
    out += "state = ";
    const SqlText list = RenderList(s.states);
    out += list.view().substr(1, list.size - 2);
  } else {
    out += "state IN ";
    out += RenderList(s.states).view();
  }
  // In OpFacts order.
  AppendFact(out, alias, s.stop_free, "stop_free", "NOT stop_free");
  AppendFact(out, alias, s.prepare_started, "prepared_from_generation > 0",
             "prepared_from_generation = 0");
  AppendFact(out, alias, s.agents_prepared, "agents_prepared_at IS NOT NULL",
             "agents_prepared_at IS NULL");
  AppendFact(out, alias, s.cut_over, "cutover_operation_id IS NOT NULL",
             "cutover_operation_id IS NULL");
  AppendFact(out, alias, s.queued, "queued_behind_operation_id IS NOT NULL",
             "queued_behind_operation_id IS NULL");
  AppendFact(out, alias, s.boundary_waiting, "step_boundary = 1", "step_boundary <> 1");
  return out;
}

// Named sets: selectors, each exactly the union of the phases it lists
// (operation_machine_test checks it over every combination of facts).
constexpr OpSelector kActiveSel = WhereStates(StatesOf(/*terminal=*/false));
constexpr OpSelector kTerminalSel = WhereStates(StatesOf(/*terminal=*/true));
constexpr OpSelector kStopFreePlannedSel = Where(v1::OPERATION_STATE_PLANNED).StopFree(Tri::kYes);
constexpr OpSelector kAgentsPrepareSel =
    Where(v1::OPERATION_STATE_PLANNED).StopFree(Tri::kYes).PrepareStarted(Tri::kYes);

constexpr bool Same(const SqlText& rendered, std::string_view literal) {
  return rendered.view() == literal;
}

// The fragments statements concatenate are what the table renders.
static_assert(Same(RenderList(StatesOf(false)), RESHARD_SQL_OP_ACTIVE_LIST));
static_assert(Same(RenderList(StatesOf(true)), RESHARD_SQL_OP_TERMINAL_LIST));
static_assert(Same(Render(kActiveSel, "o."), RESHARD_SQL_OP_ACTIVE("o.")));
static_assert(Same(Render(kTerminalSel, "o."), RESHARD_SQL_OP_TERMINAL("o.")));
static_assert(Same(Render(Where(v1::OPERATION_STATE_PENDING), ""),
                   RESHARD_SQL_OP_IS_PENDING("")));
static_assert(Same(Render(Where(v1::OPERATION_STATE_PLANNED), ""),
                   RESHARD_SQL_OP_IS_PLANNED("")));
static_assert(Same(Render(Where(v1::OPERATION_STATE_TRANSFERRING), ""),
                   RESHARD_SQL_OP_IS_TRANSFERRING("")));
static_assert(Same(RenderList(StateBit(v1::OPERATION_STATE_COMMITTED)),
                   "(" RESHARD_SQL_OP_COMMITTED ")"));
static_assert(Same(Render(PhaseDef(OpPhase::kQueued).where, "o."), RESHARD_SQL_OP_QUEUED("o.")));
static_assert(Same(Render(PhaseDef(OpPhase::kAtStepBoundary).where, "o."),
                   RESHARD_SQL_OP_AT_STEP_BOUNDARY("o.")));
static_assert(Same(Render(PhaseDef(OpPhase::kToPrepare).where, "o."),
                   RESHARD_SQL_OP_TO_PREPARE("o.")));
static_assert(Same(Render(kStopFreePlannedSel, "o."), RESHARD_SQL_OP_STOP_FREE_PLANNED("o.")));
static_assert(Same(Render(kAgentsPrepareSel, "o."), RESHARD_SQL_OP_AGENTS_PREPARE("o.")));

// The phases are listed in their enum's order.
constexpr bool PhasesInOrder() {
  for (int i = 0; i < kOpPhaseCount; ++i) {
    if (static_cast<int>(kOpPhases[i].phase) != i) return false;
    if (kOpPhases[i].where.states != StateBit(kOpPhases[i].stored)) return false;
  }
  return true;
}
static_assert(PhasesInOrder());

std::vector<OpPhase> PhasesWhere(bool (*pred)(OpPhase)) {
  std::vector<OpPhase> out;
  for (const OpPhaseDef& d : kOpPhases) {
    if (pred(d.phase)) out.push_back(d.phase);
  }
  return out;
}

}  // namespace

const char* PhaseName(OpPhase p) {
  const int i = static_cast<int>(p);
  return i >= 0 && i < kOpPhaseCount ? kOpPhases[i].name : "UNKNOWN_PHASE";
}

const char* EventName(OpEvent e) {
  // In OpEvent order.
  static constexpr const char* kNames[kOpEventCount] = {
      "released",
      "released to its step boundary",
      "boundary named",
      "boundary timed out",
      "planned",
      "planned (stop-free)",
      "planned (stop-free, before migration 0011)",
      "prepare started",
      "agents prepared",
      "cut over",
      "cut-over committed",
      "transfer started",
      "committed",
      "aborted",
      "cancelled",
      "failed",
  };
  const int i = static_cast<int>(e);
  return i >= 0 && i < kOpEventCount ? kNames[i] : "unknown event";
}

bool IsTerminal(OpPhase p) { return !LeavesByOwnMove(p); }

std::vector<OpTransition> AllTransitions() {
  std::vector<OpTransition> all(std::begin(kOpTransitions), std::end(kOpTransitions));
  for (const OpPhaseDef& d : kOpPhases) {
    if (IsTerminal(d.phase)) continue;
    for (const OpEnding& e : kOpEndings) all.push_back({d.phase, e.event, e.to});
  }
  return all;
}

bool NextPhase(OpPhase from, OpEvent event, OpPhase* to) {
  for (const OpTransition& t : kOpTransitions) {
    if (t.from == from && t.event == event) {
      *to = t.to;
      return true;
    }
  }
  if (IsTerminal(from)) return false;
  for (const OpEnding& e : kOpEndings) {
    if (e.event == event) {
      *to = e.to;
      return true;
    }
  }
  return false;
}

bool PathExists(OpPhase from, OpPhase to) {
  const std::vector<OpTransition> all = AllTransitions();
  std::vector<bool> seen(kOpPhaseCount, false);
  std::vector<OpPhase> todo = {from};
  seen[static_cast<int>(from)] = true;
  while (!todo.empty()) {
    const OpPhase p = todo.back();
    todo.pop_back();
    if (p == to) return true;
    for (const OpTransition& t : all) {
      if (t.from != p || seen[static_cast<int>(t.to)]) continue;
      seen[static_cast<int>(t.to)] = true;
      todo.push_back(t.to);
    }
  }
  return false;
}

OpFacts FactsOf(const v1::Operation& op) {
  OpFacts f;
  f.state = op.state();
  f.stop_free = op.stop_free();
  f.prepare_started = op.prepared_from_generation() > 0;
  f.agents_prepared = op.agents_prepared_unix_ms() > 0;
  f.cut_over = !op.cutover_operation_id().empty();
  f.queued = !op.queued_behind_operation_id().empty();
  f.boundary_waiting = op.step_boundary() == v1::STEP_BOUNDARY_WAITING;
  return f;
}

OpPhase PhaseOf(const OpFacts& facts) {
  for (const OpPhaseDef& d : kOpPhases) {
    if (Matches(d.where, facts)) return d.phase;
  }
  return OpPhase::kFailed;
}

OpPhase PhaseOf(const v1::Operation& op) { return PhaseOf(FactsOf(op)); }

void SetDerivedFields(v1::Operation* op) {
  op->set_at_step_boundary(op->step_boundary() != v1::STEP_BOUNDARY_UNSPECIFIED);
  op->set_phase(PhaseName(PhaseOf(*op)));
  if (op->prepared_unix_ms() > 0) {
    op->set_prepare_seconds(std::max<int64_t>(0, op->prepared_unix_ms() - op->created_unix_ms()) /
                            1000.0);
  }
  // What the prediction is compared with: planned -> committed; a stop-free
  // operation's whole plan moves in its agents' prepare.
  const int64_t moved_unix_ms = op->stop_free() ? op->agents_prepared_unix_ms()
                                : op->state() == v1::OPERATION_STATE_COMMITTED
                                    ? op->updated_unix_ms()
                                    : 0;
  if (op->planned_unix_ms() > 0 && moved_unix_ms > 0) {
    op->set_actual_seconds(std::max<int64_t>(0, moved_unix_ms - op->planned_unix_ms()) / 1000.0);
  }
  if (op->cutover_unix_ms() > 0 && op->state() == v1::OPERATION_STATE_COMMITTED) {
    op->set_pause_seconds(std::max<int64_t>(0, op->updated_unix_ms() - op->cutover_unix_ms()) /
                          1000.0);
  }
}

bool StoredMoveAllowed(v1::OperationState from, v1::OperationState to) {
  for (const OpTransition& t : AllTransitions()) {
    if (StoredState(t.from) == from && StoredState(t.to) == to) return true;
  }
  return false;
}

uint32_t ActiveStates() { return StatesOf(/*terminal=*/false); }
uint32_t TerminalStates() { return StatesOf(/*terminal=*/true); }

bool InAgentsPrepare(OpPhase p) {
  return p == OpPhase::kPreparing || p == OpPhase::kPrepared || p == OpPhase::kCuttingOver;
}

std::vector<OpPhaseSet> NamedPhaseSets() {
  return {
      {"active", kActiveSel, PhasesWhere([](OpPhase p) { return !IsTerminal(p); })},
      {"terminal", kTerminalSel, PhasesWhere(IsTerminal)},
      {"stop-free planned", kStopFreePlannedSel,
       {OpPhase::kToPrepare, OpPhase::kPreparing, OpPhase::kPrepared, OpPhase::kCuttingOver,
        OpPhase::kLegacyPrepared, OpPhase::kLegacyCuttingOver}},
      {"queued", PhaseDef(OpPhase::kQueued).where, {OpPhase::kQueued}},
      {"at step boundary", PhaseDef(OpPhase::kAtStepBoundary).where, {OpPhase::kAtStepBoundary}},
      {"to prepare", PhaseDef(OpPhase::kToPrepare).where, {OpPhase::kToPrepare}},
      {"agents prepare", kAgentsPrepareSel, PhasesWhere(InAgentsPrepare)},
  };
}

std::string OpSql(const OpSelector& where, std::string_view alias) {
  return std::string(Render(where, alias).view());
}

std::string OpSqlList(uint32_t states) { return std::string(RenderList(states).view()); }

}  // namespace reshard::coordinator
