// The operation lifecycle as one state machine (docs/coordinator.md, "The
// operation state machine"): every phase an operation can be in, including
// the stop-free ones that the operations row spells as a combination of
// columns, the one transition table, and the SQL that selects phases,
// rendered from the same definitions. Pure and constexpr; thread-safe.
//
// The row keeps its six stored states (OperationState, column `state`); a
// phase is a stored state plus conditions on a few facts of the row
// (OpFacts). PhaseOf is the only place that reads those combinations, and
// the RESHARD_SQL_OP_* fragments below are the only SQL that spells them:
// operation_machine.cc checks at compile time that each fragment is what
// OpSql renders from this table.
//
// Lives in the store library because the store's compare-and-set moves
// consult it (TransitionOperation refuses a move the table does not have);
// the logic layer (driver, cancel, agent calls) reads phases through it too.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "reshard/v1/coordinator.pb.h"

namespace reshard::coordinator {

/// Every phase of an operation. Stored state in brackets.
enum class OpPhase : uint8_t {
  kQueued,          // [PENDING] behind an in-flight checkpoint
  kAtStepBoundary,  // [PENDING] waiting for a checkpoint that names it
  kPending,         // [PENDING] to plan
  kPlanned,         // [PLANNED] stop-the-world: its transfer is to start
  kToPrepare,       // [PLANNED] stop-free: its agents' prepare is to start
  kPreparing,       // [PLANNED] stop-free: agents pre-copy while the old layout trains
  kPrepared,        // [PLANNED] stop-free: agents prepared; waits for the cut-over checkpoint
  kCuttingOver,     // [PLANNED] stop-free: the cut-over checkpoint named it and runs
  kLegacyPrepared,  // [PLANNED] stop-free from before migration 0011 (workers only)
  kLegacyCuttingOver,  // [PLANNED] such a one, cut over: transfers the whole plan
  kTransferring,       // [TRANSFERRING] the whole plan
  kPreparedTransfer,   // [TRANSFERRING] stop-free, prepared: unchanged steps skipped
  kCommitted,          // [COMMITTED] final
  kAborted,            // [ABORTED] final (cancelled by a client, a host lost, a timeout)
  kFailed,             // [FAILED] final
};
inline constexpr int kOpPhaseCount = 15;

/// What moves an operation from one phase to the next.
enum class OpEvent : uint8_t {
  kReleased,             // the checkpoint it was queued behind ended
  kReleasedToBoundary,   // ... and its step-boundary wait starts now
  kBoundaryNamed,        // a checkpoint named it (its step boundary)
  kBoundaryTimedOut,     // no checkpoint named it by its deadline
  kPlanned,              // the planner's plan is stored (stop-the-world)
  kPlannedStopFree,      // ... of a stop-free operation
  kPlannedLegacy,        // ... of a stop-free one migration 0011 found PENDING
  kPrepareStarted,       // pending generation and host rows inserted
  kAgentsPrepared,       // every host's row PREPARED (or none had a row)
  kCutOver,              // a checkpoint named it (cut_over_operation_id)
  kCutOverCommitted,     // that checkpoint committed: the transfer starts
  kTransferStarted,      // pending generation and host rows inserted
  kCommitted,            // every host DONE: the new generation is current
  kAborted,              // a host failed or was lost, a stall, a timeout
  kCancelled,            // CancelOperation (ABORTED, "cancelled by client")
  kFailed,               // it cannot succeed (the planner refused, the job is gone)
};
inline constexpr int kOpEventCount = 16;

/// A condition on one fact: either value, or one of them.
enum class Tri : uint8_t { kAny, kYes, kNo };

/// The facts of an operations row that phases are read from.
struct OpFacts {
  v1::OperationState state = v1::OPERATION_STATE_UNSPECIFIED;
  bool stop_free = false;         // stop_free
  bool prepare_started = false;   // prepared_from_generation > 0
  bool agents_prepared = false;   // agents_prepared_at IS NOT NULL
  bool cut_over = false;          // cutover_operation_id IS NOT NULL
  bool queued = false;            // queued_behind_operation_id IS NOT NULL
  bool boundary_waiting = false;  // step_boundary = 1 (WAITING)
};

/// Rows whose stored state is in `states` (bit 1 << OperationState) and whose
/// facts meet every condition.
/// Built as Where(PLANNED).StopFree(Tri::kYes)...
struct OpSelector {
  uint32_t states = 0;
  Tri stop_free = Tri::kAny;
  Tri prepare_started = Tri::kAny;
  Tri agents_prepared = Tri::kAny;
  Tri cut_over = Tri::kAny;
  Tri queued = Tri::kAny;
  Tri boundary_waiting = Tri::kAny;

  constexpr OpSelector StopFree(Tri t) const { return With(&OpSelector::stop_free, t); }
  constexpr OpSelector PrepareStarted(Tri t) const {
    return With(&OpSelector::prepare_started, t);
  }
  constexpr OpSelector AgentsPrepared(Tri t) const {
    return With(&OpSelector::agents_prepared, t);
  }
  constexpr OpSelector CutOver(Tri t) const { return With(&OpSelector::cut_over, t); }
  constexpr OpSelector Queued(Tri t) const { return With(&OpSelector::queued, t); }
  constexpr OpSelector BoundaryWaiting(Tri t) const {
    return With(&OpSelector::boundary_waiting, t);
  }

 private:
  constexpr OpSelector With(Tri OpSelector::*field, Tri t) const {
    OpSelector s = *this;
    s.*field = t;
    return s;
  }
};

constexpr uint32_t StateBit(v1::OperationState s) { return uint32_t{1} << static_cast<int>(s); }
constexpr OpSelector Where(v1::OperationState s) {
  OpSelector sel;
  sel.states = StateBit(s);
  return sel;
}
constexpr OpSelector WhereStates(uint32_t states) {
  OpSelector sel;
  sel.states = states;
  return sel;
}

struct OpPhaseDef {
  OpPhase phase;
  const char* name;  // as messages and logs say it
  v1::OperationState stored;
  OpSelector where;  // where.states == StateBit(stored)
};

/// The phases, in OpPhase order. For each stored state its phases'
/// selectors are disjoint and cover every combination of facts
/// (operation_machine_test).
inline constexpr OpPhaseDef kOpPhases[kOpPhaseCount] = {
    {OpPhase::kQueued, "QUEUED", v1::OPERATION_STATE_PENDING,
     Where(v1::OPERATION_STATE_PENDING).Queued(Tri::kYes)},
    {OpPhase::kAtStepBoundary, "AT_STEP_BOUNDARY", v1::OPERATION_STATE_PENDING,
     Where(v1::OPERATION_STATE_PENDING).Queued(Tri::kNo).BoundaryWaiting(Tri::kYes)},
    {OpPhase::kPending, "PENDING", v1::OPERATION_STATE_PENDING,
     Where(v1::OPERATION_STATE_PENDING).Queued(Tri::kNo).BoundaryWaiting(Tri::kNo)},
    {OpPhase::kPlanned, "PLANNED", v1::OPERATION_STATE_PLANNED,
     Where(v1::OPERATION_STATE_PLANNED).StopFree(Tri::kNo)},
    {OpPhase::kToPrepare, "TO_PREPARE", v1::OPERATION_STATE_PLANNED,
     Where(v1::OPERATION_STATE_PLANNED).StopFree(Tri::kYes).PrepareStarted(Tri::kNo)
         .AgentsPrepared(Tri::kNo).CutOver(Tri::kNo)},
    {OpPhase::kPreparing, "PREPARING", v1::OPERATION_STATE_PLANNED,
     Where(v1::OPERATION_STATE_PLANNED).StopFree(Tri::kYes).PrepareStarted(Tri::kYes)
         .AgentsPrepared(Tri::kNo).CutOver(Tri::kNo)},
    {OpPhase::kPrepared, "PREPARED", v1::OPERATION_STATE_PLANNED,
     Where(v1::OPERATION_STATE_PLANNED).StopFree(Tri::kYes).PrepareStarted(Tri::kYes)
         .AgentsPrepared(Tri::kYes).CutOver(Tri::kNo)},
    {OpPhase::kCuttingOver, "CUTTING_OVER", v1::OPERATION_STATE_PLANNED,
     Where(v1::OPERATION_STATE_PLANNED).StopFree(Tri::kYes).PrepareStarted(Tri::kYes)
         .CutOver(Tri::kYes)},
    {OpPhase::kLegacyPrepared, "LEGACY_PREPARED", v1::OPERATION_STATE_PLANNED,
     Where(v1::OPERATION_STATE_PLANNED).StopFree(Tri::kYes).PrepareStarted(Tri::kNo)
         .AgentsPrepared(Tri::kYes).CutOver(Tri::kNo)},
    {OpPhase::kLegacyCuttingOver, "LEGACY_CUTTING_OVER", v1::OPERATION_STATE_PLANNED,
     Where(v1::OPERATION_STATE_PLANNED).StopFree(Tri::kYes).PrepareStarted(Tri::kNo)
         .CutOver(Tri::kYes)},
    // prepared_from_generation is set only by a stop-free operation's
    // prepare (kToPrepare's StartPrepare), so it alone tells the transfers apart.
    {OpPhase::kTransferring, "TRANSFERRING", v1::OPERATION_STATE_TRANSFERRING,
     Where(v1::OPERATION_STATE_TRANSFERRING).PrepareStarted(Tri::kNo)},
    {OpPhase::kPreparedTransfer, "PREPARED_TRANSFER", v1::OPERATION_STATE_TRANSFERRING,
     Where(v1::OPERATION_STATE_TRANSFERRING).PrepareStarted(Tri::kYes)},
    {OpPhase::kCommitted, "COMMITTED", v1::OPERATION_STATE_COMMITTED,
     Where(v1::OPERATION_STATE_COMMITTED)},
    {OpPhase::kAborted, "ABORTED", v1::OPERATION_STATE_ABORTED,
     Where(v1::OPERATION_STATE_ABORTED)},
    {OpPhase::kFailed, "FAILED", v1::OPERATION_STATE_FAILED,
     Where(v1::OPERATION_STATE_FAILED)},
};

/// Phases CreateOperation starts an operation in.
inline constexpr OpPhase kOpInitialPhases[] = {OpPhase::kQueued, OpPhase::kAtStepBoundary,
                                               OpPhase::kPending};
/// Phases migration 0011 left rows in (stop-free ones it found PLANNED).
inline constexpr OpPhase kOpMigratedPhases[] = {OpPhase::kLegacyPrepared};

struct OpTransition {
  OpPhase from;
  OpEvent event;
  OpPhase to;
};

/// Every move (from, event) -> to. Each active phase also ends by kAborted,
/// kCancelled (-> ABORTED) and kFailed (-> FAILED): kOpEndings.
inline constexpr OpTransition kOpTransitions[] = {
    {OpPhase::kQueued, OpEvent::kReleased, OpPhase::kPending},
    {OpPhase::kQueued, OpEvent::kReleasedToBoundary, OpPhase::kAtStepBoundary},
    {OpPhase::kAtStepBoundary, OpEvent::kBoundaryNamed, OpPhase::kQueued},
    {OpPhase::kAtStepBoundary, OpEvent::kBoundaryTimedOut, OpPhase::kPending},
    {OpPhase::kPending, OpEvent::kPlanned, OpPhase::kPlanned},
    {OpPhase::kPending, OpEvent::kPlannedStopFree, OpPhase::kToPrepare},
    {OpPhase::kPending, OpEvent::kPlannedLegacy, OpPhase::kLegacyPrepared},
    {OpPhase::kToPrepare, OpEvent::kPrepareStarted, OpPhase::kPreparing},
    {OpPhase::kPreparing, OpEvent::kAgentsPrepared, OpPhase::kPrepared},
    {OpPhase::kPrepared, OpEvent::kCutOver, OpPhase::kCuttingOver},
    {OpPhase::kCuttingOver, OpEvent::kCutOverCommitted, OpPhase::kPreparedTransfer},
    {OpPhase::kLegacyPrepared, OpEvent::kCutOver, OpPhase::kLegacyCuttingOver},
    {OpPhase::kLegacyCuttingOver, OpEvent::kCutOverCommitted, OpPhase::kTransferring},
    {OpPhase::kPlanned, OpEvent::kTransferStarted, OpPhase::kTransferring},
    {OpPhase::kTransferring, OpEvent::kCommitted, OpPhase::kCommitted},
    {OpPhase::kPreparedTransfer, OpEvent::kCommitted, OpPhase::kCommitted},
};

struct OpEnding {
  OpEvent event;
  OpPhase to;
};
/// How every active (not terminal) phase can end besides its own moves.
inline constexpr OpEnding kOpEndings[] = {
    {OpEvent::kAborted, OpPhase::kAborted},
    {OpEvent::kCancelled, OpPhase::kAborted},
    {OpEvent::kFailed, OpPhase::kFailed},
};

// ---- Reading the table ------------------------------------------------------

constexpr const OpPhaseDef& PhaseDef(OpPhase p) { return kOpPhases[static_cast<int>(p)]; }
constexpr v1::OperationState StoredState(OpPhase p) { return PhaseDef(p).stored; }
const char* PhaseName(OpPhase p);
const char* EventName(OpEvent e);

/// Every transition, the endings expanded for each active phase.
std::vector<OpTransition> AllTransitions();
/// Sets `to` to the phase `from` moves to on `event`; false when the table
/// has no such move.
bool NextPhase(OpPhase from, OpEvent event, OpPhase* to);
/// `to` is `from` or follows it by some path of transitions.
bool PathExists(OpPhase from, OpPhase to);
/// No transition leaves it (COMMITTED, ABORTED, FAILED).
bool IsTerminal(OpPhase p);

constexpr bool Meets(Tri want, bool have) {
  return want == Tri::kAny || (want == Tri::kYes) == have;
}
constexpr bool Matches(const OpSelector& s, const OpFacts& f) {
  return (s.states & StateBit(f.state)) != 0 && Meets(s.stop_free, f.stop_free) &&
         Meets(s.prepare_started, f.prepare_started) &&
         Meets(s.agents_prepared, f.agents_prepared) && Meets(s.cut_over, f.cut_over) &&
         Meets(s.queued, f.queued) && Meets(s.boundary_waiting, f.boundary_waiting);
}

OpFacts FactsOf(const v1::Operation& op);
/// The phase of a row's facts: the one phase whose selector matches. A
/// state outside 1..6 reads as kFailed (it cannot be driven).
OpPhase PhaseOf(const OpFacts& facts);
OpPhase PhaseOf(const v1::Operation& op);
/// Fills the fields of `op` that are read off its stored ones rather than
/// stored: phase (PhaseName of PhaseOf), at_step_boundary, prepare_seconds
/// and pause_seconds. Every Store calls it on each operation it returns.
void SetDerivedFields(v1::Operation* op);

/// Whether the store's compare-and-set TransitionOperation may move a row
/// from stored state `from` to `to`: some transition of the table does.
bool StoredMoveAllowed(v1::OperationState from, v1::OperationState to);

// ---- State sets --------------------------------------------------------------

/// Stored states of the phases that are not terminal: PENDING, PLANNED,
/// TRANSFERRING.
uint32_t ActiveStates();
/// Stored states of the terminal phases: COMMITTED, ABORTED, FAILED.
uint32_t TerminalStates();
inline bool IsActiveState(v1::OperationState s) { return (ActiveStates() & StateBit(s)) != 0; }
inline bool IsTerminalState(v1::OperationState s) { return (TerminalStates() & StateBit(s)) != 0; }

/// Named sets the code asks about, each exactly a union of phases.
struct OpPhaseSet {
  const char* name;
  OpSelector where;
  std::vector<OpPhase> phases;  // what `where` selects
};
/// A stop-free operation's agents hold its prepare (rows PREPARED or in
/// progress): PREPARING, PREPARED, CUTTING_OVER.
bool InAgentsPrepare(OpPhase p);
/// Every named set, for the test that checks each against the phases.
std::vector<OpPhaseSet> NamedPhaseSets();

// ---- SQL ---------------------------------------------------------------------

/// The SQL condition `where` stands for, columns prefixed by `alias` ("o." or
/// ""): "state IN (1, 2, 3)", "state = 2 AND stop_free AND ...".
std::string OpSql(const OpSelector& where, std::string_view alias = "");
/// "(1, 2, 3)": a stored-state set as an SQL list.
std::string OpSqlList(uint32_t states);

}  // namespace reshard::coordinator

// The fragments statements use (string literals, so that they concatenate
// into the store's constexpr Statement text). `a` is the column prefix, a
// literal: "" or "o.". Each is checked against OpSql / OpSqlList by a
// static_assert in operation_machine.cc.
#define RESHARD_SQL_OP_PENDING "1"
#define RESHARD_SQL_OP_PLANNED "2"
#define RESHARD_SQL_OP_TRANSFERRING "3"
#define RESHARD_SQL_OP_COMMITTED "4"
#define RESHARD_SQL_OP_ACTIVE_LIST "(1, 2, 3)"
#define RESHARD_SQL_OP_TERMINAL_LIST "(4, 5, 6)"
#define RESHARD_SQL_OP_ACTIVE(a) a "state IN " RESHARD_SQL_OP_ACTIVE_LIST
#define RESHARD_SQL_OP_TERMINAL(a) a "state IN " RESHARD_SQL_OP_TERMINAL_LIST
#define RESHARD_SQL_OP_IS_PENDING(a) a "state = " RESHARD_SQL_OP_PENDING
#define RESHARD_SQL_OP_IS_PLANNED(a) a "state = " RESHARD_SQL_OP_PLANNED
#define RESHARD_SQL_OP_IS_TRANSFERRING(a) a "state = " RESHARD_SQL_OP_TRANSFERRING
// Phases and named sets.
#define RESHARD_SQL_OP_QUEUED(a) \
  a "state = " RESHARD_SQL_OP_PENDING " AND " a "queued_behind_operation_id IS NOT NULL"
#define RESHARD_SQL_OP_AT_STEP_BOUNDARY(a)                                                    \
  a "state = " RESHARD_SQL_OP_PENDING " AND " a "queued_behind_operation_id IS NULL AND " a \
    "step_boundary = 1"
#define RESHARD_SQL_OP_TO_PREPARE(a)                                                    \
  a "state = " RESHARD_SQL_OP_PLANNED " AND " a "stop_free AND " a                    \
    "prepared_from_generation = 0 AND " a "agents_prepared_at IS NULL AND " a        \
    "cutover_operation_id IS NULL"
// PREPARING, PREPARED, CUTTING_OVER: the agents hold the prepare (InAgentsPrepare).
#define RESHARD_SQL_OP_AGENTS_PREPARE(a)                            \
  a "state = " RESHARD_SQL_OP_PLANNED " AND " a "stop_free AND " a \
    "prepared_from_generation > 0"
#define RESHARD_SQL_OP_STOP_FREE_PLANNED(a) \
  a "state = " RESHARD_SQL_OP_PLANNED " AND " a "stop_free"
